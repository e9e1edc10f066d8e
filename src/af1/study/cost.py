"""A study's wall time and peak memory per unit before it runs: work counted from the plan, FLOPs over this machine's
measured rate times each experiment's fitted slowdown; what only a finished unit knows is read, else assumed."""

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

from af1.experiments import REGISTRY
from af1.experiments.costs import Cost, Found, ModelShape, Shapes, TaskShape, Work
from af1.study.plan import ModelEntry, StudyPlan, Unit, expand
from af1.study.store import Store
from af1.tasks.spec import TaskSpec
from af1.tasks.task import Task


def declared(experiment: str) -> Cost:
    """The experiment's declared cost (the defaults for a name not registered: nothing fitted)."""
    return REGISTRY[experiment].cost if experiment in REGISTRY else Cost()


def slowdown(experiment: str) -> float:
    """The experiment's slowdown on this CPU, as it declares it (`Experiment.cost`)."""
    from af1.executors.greedy import bf16_pays  # measured once per process

    cost = declared(experiment)
    return cost.slowdown_without_bf16 if cost.slowdown_without_bf16 is not None and not bf16_pays() else cost.slowdown


RUNTIME_GB = 0.5  # torch, transformers and the study's own state
LOAD_S, LOAD_GB_PER_S = 1.0, 0.4  # loading a model (its tokenizer, config and checks; its weights read)
CALL_S = 0.1  # the grid's fixed cost per (wait, answer step): its means, masks and bookkeeping
ASSUMED_WAIT = 0.5  # the searched cell's L_wait as a share of the layers, where the search has not run
ABOUT = (
    "expected seconds and peak memory per unit, from the plan's work at this machine's measured matrix-product rate "
    "(slowdowns fitted on a 2-core CPU; on a GPU the rate is measured but the fit is the CPU's); inputs the plan "
    "cannot give (problems solved, the searched cell) are read from finished units (basis: measured) or assumed"
)


@dataclass(frozen=True)
class Estimate:
    """One unit's expected wall time and peak resident memory on this machine."""

    unit: str
    seconds: float
    peak_gb: float
    # "done" (in the store: costs nothing), "measured" (its inputs known), "assumed", "unknown" (no cost model),
    # "gated" (asked only where its search chooses a cell, not known yet), "not applicable" (its search chose none)
    basis: str


def unit_work(
    unit: Unit, model: ModelShape, task: TaskShape | None, found: Found, others: list[TaskShape]
) -> Work | None:
    """The unit's layer passes, unembedding rows and other FLOPs, as its experiment counts them (`others`: the
    shapes of tasks it compares with)."""
    from_file = unit.task is not None and unit.task.file is not None
    shapes = Shapes(model, task, found, tuple(others), from_file)
    return REGISTRY[unit.experiment].work(unit.options, shapes) if unit.experiment in REGISTRY else None


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
    """Peak resident memory: the runtime and the weights times the experiment's factor (the model, its means and
    caches, working copies)."""
    return RUNTIME_GB + model.weight_gb * declared(unit.experiment).memory_factor


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
    """Each unit's wall time and peak memory here: one done in the store costs nothing (unless `redo_done`), what it
    measured replaces what is assumed, and a unit pays a model load where the one before held another model."""
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
