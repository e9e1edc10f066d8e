"""What a study will cost before it runs: each unit's wall time and peak memory.

A unit's work is counted from the plan alone (the model's shapes from its config, the task's problems from its
tokenizer, the experiment's options): layer passes of one token (LP) and unembedding rows (VR, one D x V product).
Seconds = FLOPs / this machine's matrix-product rate x the experiment's slowdown, measured in a second or two on
the device and dtype the model runs in. The slowdowns were fitted on a 2-core CPU (`benchmarks/estimate.py`
reruns the fit and checks it); on CUDA only the rate is measured, so a GPU estimate is not calibrated. What the plan
cannot say (how many problems the model solves, the searched cell) is read from finished units where the store
has them, else assumed: every problem solved, the cell at the middle layer with one transfer layer.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from af1.experiments.components import default_waits
from af1.study.plan import ModelEntry, StudyPlan, Unit, expand
from af1.study.store import Store
from af1.tasks.spec import TaskSpec
from af1.tasks.task import Task

# how many times slower than the measured matrix-product rate each experiment's FLOPs run (skinny last-token
# products, Python between them): fitted by benchmarks/estimate.py on the demos' units (on a CPU with AVX-512 and
# bfloat16 products, and for the search, eval and transfer also on one with AVX2 only)
SLOWDOWN: dict[str, float] = {
    "eval": 0.5,  # fitted on AVX-512; without bfloat16 products, WITHOUT_BF16's
    "sweep": 1.1,
    "search": 0.36,  # fitted on an AVX2-only CPU (0.33 and 0.40 on two fresh clones' demos)
    "run": 1.2,  # not in either demo: taken from the faithfulness runs of alternatives
    "components": 1.17,
    "necessity": 1.4,
    "probes": 1.5,  # not in the focused demo: a guess, not fitted (its ridge fits and permutations are left out)
    "neurons": 1.5,  # not in the focused demo: a guess, not fitted
    "alternatives": 1.2,
    "prune": 1.5,
    "styles": 2.4,
    "heads": 1.33,
    "attribution": 1.33,  # not in the focused demo: the heads study's
    "finetune": 1.5,  # not in either demo (nor its backward passes): a guess, not fitted
    "positional": 0.99,
    "transfer": 0.6,  # fitted on an AVX2-only CPU (0.53 and 0.69 on two fresh clones' demos)
}
# where bfloat16 products do not pay (AVX2 only), the experiments whose fit differs: the evaluation's other kernels
# run slower beside the matrix products (fitted 0.97 and 1.42 on two fresh clones' demos, 2026-11-28)
WITHOUT_BF16: dict[str, float] = {"eval": 1.2}


def slowdown(experiment: str) -> float:
    """The experiment's slowdown on this CPU (1 for one registered from outside)."""
    from af1.executors.greedy import bf16_pays  # measured once per process

    if experiment in WITHOUT_BF16 and not bf16_pays():
        return WITHOUT_BF16[experiment]
    return SLOWDOWN.get(experiment, 1.0)


# peak resident memory = RUNTIME_GB + the weights x this factor (the model, its means and caches, working copies)
MEMORY_FACTOR: dict[str, float] = {"eval": 1.3, "positional": 3.2, "styles": 2.2, "heads": 2.0, "prune": 2.0}
MEMORY_FACTOR_DEFAULT = 1.8
RUNTIME_GB = 0.5  # torch, transformers and the study's own state
LOAD_S, LOAD_GB_PER_S = 1.0, 0.4  # loading a model (its tokenizer, config and checks; its weights read)
FIT_FLOPS = 2.2e6  # FLOPs per attention logit in the position+meaning study's fits (all their iterations)
FINETUNE_SHOTS_TOKENS = 20  # the worked examples' tokens a fine-tuning row adds to its prompt
CALL_S = 0.1  # the grid's fixed cost per (wait, answer step): its means, masks and bookkeeping
# the share of the selection split the search measures per cell before the rule decides it (to the best cell's
# misses where none reaches the threshold): 0.44 and 0.39 in the demo's two models
SEARCH_SHARE = 0.5
ASSUMED_WAIT = 0.5  # the searched cell's L_wait as a share of the layers, where the search has not run
ABOUT = (
    "expected seconds and peak memory per unit, from the plan's work at this machine's measured matrix-product rate "
    "(slowdowns fitted on a 2-core CPU; on a GPU the rate is measured but the fit is the CPU's); inputs the plan "
    "cannot give (problems solved, the searched cell) are read from finished units (basis: measured) or assumed"
)


