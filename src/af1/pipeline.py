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
from af1.evaluation import evaluated
from af1.models import LoadedModel
from af1.progress import stage
from af1.report import figures
from af1.report.html import build_contrast_report, build_report
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
    everything = build_task(
        spec.model_copy(update={"n": None, "n_max": n_train + n_eval, "answer_digits": "any"}), lm.tokenizer
    )
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


DEMO_MODELS = ("smollm2", "qwen0.5b")


def model_labels(models: list[str]) -> list[str]:
    """Folder names for models given as short names or paths: the last path part, made unique."""
    labels: list[str] = []
    for m in models:
        label = Path(m).name.removesuffix(".gguf") or m
        labels.append(label if label not in labels else f"{label}-{len(labels)}")
    return labels


def stages_text(stages: dict[str, list[int]]) -> str:
    def span(layers: list[int]) -> str:
        return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0]) if layers else "none"

    wait, transfer, compute = (span(stages[k]) for k in ("wait", "transfer", "compute"))
    return f"waits in blocks {wait}, transfers in {transfer}, computes in {compute}"


def search_to(setup: experiments.Setup, out_dir: Path, threshold: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The grid and the search with its confirmation split, written to out_dir (sweep.json, search.json, sweep.png)."""
    sweep = sweep_to(setup, AF1Config(), out_dir)
    found = experiments.search(sweep, threshold)
    write_json(out_dir / "search.json", _with_provenance(setup, found))
    sweep_figure(sweep, found, out_dir)
    return sweep, found


def verdict(name: str, setup: experiments.Setup, found: dict[str, Any]) -> str:
    """One line per model: where it waits, transfers and computes, or that it has no AF1 subgraph, with numbers."""
    d = setup.describe()
    what = setup.lm.info.get("description")  # a bundled model: which weights exactly (quantisation included)
    name = f"{name} [{', '.join(what.split(', ')[:2])}]" if what else name
    base = (
        f"base accuracy {ci(d['base_accuracy'], d['base_accuracy_ci'])} on {d['n']} problems ({d['n_solved']} solved)"
    )
    split = f"chosen on {found['n_selection']} solved problems, confirmed on {found['n_confirmation']} others"
    if found["found"]:
        return (
            f"{name} ({d['n_layers']} layers): AF1 subgraph at faithfulness >= {found['threshold']}: L_wait "
            f"{found['wait']}, L_transfer {found['transfer']}, i.e. it {stages_text(found['stages'])}; faithfulness "
            f"{ci(found['faithfulness'], found['faithfulness_ci'])} ({split}; constant guess "
            f"{found['faithfulness_baseline']:.3f}); {base}."
        )
    best = found.get("best")
    tail = (
        f" Its best eligible cell is L_wait {best['wait']}, L_transfer {best['transfer']}: "
        f"{ci(best['faithfulness'], best['faithfulness_ci'])} ({split})."
        if best
        else " No cell clears the constant-guess baseline."
    )
    return f"{name} ({d['n_layers']} layers): no AF1 subgraph at faithfulness >= {found['threshold']}.{tail} {base}."


def searched(found: dict[str, Any]) -> AF1Config | None:
    cell = found if found["found"] else found.get("best")
    return None if cell is None else AF1Config(wait=cell["wait"], transfer=cell["transfer"])


def analyse(
    setup: experiments.Setup,
    found: dict[str, Any],
    out_dir: Path,
    notes: list[str],
    full: bool,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The analyses of a searched AF1 configuration on one model: CAMA and ABP alone, necessity, alternatives,
    head pruning, the arithmetic heads placed against the stages; with `full` also the input styles, the config
    on other tasks, base accuracy of four tasks and the position+meaning study. What depends on the chosen
    config (alternatives, moved transfer windows) is measured on the search's confirmation split only."""
    from af1 import heads, positional

    lm, spec, L = setup.lm, setup.spec, setup.adapter.n_layers
    config = searched(found)
    assert config is not None
    confirm = experiments.confirmation(setup, found)

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        with stage(name, timings):
            return fn()

    parts = timed(
        "CAMA / ABP alone", lambda: experiments.components(setup, sorted({0, L // 3, L // 2, 2 * L // 3, L - 5, L - 3}))
    )
    write_json(out_dir / "components.json", _with_provenance(setup, parts))
    notes.append(
        "CAMA alone: "
        + ", ".join(f"L_wait {w}: {ci(v, parts['cama_only_ci'][w])}" for w, v in parts["cama_only"].items())
    )
    notes.append(
        "ABP alone (no ablation; the last token reads freely up to L_wait, peeks in 2 layers, then self peek): "
        + ", ".join(f"peek from {w + 1}: {ci(v, parts['abp_only_ci'][w])}" for w, v in parts["abp_only"].items())
    )
    nec = timed("necessity", lambda: experiments.necessity(setup, found=config, found_on=confirm))
    write_json(out_dir / "necessity.json", _with_provenance(setup, nec))
    necessity_figure(nec, out_dir)
    one, one_ci = nec["windows"]["1"], nec["windows_ci"]["1"]
    notes.append(
        f"Necessity: blocking the last token's reads in a single layer lowers faithfulness to "
        f"{ci(min(one), one_ci[one.index(min(one))])} at worst (layer {one.index(min(one))})."
    )
    alt = timed("alternatives", lambda: experiments.alternatives(confirm, config))
    write_json(out_dir / "alternatives.json", _with_provenance(setup, alt))
    notes.append(
        f"Alternatives on the {len(confirm.kept)} confirmation problems (ablation + ABP af1): "
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
    if config.transfer > 0:
        pruning = timed(
            "head pruning",
            lambda: experiments.prune_heads(
                setup, config, selection=found.get("selection_fraction", 0.5), seed=found.get("split_seed", 0)
            ),
        )
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
    compare = [spec.model_copy(update={"operation": op}) for op in ("a-b", "a+b+c")] if full else []
    k = min(10, L * setup.adapter.n_heads // 4)  # random draws need other heads to draw from
    head_result = timed(
        "arithmetic heads", lambda: heads.study(lm, spec, k=k, compare_specs=compare, done=setup.evaluated)
    )
    stages = config.stages(L)
    head_result["placement"] = [
        {"layer": h[0], "head": h[1], "stage": next(s for s, layers in stages.items() if h[0] in layers)}
        for h in head_result["top_heads"]
    ]
    heads_to(head_result, lm, out_dir)
    ko = head_result["knockout"]
    in_transfer = sum(p["stage"] == "transfer" for p in head_result["placement"])
    notes.append(
        f"Arithmetic heads: {len(head_result['key_heads'])} of {head_result['n_heads']} heads pass "
        f"{head_result['threshold']:.0%} (direct path); {in_transfer} of the top {len(head_result['top_heads'])} "
        f"lie in the transfer layers {stages['transfer']}; top {ko['k']} mean-ablated: accuracy "
        f"{ko['accuracy_top_k']:.3f}, {ko['k']} random: {ko['accuracy_random_k_mean']:.3f} ± "
        f"{ko['accuracy_random_k_std']:.3f} (first-token scoring)."
    )
    if not full:
        return head_result
    rows = []
    specs = {op: spec.model_copy(update={"operation": op, "n_max": 200}) for op in ("a+b", "a-b", "a+b+c", "a*b")}
    evaluations = {op: evaluated(lm.model, lm.tokenizer, s) for op, s in specs.items()}  # each task once
    for op in specs:
        result = base_accuracy(lm, specs[op], done=evaluations[op])
        keys = ("task", "style", "shots", "scoring", "n", "n_solved", "base_accuracy", "base_accuracy_ci")
        rows.append({k: result[k] for k in (*keys, "base_accuracy_baseline")})
    write_json(out_dir / "base_accuracy.json", {"rows": rows, "provenance": provenance(lm.info)})
    styles = timed("input styles", lambda: experiments.styles_table(lm, config, spec, list(STYLES), known=setup))
    write_json(out_dir / "styles.json", {**styles, "provenance": provenance(lm.info)})
    transfer_rows = []
    for op in ("a-b", "a+b+c", "a*b"):
        try:
            other = experiments.prepare(lm, specs[op], done=evaluations[op])
        except Af1Error as exc:  # a task the model solves nothing of is reported, not fatal
            notes.append(f"transfer to {op} skipped: {exc}")
            continue
        transfer_rows.append(experiments.transfer_config(other, config, L))
    write_json(out_dir / "transfer.json", {"rows": transfer_rows, "provenance": provenance(lm.info)})
    pos = timed("position + meaning", lambda: positional.study(lm.adapter, lm.tokenizer, positional.PositionalConfig()))
    positional_to(pos, lm, out_dir)
    notes.append(
        f"Position + meaning: median r {pos['r_median']:.3f} (row-centred {pos['r_median_row_centred']:.3f}, "
        f"random init {pos['r_median_random_init']:.3f}); the paper reports 0.959."
    )
    return head_result


def demo(
    models: list[str],
    out_dir: Path,
    spec: TaskSpec,
    threshold: float = 0.9,
    say: Callable[[str], None] = print,
    full: bool = False,
) -> Path:
    """The main job: the AF1 grid and search (with its confirmation split) on every model, each model's config
    applied to the others, and the analyses of the subgraph on the first model that has one (the last model
    when none has). One report per model and one that sets them side by side."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    specs = dict(zip(model_labels(models), models, strict=True))  # label (a folder name) -> what to load
    models = list(specs)
    timings: dict[str, float] = {}
    setups: dict[str, experiments.Setup] = {}
    found: dict[str, dict[str, Any]] = {}
    lines: list[str] = []
    for name in models:
        with stage(f"{name}: evaluation and means", timings):
            setups[name] = experiments.prepare(as_loaded(specs[name]), spec)
        with stage(f"{name}: grid and search", timings):
            _, found[name] = search_to(setups[name], out_dir / name, threshold)
        lines.append(verdict(name, setups[name], found[name]))
        say(lines[-1])
    cross = []
    for source in models:
        config = searched(found[source])
        for target in models:
            if target == source or config is None:
                continue
            on = experiments.confirmation(setups[target], found[target])  # where the target's own config is fair
            row = experiments.transfer_config(on, config, setups[source].adapter.n_layers, own=searched(found[target]))
            row["source"].update(model=source, found=found[source]["found"])
            row["target"] = target
            cross.append(row)
    chosen = next((m for m in models if found[m]["found"]), models[-1])
    config = searched(found[chosen])
    notes: list[str] = [*lines, *setups[chosen].warnings]
    heads_result = None
    if config is not None:
        notes.append(f"Analyses of {chosen} at L_wait {config.wait}, L_transfer {config.transfer}:")
        heads_result = analyse(setups[chosen], found[chosen], out_dir / chosen, notes, full, timings)
    for name in models:
        own = [lines[models.index(name)], *(notes[len(lines) :] if name == chosen else setups[name].warnings)]
        write_json(out_dir / name / "notes.json", {"notes": own})
        build_report(out_dir / name)
    timings["total"] = time.perf_counter() - t_start
    write_json(
        out_dir / "contrast.json",
        {
            "models": models,
            "task": spec.model_dump(),
            "threshold": threshold,
            "verdicts": lines,
            "searches": {m: found[m] for m in models},
            "cross": cross,
            "base_accuracy_paired": {
                f"{a} vs {b}": experiments.compare_base(setups[a], setups[b])
                for i, a in enumerate(models)
                for b in models[i + 1 :]
            },
            "analysed": chosen,
            "notes": notes,
            "heads_placement": heads_result["placement"] if heads_result else None,
            "timings_seconds": timings,
            "provenance": {m: provenance(setups[m].lm.info, task=spec.model_dump()) for m in models},
        },
    )
    say(f"demo time: {timings['total']:.0f} s")
    return build_contrast_report(out_dir)
