"""Run a study: expand the plan, skip finished units, run the rest here or on Ray, write the report.

Both backends run the same `Worker.run` on the same units in the same order per model, so a plan
gives the same results locally and on Ray. Ray does the scheduling: a unit's inputs are the
ObjectRefs of the units it reads, and each model's units go to one actor that loads it once.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from af1.errors import Af1Error
from af1.experiments import REGISTRY
from af1.experiments.base import NoResources
from af1.progress import progress
from af1.results import write_json
from af1.study.plan import StudyPlan, Unit, expand
from af1.study.report import build_study_report
from af1.study.store import FINISHED, Store
from af1.study.units import Worker, one_line, unit_inputs

Outcome = dict[str, Any]

# A model's actor that dies with its node is started again elsewhere (loading its model anew) and the units it held
# run again there: a unit is a pure function of its model, task and inputs, so a rerun gives the same result.
RESTARTS = {"max_restarts": 3, "max_task_retries": 3}


@dataclass
class StudySummary:
    units: list[Unit]
    ran: list[str]
    skipped: list[str]
    failed: list[str]
    report: Path


def run_study(
    plan: StudyPlan,
    out_dir: str | Path,
    ray: bool = False,
    ray_address: str | None = None,
    ray_init: dict[str, Any] | None = None,
    static: bool = False,
) -> StudySummary:
    """Run every unfinished unit of the plan into out_dir and write the cross-model report (interactive; with
    `static` its PNG figures only).

    With ray, ray_address None lets ray.init join the cluster it finds or start a local one
    (ray_init: more ray.init arguments); 'auto' or an address joins that cluster.
    """
    ray_module = _require_ray(ray_address) if ray else None
    store = Store(out_dir)
    units = expand(plan)
    write_json(store.root / "plan.json", {"plan": plan.model_dump(), "units": [u.describe() for u in units]})
    outcomes: dict[str, Outcome] = {}
    skipped: list[str] = []
    todo: list[Unit] = []
    for unit in units:
        record = store.done(unit)
        if record is not None:
            outcomes[unit.id] = record
            skipped.append(unit.id)
        else:
            todo.append(unit)
    if not todo:
        backend: Iterator[tuple[Unit, Outcome]] = iter(())
    elif ray_module is not None:
        backend = _run_on_ray(ray_module, todo, outcomes, store, ray_address, ray_init)
    else:
        backend = _run_here(todo, units, outcomes, store)
    ran: list[str] = []
    for unit, outcome in progress(backend, total=len(todo), desc="study"):
        outcome = {**outcome, "id": unit.id}
        _draw(store, unit, outcome, outcomes)
        outcomes[unit.id] = store.finished(unit, outcome)
        ran.append(unit.id)
    failed = [u.id for u in units if outcomes.get(u.id, {}).get("state") not in FINISHED]
    report = build_study_report(store, plan, units, static)
    return StudySummary(units, ran, skipped, failed, report)


def _run_here(
    todo: list[Unit], units: list[Unit], outcomes: dict[str, Outcome], store: Store
) -> Iterator[tuple[Unit, Outcome]]:
    """One model in memory at a time, its units in plan order."""
    worker: Worker | None = None
    for unit in todo:
        if worker is None or worker.entry != unit.model:
            worker = Worker(unit.model)  # the previous model is freed with its worker
            remember_evaluations(worker, units, outcomes)
        store.started(unit)
        deps = [outcomes[d] for d in unit.deps]
        yield unit, worker.run(unit, *deps, state_dir=str(store.unit_dir(unit)))


def remember_evaluations(worker: Worker, done_units: list[Unit], outcomes: dict[str, Outcome]) -> None:
    """Hand a model's new worker the evaluations its earlier units made (the problem rows of results that hold one,
    `Experiment.evaluation_rows`), so a model that comes back (a cross-model unit at the end) is not evaluated again."""
    for unit in done_units:
        outcome = outcomes.get(unit.id, {})
        if unit.model != worker.entry or unit.task is None or outcome.get("state") != "done":
            continue
        rows = REGISTRY[unit.experiment].evaluation_rows(outcome.get("result") or {})
        if rows is not None:
            worker.remember(unit.task, rows)


def _run_on_ray(
    ray: Any,
    todo: list[Unit],
    outcomes: dict[str, Outcome],
    store: Store,
    address: str | None,
    init: dict[str, Any] | None,
) -> Iterator[tuple[Unit, Outcome]]:
    """Each model's units on one actor with the model's resources; outcomes as they finish. A node lost while its
    units run costs a restart of their actor on another node, not the units (`RESTARTS`)."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init or {}))
    remote_worker = ray.remote(Worker)
    actors: dict[str, Any] = {}
    refs: dict[str, Any] = {}
    pending: dict[Any, Unit] = {}
    try:
        for unit in todo:
            entry = unit.model
            name = entry.name or entry.spec  # plans fill the name in; a label, never None here
            if name not in actors:
                resources: dict[str, Any] = {"num_cpus": entry.cpus, "num_gpus": entry.gpus}
                if entry.memory_gb:
                    resources["memory"] = int(entry.memory_gb * 2**30)
                actors[name] = remote_worker.options(**resources, **RESTARTS).remote(
                    entry, threads=max(1, int(entry.cpus))
                )
            deps = [refs.get(d, outcomes.get(d)) for d in unit.deps]
            store.started(unit)
            refs[unit.id] = actors[name].run.remote(unit, *deps)
            pending[refs[unit.id]] = unit
        while pending:
            (ready,), _ = ray.wait(list(pending), num_returns=1)
            unit = pending.pop(ready)
            try:
                outcome = ray.get(ready)
            except Exception as exc:  # the actor died (out of memory, node lost) or an input did
                outcome = {"state": "failed", "error": f"on Ray: {one_line(exc)}"}
            yield unit, outcome
    finally:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()


def _require_ray(address: str | None) -> Any:
    """Ray, once an explicit cluster address answers: ray.init would retry an unreachable one for minutes."""
    try:
        import ray
    except ImportError as exc:
        raise Af1Error("af1 study --ray needs Ray: pip install 'af1[ray]'") from exc
    host, sep, port = (address or "").removeprefix("ray://").rpartition(":")
    if sep and port.isdigit():
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except OSError as exc:
            raise Af1Error(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from exc
    return ray


def _draw(store: Store, unit: Unit, outcome: Outcome, outcomes: dict[str, Outcome]) -> None:
    """The unit's figure beside its record; a figure that fails is noted, the result stands."""
    experiment = REGISTRY[unit.experiment]
    if experiment.figure is None or outcome.get("state") != "done":
        return
    deps = {d: outcomes[d]["result"] for d in unit.deps if outcomes.get(d, {}).get("state") == "done"}
    try:
        inputs = unit_inputs(NoResources(), unit, deps, None)
        result = experiment.Result.model_validate(outcome["result"])
        experiment.draw(result, store.unit_dir(unit), inputs)
    except Exception as exc:
        outcome["figure_error"] = one_line(exc)