@dataclass(frozen=True)
class ModelShape:
    """What a model's cost depends on, read from its config without its weights."""

    layers: int
    heads: int
    layer_flops: float  # one token through one layer's matrices (2 x multiply-adds)
    unembed_flops: float  # one unembedding row: 2 x D x V
    weight_gb: float  # in the dtype the plan loads it in


@dataclass(frozen=True)
class TaskShape:
    """What a task's cost depends on: its problems, the tokens each runs past the shared context, its steps."""

    n: int
    suffix: float  # mean prompt tokens after the shared context
    steps: float  # mean scored steps per problem (answer tokens, and the end where it is checked)
    answer_steps: float  # mean answer tokens
    max_steps: int  # scored steps of the longest answer: the grid runs once per wait and step

    def step_tokens(self) -> float:
        """Tokens of one problem run once per scored step (each step's prompt is one token longer)."""
        return self.steps * self.suffix + self.steps * (self.steps - 1) / 2


@dataclass(frozen=True)
class Found:
    """What a unit reads from the units before it, or what is assumed before they ran."""

    solved: int
    wait: int
    transfer: int
    measured: bool  # read from finished units, not assumed


@dataclass(frozen=True)
class Estimate:
    """One unit's expected wall time and peak resident memory on this machine."""

    unit: str
    seconds: float
    peak_gb: float
    # "done" (in the store: costs nothing), "measured" (its inputs known), "assumed", "unknown" (no cost model),
    # "gated" (asked only where its search chooses a cell, not known yet), "not applicable" (its search chose none)
    basis: str


Work = tuple[float, float, float]  # (layer passes of one token, unembedding rows, other FLOPs)


def sweep_passes(layers: int, max_transfer: int | None) -> tuple[int, int]:
    """Last-token layer passes and cells of the (L_wait, L_transfer) grid, per problem step."""
    passes = cells = 0
    for wait in range(-1, layers):
        top = min(layers - 1 - wait, layers if max_transfer is None else max_transfer)
        passes += top + sum(layers - 1 - wait - j for j in range(top + 1))
        cells += top + 1
    return passes, cells


