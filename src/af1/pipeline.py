"""Experiments written to a results directory, and the demo that runs them all and reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from af1 import experiments
from af1.allforone import AF1Config
from af1.api import as_loaded, base_accuracy
from af1.errors import Af1Error
from af1.models import LoadedModel
from af1.report import figures
from af1.report.html import build_report
from af1.results import provenance, write_json
from af1.tasks import STYLES, TaskSpec


def ci(value: float, interval: list[float]) -> str:
    """0.816 [0.69, 0.90]"""
    return f"{value:.3f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _with_provenance(setup: experiments.Setup, data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "provenance": provenance(setup.lm.info, task=setup.spec.model_dump())}


def sweep_to(
    setup: experiments.Setup,
    config: AF1Config,
    out_dir: Path,
    max_transfer: int | None = None,
    reference: bool = False,
) -> dict[str, Any]:
    """Run (or resume) the grid into out_dir/sweep.json and draw out_dir/sweep.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = experiments.sweep(setup, config, max_transfer, reference, state_path=out_dir / "sweep.state.json")
    write_json(out_dir / "sweep.json", _with_provenance(setup, result))
    sweep_figure(result, None, out_dir)
    return result


def sweep_figure(sweep: dict[str, Any], found: dict[str, Any] | None, out_dir: Path) -> Path:
    return figures.sweep_heatmap(sweep, out_dir / "sweep.png", found)


def necessity_figure(result: dict[str, Any], out_dir: Path) -> Path:
    return figures.necessity_plot(result, out_dir / "necessity.png")


def pruning_figure(result: dict[str, Any], out_dir: Path) -> Path:
    return figures.pruning_plot(result, out_dir / "pruning.png")


def positional_to(result: dict[str, Any], lm: Any, out_dir: Path) -> None:
    """The positional study's JSON and figures in out_dir."""
    write_json(out_dir / "positional.json", {**result, "provenance": provenance(lm.info)})
    figures.positional_figures(result, out_dir / "positional.png")


def heads_to(result: dict[str, Any], lm: Any, out_dir: Path) -> None:
    write_json(out_dir / "heads.json", {**result, "provenance": provenance(lm.info)})
    figures.heads_figures(result, out_dir / "heads.png")


