"""One self-contained HTML report of whatever results a directory holds (figures embedded)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from af1.errors import Af1Error
from af1.results import write_atomic

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
img{max-width:100%} .note{color:#555;font-size:.92em} code{background:#f5f5f5;padding:0 3px}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}
"""


def _load(d: Path, name: str) -> dict[str, Any] | None:
    path = d / name
    return json.loads(path.read_text()) if path.is_file() else None


def image_html(d: Path, name: str) -> str:
    path = d / name
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'


def fmt_cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return html.escape(str(v))


def table_html(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{fmt_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _stages(stages: dict[str, list[int]]) -> str:
    def span(layers: list[int]) -> str:
        return f"{layers[0]}..{layers[-1]}" if layers else "none"

    return table_html(["stage", "layers"], [[k, span(v)] for k, v in stages.items()])


def with_ci(value: Any, ci: Any = None) -> str:
    """A rate and its 95 % interval as one cell: 0.816 [0.69, 0.90]."""
    if value is None or value == "":
        return ""
    if not ci or ci[0] is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def build_report(d: str | Path) -> Path:
    """Write DIR/report.html from the result files found in DIR."""
    d = Path(d)
    if not d.is_dir():
        raise Af1Error(f"no such results directory: {d}")
    parts: list[str] = []
    provenance = None

    base = _load(d, "base_accuracy.json")
    if base:
        provenance = base.get("provenance")
        parts.append("<h2>Base accuracy</h2>")
        parts.append(
            table_html(
                ["task", "style", "shots", "scoring", "n", "solved", "base accuracy [95 % CI]", "constant guess"],
                [
                    [
                        r["task"],
                        r["style"],
                        r["shots"],
                        r.get("scoring", "first"),
                        r["n"],
                        r["n_solved"],
                        with_ci(r["base_accuracy"], r.get("base_accuracy_ci")),
                        r.get("base_accuracy_baseline", ""),
                    ]
                    for r in base["rows"]
                ],
            )
        )

    sweep = _load(d, "sweep.json")
    found = _load(d, "search.json")
    if sweep:
        provenance = provenance or sweep.get("provenance")
        parts.append("<h2>The (L_wait, L_transfer) grid</h2>")
        parts.append(
            f"<p>{sweep['model']} on <code>{html.escape(sweep['task'])}</code> ({sweep['style']}): "
            f"{sweep['n_solved']} solved problems of {sweep['n']} (base accuracy "
            f"{with_ci(sweep['base_accuracy'], sweep.get('base_accuracy_ci'))}, {sweep.get('scoring', 'first')} "
            f"answer scored); {sweep['n_cells']} cells, executor {sweep.get('executor', sweep.get('path'))}. "
            "Faithfulness = accuracy under AF1 on the solved problems; a constant guess scores "
            f"{sweep.get('faithfulness_baseline', float('nan')):.3f} on them. Red triangles: cells whose whole "
            "95 % interval lies above the threshold; orange: the frontier.</p>"
        )
        parts.append(image_html(d, "sweep.png"))
    if found:
        parts.append("<h2>The AF1 subgraph</h2>")
        if found["found"]:
            parts.append(
                f"<p>Chosen on {found.get('n_selection')} solved problems (the largest L_wait, then the smallest "
                f"L_transfer, with faithfulness &ge; {found['threshold']}, a compute stage, and an interval above "
                f"the constant guess): <b>L_wait = {found['wait']}, L_transfer = {found['transfer']}</b>. "
                f"Confirmed on the other {found.get('n_confirmation')}: faithfulness "
                f"<b>{with_ci(found['faithfulness'], found.get('faithfulness_ci'))}</b> (constant guess "
                f"{found.get('faithfulness_baseline', float('nan')):.3f}; selection "
                f"{found.get('faithfulness_selection', float('nan')):.3f}).</p>"
            )
            parts.append(_stages(found["stages"]))
        else:
            best = found.get("best") or {}
            parts.append(
                f"<p><b>No cell reaches faithfulness {found['threshold']}</b> on the selection split: this model "
                "has no AF1 subgraph at that threshold on this task."
                + (
                    f" The best eligible cell is L_wait {best['wait']}, L_transfer {best['transfer']}: "
                    f"{with_ci(best['faithfulness'], best.get('faithfulness_ci'))} on the confirmation split."
                    if best
                    else ""
                )
                + "</p>"
            )

    comp = _load(d, "components.json")
    if comp:
        parts.append(
            "<h2>CAMA alone and ABP alone</h2><p>CAMA alone: the ablation at L_wait with no attention "
            f"mask. ABP alone: no ablation, the mask from L_wait+1 with {comp['transfer']} peek layers.</p>"
        )
        parts.append(
            table_html(
                ["L_wait", "CAMA alone [95 % CI]", "ABP alone [95 % CI]"],
                [
                    [
                        w,
                        with_ci(comp["cama_only"][w], comp.get("cama_only_ci", {}).get(w)),
                        with_ci(comp["abp_only"][w], comp.get("abp_only_ci", {}).get(w)),
                    ]
                    for w in comp["cama_only"]
                ],
            )
        )

    nec = _load(d, "necessity.json")
    if nec:
        parts.append(
            "<h2>Necessity</h2><p>In the unmodified model the last token is kept from reading every "
            "non-context position in one layer or a window of layers; right: inside the found AF1 the "
            "transfer window is moved later.</p>"
        )
        parts.append(image_html(d, "necessity.png"))
        worst = {w: min(v) for w, v in nec["windows"].items()}
        parts.append(
            table_html(
                ["window", "lowest faithfulness [95 % CI]", "at first layer"],
                [
                    [
                        w,
                        with_ci(
                            worst[w], nec.get("windows_ci", {}).get(w, [None] * 99)[nec["windows"][w].index(worst[w])]
                        ),
                        nec["windows"][w].index(worst[w]),
                    ]
                    for w in nec["windows"]
                ],
            )
        )

    alt = _load(d, "alternatives.json")
    if alt:
        parts.append(f"<h2>Alternatives at L_wait = {alt['wait']}, L_transfer = {alt['transfer']}</h2>")

        def alt_rows(detail: dict[str, Any]) -> list[list[Any]]:
            rows = []
            for k, v in detail.items():
                if "per_seed" in v:  # resample: mean and spread over seeds
                    cell = f"{v['faithfulness']:.3f} ± {v['faithfulness_std']:.3f} ({v['seeds']} seeds)"
                    ps = sorted(s["mcnemar_vs_configured"]["p_value"] for s in v["per_seed"])  # also older results
                    rows.append([k, cell, f"median over seeds {ps[len(ps) // 2]:.2g} (largest {ps[-1]:.2g})"])
                else:
                    cell = with_ci(v["faithfulness"], v["faithfulness_ci"])
                    rows.append([k, cell, f"{v['mcnemar_vs_configured']['p_value']:.2g}"])
            return rows

        header = ["faithfulness [95 % CI]", "McNemar p vs CAMA + ABP"]
        parts.append(table_html(["ablation at L_wait (ABP af1)", *header], alt_rows(alt["ablations_detail"])))
        parts.append(table_html(["ABP variant (CAMA)", *header], alt_rows(alt["abp_variants_detail"])))

    styles = _load(d, "styles.json")
    if styles:
        parts.append(f"<h2>Input styles (Table 4) at L_wait = {styles['wait']}, L_transfer = {styles['transfer']}</h2>")
        rows = [
            [
                r["style"],
                r["operation"],
                r.get("n", ""),
                with_ci(r["base_accuracy"], r.get("base_accuracy_ci")) if "base_accuracy" in r else r.get("error", ""),
                r.get("n_solved", ""),
                with_ci(r.get("faithfulness"), r.get("faithfulness_ci")),
                r.get("faithfulness_baseline", ""),
            ]
            for r in styles["rows"]
        ]
        parts.append(
            table_html(
                ["style", "operation", "n", "base accuracy", "solved", "AF1 faithfulness", "constant guess"], rows
            )
        )

    transfer = _load(d, "transfer.json")
    if transfer:
        parts.append("<h2>Transfer of the found config</h2>")
        rows = [
            [
                r["task"],
                r["style"],
                r["n_solved"],
                r["absolute"]["wait"],
                r["absolute"]["transfer"],
                with_ci(r["absolute"]["faithfulness"], r["absolute"].get("faithfulness_ci")),
                with_ci(r["relative"]["faithfulness"], r["relative"].get("faithfulness_ci")),
                r["absolute"].get("faithfulness_baseline", ""),
            ]
            for r in transfer["rows"]
        ]
        parts.append(
            table_html(
                [
                    "task",
                    "style",
                    "solved",
                    "wait",
                    "transfer",
                    "faithfulness (absolute)",
                    "faithfulness (relative)",
                    "constant guess",
                ],
                rows,
            )
        )

    pruning = _load(d, "pruning.json")
    if pruning:
        confirmed = ""
        if "confirmation" in pruning:
            c = pruning["confirmation"]
            confirmed = (
                f" On the other {pruning['n_confirmation']}: pruned "
                f"{with_ci(c['pruned']['faithfulness'], c['pruned']['faithfulness_ci'])} vs unpruned "
                f"{with_ci(c['unpruned']['faithfulness'], c['unpruned']['faithfulness_ci'])} "
                f"(McNemar p {c['mcnemar']['p_value']:.2g})."
            )
        parts.append(
            f"<h2>Head pruning in the transfer layers</h2><p>{pruning['n_transfer_heads']} heads; "
            f"ranked greedily by {html.escape(pruning.get('measure', 'single-head accuracy'))}: "
            f"up to {pruning['max_pruned_at_95pct']} of them stop peeking with faithfulness &ge; 95 % of "
            f"the unpruned {pruning['faithfulness_full']:.3f} on {pruning.get('n_selection', '')} selection problems."
            f"{confirmed}</p>"
        )
        parts.append(image_html(d, "pruning.png"))

    hd = _load(d, "heads.json")
    if hd:
        provenance = provenance or hd.get("provenance")
        ko = hd["knockout"]
        parts.append("<h2>Arithmetic heads</h2>")
        parts.append(
            f"<p>{hd['model']} on <code>{html.escape(hd['task'])}</code> ({hd['style']}), counterfactual "
            f"operator <code>{html.escape(hd['counterfactual'])}</code>, {hd['n_solved']} solved problems. "
            f"{len(hd['key_heads'])} of {hd['n_heads']} heads ({hd['key_head_share']:.1%}) change the "
            f"correct logit by less than {hd['threshold']:.0%} through their direct path.</p>"
        )
        parts.append(
            table_html(
                [
                    "knockout (mean ablation)",
                    f"first-token accuracy on {ko['n']} solved problems (constant guess {ko['accuracy_baseline']:.2f})",
                ],
                [
                    [f"top {ko['k']} heads", with_ci(ko["accuracy_top_k"], ko["accuracy_top_k_ci"])],
                    [f"{ko['k']} random heads (mean of {len(ko['accuracy_random_k'])})", ko["accuracy_random_k_mean"]],
                    ["none", ko["base_accuracy"]],
                ],
            )
        )
        rows = [[h, *v.values()] for h, v in hd["attention_of_top_heads"].items()]
        if rows:
            parts.append(
                table_html(["head (layer.head)", *next(iter(hd["attention_of_top_heads"].values())).keys()], rows)
            )
        if hd.get("overlap"):
            parts.append(
                table_html(
                    ["other task", "style", "key-head Jaccard", f"top-{ko['k']} overlap"],
                    [
                        [
                            o["task"],
                            o["style"],
                            o.get("key_heads_jaccard", o.get("error", "")),
                            o.get(f"top_{ko['k']}_overlap", ""),
                        ]
                        for o in hd["overlap"]
                    ],
                )
            )
        parts.append(image_html(d, "heads.png"))

    ft = _load(d, "finetune.json")
    if ft:
        parts.append("<h2>Precise fine-tuning</h2>")
        parts.append(
            f"<p>{len(ft['heads'])} heads; {html.escape(ft['gqa'])}. {ft['n_train']} training problems, "
            f"{ft['n_eval']} held-out; text measure on {html.escape(ft.get('text_corpus', ''))}.</p>"
        )
        parts.append(
            table_html(
                ["variant", "arithmetic accuracy", "perplexity", "next-token accuracy", "trained parameters"],
                [
                    [
                        v,
                        ft[v]["arithmetic_accuracy"],
                        ft[v]["perplexity"],
                        ft[v]["next_token_accuracy"],
                        ft[v].get("trained_parameters", 0),
                    ]
                    for v in ("base", "precise", "random_heads", "full")
                ],
            )
        )

    pos = _load(d, "positional.json")
    if pos:
        provenance = provenance or pos.get("provenance")
        parts.append("<h2>Attention logits: position + meaning</h2>")
        parts.append(
            f"<p>Corpus: {html.escape(pos['corpus'])}; {pos['n_windows']} windows of {pos['window']} "
            "tokens. Per head, W[i,j] ~ a[i-j] + b[i] + c[j] over the causal triangle (backfitting); "
            "the paper reports r = 0.959 on its own (unpublished) corpus and averaging.</p>"
        )
        rows = [[k.replace("_", " "), v["mean"], v["median"], v["q1"], v["q3"]] for k, v in pos["distribution"].items()]
        parts.append(table_html(["r per head", "mean", "median", "q1", "q3"], rows))
        if pos.get("dummy_distance_r2_median") is not None:
            parts.append(
                f"<p>Dummy-distance test: median R&sup2; of the (distance, key) additive fit "
                f"{pos['dummy_distance_r2_median']:.3f}.</p>"
            )
            parts.append(
                table_html(
                    [
                        "RoPE band (0 = highest frequency)",
                        "share of logit variance",
                        "key energy: token-independent mean",
                        "key energy: token-dependent",
                    ],
                    [
                        [b, s, m, t]
                        for b, (s, m, t) in enumerate(
                            zip(
                                pos["band_logit_variance_share"],
                                pos["band_key_energy_mean"],
                                pos["band_key_energy_token"],
                                strict=True,
                            )
                        )
                    ],
                )
            )
        parts.append(image_html(d, "positional.png"))

    if not parts:
        raise Af1Error(f"{d} holds no af1 results")
    notes = _load(d, "notes.json")
    if notes:
        parts.insert(
            0,
            "<h2>Summary</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes["notes"]) + "</ul>",
        )
    if provenance:
        parts.append("<h2>Provenance</h2><pre>" + html.escape(json.dumps(provenance, indent=2)) + "</pre>")
    return write_atomic(d / "report.html", page("af1 report", parts))


def build_contrast_report(d: str | Path) -> Path:
    """Write DIR/report.html that sets the demo's models side by side (DIR/contrast.json, each model's folder)."""
    d = Path(d)
    data = _load(d, "contrast.json")
    if data is None:
        raise Af1Error(f"{d} holds no contrast.json")
    models = data["models"]
    parts = ["<h2>Where each model waits, transfers and computes</h2><ul>"]
    parts += [f"<li>{html.escape(line)}</li>" for line in data["verdicts"]]
    parts.append(
        "</ul><p class='note'>Faithfulness is the share of the solved problems the model still answers (every "
        "answer token) under AF1; the configuration is chosen on half of them and reported on the other half, "
        "with its 95 % Wilson interval and what a constant guess scores there. Each model's full report: "
        + ", ".join(f"<a href='{html.escape(m)}/report.html'>{html.escape(m)}</a>" for m in models)
        + ".</p>"
    )
    parts.append("<h2>The (L_wait, L_transfer) grids</h2>")
    for m in models:
        parts.append(f"<h3>{html.escape(m)}</h3>" + image_html(d / m, "sweep.png"))
    rows = []
    for r in data["cross"]:
        rows.append(
            [
                r["source"]["model"],
                f"{r['source']['wait']} / {r['source']['transfer']}" + ("" if r["source"]["found"] else " (best)"),
                r["target"],
                f"{r['absolute']['wait']} / {r['absolute']['transfer']}",
                with_ci(r["absolute"]["faithfulness"], r["absolute"]["faithfulness_ci"]),
                f"{r['relative']['wait']} / {r['relative']['transfer']}",
                with_ci(r["relative"]["faithfulness"], r["relative"]["faithfulness_ci"]),
                r["absolute"]["faithfulness_baseline"],
                _own_text(r),
            ]
        )
    if rows:
        parts.append("<h2>Each model's configuration on the other</h2>")
        parts.append(
            table_html(
                [
                    "config of",
                    "L_wait / L_transfer",
                    "applied to",
                    "same layers",
                    "faithfulness",
                    "same relative depth",
                    "faithfulness",
                    "constant guess",
                    "its own config (McNemar p: same layers, same depth)",
                ],
                rows,
            )
        )
    for pair, test in (data.get("base_accuracy_paired") or {}).items():
        if test is not None:
            parts.append(
                f"<p>Base accuracy, {html.escape(pair)} on the same {test['n']} problems: solved by the first only "
                f"{test['only_first']}, by the second only {test['only_second']}, McNemar p {test['p_value']:.2g}.</p>"
            )
    if data.get("heads_placement"):
        parts.append(
            f"<h2>Arithmetic heads of {html.escape(data['analysed'])} against its stages</h2>"
            "<p>The top heads of path patching (direct path), and the stage of the AF1 configuration their layer "
            "belongs to.</p>"
        )
        parts.append(
            table_html(
                ["head (layer.head)", "stage"],
                [[f"{p['layer']}.{p['head']}", p["stage"]] for p in data["heads_placement"]],
            )
        )
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in data["notes"]) + "</ul>")
    parts.append(
        "<h2>Wall time</h2>"
        + table_html(["stage", "seconds"], [[k, round(v, 1)] for k, v in data["timings_seconds"].items()])
    )
    parts.append("<h2>Provenance</h2><pre>" + html.escape(json.dumps(data["provenance"], indent=2)) + "</pre>")
    return write_atomic(d / "report.html", page("af1: where models do mental arithmetic", parts))


def _own_text(row: dict[str, Any]) -> str:
    """The target model's own config on the same problems, and how each mapped config differs from it."""
    own = row.get("own")
    if not own:
        return "-"
    p = [row[by]["mcnemar_vs_own"]["p_value"] for by in ("absolute", "relative")]
    return (
        f"{own['wait']} / {own['transfer']}: {with_ci(own['faithfulness'], own['faithfulness_ci'])} "
        f"(p {p[0]:.2g}, {p[1]:.2g})"
    )


def page(title: str, parts: list[str]) -> str:
    """A self-contained HTML page of the given sections."""
    title = html.escape(title)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
        f"</head><body><h1>{title}</h1>{''.join(parts)}</body></html>"
    )