def unit_work(
    unit: Unit, model: ModelShape, task: TaskShape | None, found: Found, others: list[TaskShape]
) -> Work | None:
    """The unit's layer passes, unembedding rows and other FLOPs (`others`: the shapes of tasks it compares with)."""
    L, opts = model.layers, unit.options.model_dump()
    if task is None:  # position+meaning: corpus windows through the model ~22 times, and its fits over every logit
        windows, width = float(opts["n_windows"]), float(opts["window"])
        return 22 * windows * width * L, 13 * windows * width, FIT_FLOPS * model.heads * L * windows * width**2
    n, solved, after = task.n, found.solved, L - 1 - max(found.wait, 0)
    half = solved / 2
    clean = solved * task.step_tokens() * L  # every solved problem's clean states, once per setup
    faith = half * task.steps * after  # one faithfulness run on the confirmation half
    experiment = unit.experiment
    if experiment == "eval":
        return n * (task.suffix + task.steps - 1) * L, n * task.steps, 0.0
    if experiment == "sweep":
        passes, cells = sweep_passes(L, opts["max_transfer"])
        kv = solved * task.suffix * L * (L - 1) / 2  # token-local keys and values, rebuilt for each wait
        return solved * task.steps * passes + clean + kv, solved * task.steps * cells, 0.0
    if experiment == "run":
        return faith + clean, half * task.steps, 0.0
    if experiment == "components":
        waits = [w for w in opts["waits"] or default_waits(L) if 0 <= w < L]
        runs = sum(L - 1 - w for w in waits)
        return 2 * runs * solved * task.step_tokens() + clean, 2 * len(waits) * solved * task.steps, 0.0
    if experiment == "necessity":
        widths = [w for w in opts["windows"] if w <= L]
        sets = sum(L - w + 1 for w in widths)  # each window from its first layer to the top, one row each
        passes = sum(L * (L + 1) / 2 - w * (w - 1) / 2 for w in widths)
        moved = (L - found.transfer - max(found.wait, 0)) * faith if found.transfer else 0
        capture = solved * task.step_tokens() * L
        return capture + solved * task.steps * passes + moved, solved * task.steps * sets, 0.0
    if experiment == "probes":  # the last token's states after every block, unmodified and under AF1
        return 2 * half * task.step_tokens() * L + clean, 2 * half, 0.0
    if experiment == "neurons":  # a forward and backward on the selection half, then knock-out sets' faithfulness
        sets = (1 + opts["draws"]) * (1 + math.log2(max(opts["largest"], 1))) + 64  # and 64 neurons one by one
        return 3 * half * task.step_tokens() * L + sets * faith + clean, sets * half * task.steps, 0.0
    if experiment == "attribution":  # the estimate (clean forward and backward, counterfactual forward), then 'total'
        estimate = 4 * solved * task.step_tokens() * L
        return estimate + _patching(model, task, solved), solved * task.steps * (2 + model.heads), 0.0
    if experiment == "alternatives":
        shared = 10 * half * task.step_tokens() * after + 5 * half * task.step_tokens() * (found.wait + 1)
        return shared + 4 * faith + clean, 14 * half * task.steps, 0.0
    if experiment == "prune":  # greedy rounds over the transfer heads; the whole curve where it never drops
        heads = found.transfer * model.heads
        sets = heads * (heads + 1) / 2
        return (sets + 3) * faith + clean, sets * half * task.steps, 0.0
    if experiment == "styles":
        rows = len(opts["styles"]) * len(opts["operations"] or [None])
        one = n * (task.suffix + task.steps) * L + clean + faith
        return rows * one, rows * n * task.steps, 0.0
    if experiment == "heads":
        return _heads_work(model, task, found, opts, others, file=unit.task is not None and unit.task.file is not None)
    if experiment == "finetune":  # 3 variants per learning rate, then seeds of each and random draws: fwd + bwd
        from af1.methods.finetune.train import FinetuneConfig

        runs = 3 * len(opts["lrs"]) + 2 * opts["seeds"] + opts["random_draws"]
        batch = FinetuneConfig().batch_size
        tokens = float(opts["steps"]) * batch * (task.suffix + task.steps + FINETUNE_SHOTS_TOKENS)
        return runs * 3 * tokens * L, runs * 3 * tokens, 0.0
    if experiment == "transfer":  # each distinct config once: its own, and the other model's by layers and by depth
        return 3 * faith + clean, 3 * half * task.steps, 0.0
    if experiment == "search":  # every cell with a compute stage on some selection problems, the judged one on all
        cells = L * (L + 1) / 2
        pairs = cells * solved * opts["selection"] * SEARCH_SHARE + solved
        return pairs * task.steps * (2 * L + 1) / 3 + clean, pairs * task.steps, 0.0
    return None  # an experiment registered from outside: no cost model


def _patching(model: ModelShape, task: TaskShape, problems: float) -> float:
    """Wang's path patching of every head on `problems`: a clean and a counterfactual run, then each layer's heads
    (and the two residual paths) patched through the layers above, per answer step."""
    L, H = model.layers, model.heads
    per_step = 2 * (task.suffix + task.answer_steps / 2) * L + (H + 2) * L * (L + 1) / 2
    return problems * task.answer_steps * per_step


def _heads_work(
    model: ModelShape, task: TaskShape, found: Found, opts: dict[str, Any], others: list[TaskShape], file: bool
) -> Work:
    L, half, draws = model.layers, found.solved / 2, opts["draws"]
    ranked = 4 * half * task.step_tokens() * L if opts["rank"] == "attribution" else _patching(model, task, half)
    patch = ranked * (2 if opts["rank_both"] and not file else 1)  # a task file ranks once
    compared = sum(_patching(model, o, o.n / 2) + o.n * (o.suffix + o.steps) * L for o in others)
    knockouts = (draws + 2) * half * task.step_tokens() * L
    consistency = 14 * half * task.steps * (L - 1 - max(found.wait, 0)) if found.transfer else 0
    means = task.n * task.step_tokens() * L
    rows = task.n * task.steps + (draws + 2) * half * task.steps + sum(o.n * o.steps for o in others)
    return patch + compared + knockouts + consistency + means, rows, 0.0


def unit_seconds(
    unit: Unit, model: ModelShape, task: TaskShape | None, found: Found, rate: float, others: list[TaskShape]
) -> float | None:
    """Seconds at `rate` FLOP/s: its FLOPs x the experiment's slowdown (None: an experiment with no cost model)."""
    work = unit_work(unit, model, task, found, others)
    if work is None:
        return None
    passes, rows, other = work
    flops = passes * model.layer_flops + rows * model.unembed_flops + other
    calls = (model.layers + 1) * task.max_steps if unit.experiment in ("sweep", "search") and task is not None else 0
    return slowdown(unit.experiment) * flops / rate + calls * CALL_S