def parse_heads(text: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """'3.1,10.4' -> [(3, 1), (10, 4)], checked against the model."""
    out = []
    for item in text.split(","):
        layer, _, head = item.strip().partition(".")
        if not (layer.isdigit() and head.isdigit()):
            raise Af1Error(f"--heads takes LAYER.HEAD,... or auto, got {item!r}")
        if not (int(layer) < n_layers and int(head) < n_heads):
            raise Af1Error(f"head {item} is out of range: {n_layers} layers x {n_heads} heads")
        out.append((int(layer), int(head)))
    return out


def finetune_study(
    model: str | LoadedModel,
    spec: TaskSpec,
    heads_arg: str,
    k: int,
    n_train: int,
    n_eval: int,
    steps: int,
    lr: float,
    seed: int,
    out_dir: Path | None,
) -> dict[str, Any]:
    """Disjoint train/eval problems, heads from path patching or the user, and the three fine-tunings."""
    from af1 import finetune, heads, positional
    from af1.tasks import build_task

    lm = as_loaded(model)
    everything = build_task(spec.model_copy(update={"n": None, "answer_digits": "any"}), lm.tokenizer)
    if n_train + n_eval > len(everything):
        raise Af1Error(f"{n_train} + {n_eval} problems asked, the task has {len(everything)}: use more --digits")
    eval_task = everything.subset(list(range(n_eval)))
    train_task = everything.subset(list(range(n_eval, n_eval + n_train)))
    if heads_arg == "auto":
        result = heads.study(lm, spec.model_copy(update={"n": min(100, len(everything))}), k=k, draws=1)
        chosen = [tuple(h) for h in result["top_heads"]]
    else:
        chosen = parse_heads(heads_arg, lm.adapter.n_layers, lm.adapter.n_heads)
    text = positional.corpus_windows(lm.adapter, lm.tokenizer, positional.load_corpus(), 128, 8)
    config = finetune.FinetuneConfig(steps=steps, lr=lr, seed=seed)
    result = finetune.compare(lm.adapter, train_task, eval_task, text, chosen, config, out_dir)
    result["text_corpus"] = positional.CORPUS_SOURCE
    if out_dir:
        write_json(out_dir / "finetune.json", {**result, "provenance": provenance(lm.info, task=spec.model_dump())})
    return result


def demo(model: str, out_dir: Path, spec: TaskSpec, threshold: float = 0.9, say: Callable[[str], None] = print) -> Path:
    """The whole AF1 study on one model and task, written to out_dir with an HTML report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lm = as_loaded(model)
    notes: list[str] = []

    rows = []
    for op in ("a+b", "a-b", "a+b+c", "a*b"):
        result = base_accuracy(lm, spec.model_copy(update={"operation": op, "n_max": 200}))
        keys = ("task", "style", "shots", "scoring", "n", "n_solved", "base_accuracy", "base_accuracy_ci")
        rows.append({k: result[k] for k in (*keys, "base_accuracy_baseline")})
    write_json(out_dir / "base_accuracy.json", {"rows": rows, "provenance": provenance(lm.info)})
    say("base accuracy: " + ", ".join(f"{r['task']} {ci(r['base_accuracy'], r['base_accuracy_ci'])}" for r in rows))

    setup = experiments.prepare(lm, spec)
    sweep = sweep_to(setup, AF1Config(), out_dir)
    found = experiments.search(sweep, threshold)
    write_json(out_dir / "search.json", _with_provenance(setup, found))
    sweep_figure(sweep, found, out_dir)
    L = setup.adapter.n_layers
    parts = experiments.components(setup, sorted({0, L // 3, L // 2, 2 * L // 3, L - 5, L - 3}))
    write_json(out_dir / "components.json", _with_provenance(setup, parts))
    described = setup.describe()
    notes.append(
        f"{setup.spec.operation} ({setup.spec.style}, {setup.spec.shots} shots, {setup.spec.scoring} answer scored): "
        f"base accuracy {ci(described['base_accuracy'], described['base_accuracy_ci'])} on {described['n']} problems "
        f"(constant guess {described['base_accuracy_baseline']:.3f}), {len(setup.kept)} solved; "
        f"{sweep['n_cells']} cells swept; on the solved problems a constant guess scores "
        f"{sweep['faithfulness_baseline']:.3f}."
    )
    notes.extend(setup.warnings)
    notes.append(
        "CAMA alone: "
        + ", ".join(f"L_wait {w}: {ci(v, parts['cama_only_ci'][w])}" for w, v in parts["cama_only"].items())
    )
    notes.append(
        "ABP alone (2 peek layers): "
        + ", ".join(f"from {w + 1}: {ci(v, parts['abp_only_ci'][w])}" for w, v in parts["abp_only"].items())
    )
    split = f"chosen on {found['n_selection']} solved problems, confirmed on the other {found['n_confirmation']}"
    if found["found"]:
        config = AF1Config(wait=found["wait"], transfer=found["transfer"])
        notes.append(
            f"AF1 subgraph at threshold {threshold} ({split}): L_wait {found['wait']}, L_transfer "
            f"{found['transfer']}, faithfulness {ci(found['faithfulness'], found['faithfulness_ci'])} "
            f"(selection {found['faithfulness_selection']:.3f}; constant guess {found['faithfulness_baseline']:.3f})."
        )
        say(notes[-1])
    elif found.get("best"):
        best = found["best"]
        config = AF1Config(wait=best["wait"], transfer=best["transfer"])
        notes.append(
            f"No (L_wait, L_transfer) keeps faithfulness >= {threshold} on the selection split: this model has no "
            f"AF1 subgraph at that threshold on this task. The best eligible cell ({split}), used below, is "
            f"L_wait {best['wait']}, L_transfer {best['transfer']} with faithfulness "
            f"{ci(best['faithfulness'], best['faithfulness_ci'])} (selection {best['faithfulness_selection']:.3f})."
        )
        say(notes[-1])
    else:
        raise Af1Error("no cell of the grid clears the constant-guess baseline: nothing to analyse further")

    nec = experiments.necessity(setup, found=config)
    write_json(out_dir / "necessity.json", _with_provenance(setup, nec))
    necessity_figure(nec, out_dir)
    one, one_ci = nec["windows"]["1"], nec["windows_ci"]["1"]
    notes.append(
        f"Necessity: blocking the last token's reads in a single layer lowers faithfulness to "
        f"{ci(min(one), one_ci[one.index(min(one))])} at worst (layer {one.index(min(one))})."
    )

    alt = experiments.alternatives(setup, config)
    write_json(out_dir / "alternatives.json", _with_provenance(setup, alt))
    notes.append(
        "Alternatives (ablation + ABP af1): "
        + ", ".join(
            f"{k} {v['faithfulness']:.3f}"
            + (
                f" ± {v['faithfulness_std']:.3f}"
                if "per_seed" in v
                else f" (McNemar p {v['mcnemar_vs_configured']['p_value']:.2g})"
            )
            for k, v in alt["ablations_detail"].items()
        )
    )
    styles = experiments.styles_table(lm, config, spec, list(STYLES))
    write_json(out_dir / "styles.json", {**styles, "provenance": provenance(lm.info)})
    rows = []
    for op in ("a-b", "a+b+c", "a*b"):
        try:
            other = experiments.prepare(lm, spec.model_copy(update={"operation": op, "n_max": 200}))
        except Af1Error as exc:  # a task the model solves nothing of is reported, not fatal
            notes.append(f"transfer to {op} skipped: {exc}")
            continue
        rows.append(experiments.transfer_config(other, config, L))
    write_json(out_dir / "transfer.json", {"source": found, "rows": rows, "provenance": provenance(lm.info)})
    if config.transfer > 0:
        pruning = experiments.prune_heads(setup, config)
        write_json(out_dir / "pruning.json", _with_provenance(setup, pruning))
        pruning_figure(pruning, out_dir)
        conf = pruning["confirmation"]
        notes.append(
            f"Head pruning: {pruning['max_pruned_at_95pct']} of {pruning['n_transfer_heads']} transfer "
            f"heads stop peeking with faithfulness >= 95 % of the unpruned on {pruning['n_selection']} problems; "
            f"on the other {pruning['n_confirmation']}: pruned "
            f"{ci(conf['pruned']['faithfulness'], conf['pruned']['faithfulness_ci'])} vs unpruned "
            f"{ci(conf['unpruned']['faithfulness'], conf['unpruned']['faithfulness_ci'])} "
            f"(McNemar p {conf['mcnemar']['p_value']:.2g})."
        )
    from af1 import heads, positional

    head_result = heads.study(
        lm, spec, compare_specs=[spec.model_copy(update={"operation": op}) for op in ("a-b", "a+b+c")]
    )
    heads_to(head_result, lm, out_dir)
    ko = head_result["knockout"]
    notes.append(
        f"Arithmetic heads: {len(head_result['key_heads'])} of {head_result['n_heads']} heads pass "
        f"{head_result['threshold']:.0%}; top {ko['k']} mean-ablated: accuracy {ko['accuracy_top_k']:.3f}, "
        f"{ko['k']} random: {ko['accuracy_random_k_mean']:.3f} ± {ko['accuracy_random_k_std']:.3f}."
    )
    pos = positional.study(lm.adapter, lm.tokenizer, positional.PositionalConfig())
    positional_to(pos, lm, out_dir)
    notes.append(
        f"Position + meaning: median r {pos['r_median']:.3f} (row-centred {pos['r_median_row_centred']:.3f}, "
        f"random init {pos['r_median_random_init']:.3f}); the paper reports 0.959."
    )
    notes.append(f"Demo time: {time.perf_counter() - t0:.0f} s.")
    write_json(out_dir / "notes.json", {"notes": notes})
    return build_report(out_dir)