def peak_gb(unit: Unit, model: ModelShape) -> float:
    return RUNTIME_GB + model.weight_gb * MEMORY_FACTOR.get(unit.experiment, MEMORY_FACTOR_DEFAULT)


@functools.cache
def matmul_rate(device: str = "cpu", dtype: str = "float32", seconds: float = 1.0) -> float:
    """This machine's matrix-product rate in FLOP/s, at the shapes a layer pass has (best of a second's tries)."""
    import torch

    kind = getattr(torch, dtype)
    a = torch.randn(256, 1024, device=device, dtype=kind)
    b = torch.randn(1024, 4096, device=device, dtype=kind)
    c = torch.empty(a.shape[0], b.shape[1], device=device, dtype=kind)
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b, out=c)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / 4)
    return flops / best


_LAYER_NAME = re.compile(r"\.(\d+)\.")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_shape(directory: Path, dtype: str) -> ModelShape:
    """A model's cost shape from its config (parameters built on the meta device: no weights read)."""
    from af1.models.loading import config_shapes

    config = json.loads((directory / "config.json").read_text())
    config = config.get("text_config", config)
    shapes = config_shapes(directory)
    layers = int(config.get("num_hidden_layers") or config.get("n_layer"))
    heads = int(config.get("num_attention_heads") or config.get("n_head"))
    hidden = int(config.get("hidden_size") or config.get("n_embd"))
    vocab = int(config["vocab_size"])
    numel = {name: float(math.prod(shape)) for name, shape in shapes.items()}
    if config.get("tie_word_embeddings", True):  # one tensor under two names
        numel.pop("lm_head.weight", None)
    in_layers = sum(v for name, v in numel.items() if _LAYER_NAME.search(name) and len(shapes[name]) == 2)
    total = sum(numel.values()) or (hidden * vocab * 2 + in_layers)
    return ModelShape(
        layers=layers,
        heads=heads,
        layer_flops=2 * in_layers / layers if in_layers else 24.0 * hidden * hidden,
        unembed_flops=2.0 * hidden * vocab,
        weight_gb=total * DTYPE_BYTES.get(dtype, 4) / 1e9,
    )


def task_shape(task: Task) -> TaskShape:
    """A built task's cost shape (over its layout groups, each with its own shared context)."""
    groups = task.groups or [task]
    n = sum(len(g) for g in groups)
    suffix = sum(len(g) * (g.n_positions - g.context_len) for g in groups) / max(n, 1)
    steps = sum(len(s) for g in groups for s in g.scored_tokens) / max(n, 1)
    answer = sum(len(a) for g in groups for a in g.answer_tokens) / max(n, 1)
    deepest = max((len(s) for g in groups for s in g.scored_tokens), default=0)
    return TaskShape(n=n, suffix=suffix, steps=steps, answer_steps=answer, max_steps=deepest)


def found_from(unit: Unit, finished: Callable[[str], dict[str, Any] | None], n: int, layers: int) -> Found:
    """What the unit will read: the eval's solved count and the search's cell, where those units are done (`finished`:
    a unit id's result, or None)."""
    base, experiment = unit.id.rsplit("/", 1)
    solved, chosen = n, None
    evaluated, searched = finished(f"{base}/eval"), finished(f"{base}/search")
    if evaluated is not None:
        solved = int(evaluated.get("n_solved", n))
    if searched is not None and searched.get("chosen"):
        judged = searched["judged"]
        chosen = int(judged["wait"]), int(judged["transfer"])
    measured = experiment in ("eval", "positional") or (
        evaluated is not None and (searched is not None or experiment in ("sweep", "search"))
    )
    wait, transfer = chosen or (int(layers * ASSUMED_WAIT), 1)
    return Found(solved=solved, wait=wait, transfer=transfer, measured=measured)


def estimate_store(store: Store, units: list[Unit], redo_done: bool = False) -> list[Estimate]:
    """Each unit's wall time and peak memory on this machine, with what the store holds: a unit done there costs
    nothing (`redo_done`: estimated all the same), and what it measured (problems solved, the searched cell) replaces
    what is assumed. A unit pays its model's load where the one before it that runs held another model."""
    records = {u.id: record for u in units if (record := store.done(u)) is not None}  # each read once
    results = {uid: r["result"] for uid, r in records.items() if r.get("state") == "done"}
    models: dict[str, tuple[ModelShape, float] | None] = {}
    tasks: dict[tuple[str, str], TaskShape] = {}
    out, held = [], None
    for unit in units:
        entry = unit.model
        if entry.spec not in models:
            models[entry.spec] = _model_and_rate(entry)
        known = models[entry.spec]
        if known is None:
            out.append(Estimate(unit.id, 0.0, 0.0, "unknown"))
            continue
        shape, rate = known
        if unit.id in records and not redo_done:
            out.append(Estimate(unit.id, 0.0, peak_gb(unit, shape), "done"))
            continue
        gated = getattr(unit.options, "require_found", False)
        searched = results.get(f"{unit.id.rsplit('/', 1)[0]}/search")
        if gated and searched is not None and not searched.get("chosen"):
            out.append(Estimate(unit.id, 0.0, 0.0, "not applicable"))
            continue
        task = _task_shape(tasks, entry, unit.task) if unit.task is not None else None
        others = [_task_shape(tasks, entry, s) for s in compared_specs(unit)]
        found = found_from(unit, results.get, task.n if task else 0, shape.layers)
        seconds = unit_seconds(unit, shape, task, found, rate, others)
        if seconds is None:
            out.append(Estimate(unit.id, 0.0, peak_gb(unit, shape), "unknown"))
            continue
        if held != entry.spec:
            seconds += LOAD_S + shape.weight_gb / LOAD_GB_PER_S
            held = entry.spec
        basis = "gated" if gated and searched is None else "measured" if found.measured else "assumed"
        out.append(Estimate(unit.id, seconds, peak_gb(unit, shape), basis))
    return out


def _model_and_rate(entry: ModelEntry) -> tuple[ModelShape, float] | None:
    """The model's cost shape and the rate of the device it will run on; None where its config is not on this
    machine (a hub model not downloaded yet)."""
    import torch

    from af1.models.loading import resolve

    where, _ = resolve(entry.spec)
    if not (Path(where) / "config.json").is_file():
        return None
    placed = entry.device_map is not None and torch.cuda.is_available()  # a unit runs on the CPU unless placed
    device = "cuda" if placed else "cpu"
    return model_shape(Path(where), entry.dtype), matmul_rate(device, entry.dtype)


def _task_shape(tasks: dict[tuple[str, str], TaskShape], entry: ModelEntry, spec: TaskSpec) -> TaskShape:
    from af1.models.loading import load_tokenizer
    from af1.tasks.task import build_task

    key = (entry.spec, spec.model_dump_json())
    if key not in tasks:
        tasks[key] = task_shape(build_task(spec, load_tokenizer(entry.spec, entry.trust_remote_code)))
    return tasks[key]


def compared_specs(unit: Unit) -> list[TaskSpec]:
    """The other tasks a heads unit ranks its heads on, as the experiment builds them."""
    from af1.experiments.heads import compare_specs

    if unit.task is None or unit.experiment != "heads":
        return []
    return compare_specs(unit.task, unit.options.model_dump()["compare"])


def available_gb() -> float | None:
    """Memory this machine has free for a new process (Linux: MemAvailable), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return None


def summary_line(estimates: list[Estimate]) -> str:
    """One line for the start of a study: the expected time and peak memory of the units left, and whether the
    memory fits this machine."""
    left = [e for e in estimates if e.basis not in ("done", "not applicable")]
    if not left:
        return "estimate: nothing left to run (every unit is done in the store)"
    gated = [e for e in left if e.basis == "gated"]
    runs = [e for e in left if e.basis != "gated"] or left  # every unit gated: the total is theirs
    total = sum(e.seconds for e in runs)
    longest, peak = max(runs, key=lambda e: e.seconds), max(left, key=lambda e: e.peak_gb)
    unknown = sum(e.basis == "unknown" for e in left)
    uncounted = f", {unknown} with no cost model not counted" if unknown else ""
    if gated and len(runs) < len(left):
        uncounted += (
            f"; up to {sum(e.seconds for e in gated):.0f} s more for {len(gated)} units asked only where a search "
            "chooses a cell"
        )
    free = available_gb()
    fits = "" if free is None else f" of {free:.1f} GB available" + (" (WILL NOT FIT)" if peak.peak_gb > free else "")
    return (
        f"estimate: about {total:.0f} s for {len(runs)} units on this machine{uncounted} (the longest: "
        f"{longest.unit}, {longest.seconds:.0f} s); peak memory about {peak.peak_gb:.1f} GB{fits}"
    )


def estimate_plan(plan: StudyPlan, out_dir: str | Path) -> list[Estimate]:
    """Every unit of a plan, with what its store (if any) already holds."""
    return estimate_store(Store(out_dir), expand(plan))
