"""Run a study: expand the plan, skip finished units, run the rest here or on Ray (one actor per model, the same
`Worker.run` and order per model), write the report; runners sharing a store split the units by leases."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from af1.errors import Af1Error
from af1.experiments import REGISTRY
from af1.progress import note, progress
from af1.results import read_json, write_json
from af1.study.leases import TIMEOUT_S, Leases
from af1.study.plan import StudyPlan, Unit, expand
from af1.study.report import build_study_report
from af1.study.store import FINISHED, Store, now
from af1.study.units import Worker, one_line

Outcome = dict[str, Any]

# A model's actor that dies with its node is started again elsewhere (loading its model anew) and the units it held
# run again there: a unit is a pure function of its model, task and inputs, so a rerun gives the same result.
RESTARTS = {"max_restarts": 3, "max_task_retries": 3}


POLL_S = 1.0  # how often a runner looks again at units another runner holds
REPORT_EVERY_S = 30.0  # the partial report is rewritten after a unit ends, at most this often


@dataclass
class StudySummary:
    units: list[Unit]
    ran: list[str]
    skipped: list[str]
    failed: list[str]
    report: Path
    by_others: list[str] = field(default_factory=list)  # finished meanwhile by another runner on the same store


def run_study(
    plan: StudyPlan,
    out_dir: str | Path,
    ray: bool = False,
    ray_address: str | None = None,
    ray_init: dict[str, Any] | None = None,
    lease_timeout_s: float = TIMEOUT_S,
    on_end: Callable[[Unit, Outcome], None] | None = None,
) -> StudySummary:
    """Run every unfinished unit into out_dir and write the report (partial while units remain, every REPORT_EVERY_S);
    `on_end` hears of each unit this runner ends; ray_address None joins or starts a local Ray, 'auto' joins one."""
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
    expected = _estimate(store, units, todo)
    ran: list[str] = []
    by_others: list[str] = []
    reported = time.monotonic()
    with Leases(timeout_s=lease_timeout_s) as leases:
        backend: Backend = _Here(units, outcomes) if ray_module is None else _OnRay(ray_module, ray_address, ray_init)
        try:
            steps = _schedule(todo, outcomes, store, leases, backend)
            weights = (lambda step: expected.get(step[0].id, 0.0), sum(expected.get(u.id, 0.0) for u in todo))
            for unit, outcome, mine in progress(steps, total=len(todo), desc="study", weights=weights):
                if not mine:
                    outcomes[unit.id] = outcome
                    by_others.append(unit.id)
                    continue
                if not leases.holds(store.unit_dir(unit)):  # taken over while it ran (a stall past the timeout)
                    note(f"{unit.id}: its lease was taken over while it ran; the other runner's result stands")
                    outcomes[unit.id] = store.record(unit) or {"state": "running"}
                    by_others.append(unit.id)
                    continue
                outcome = {**outcome, "id": unit.id}
                outcomes[unit.id] = store.finished(unit, outcome)
                leases.release(store.unit_dir(unit))
                ran.append(unit.id)
                if on_end is not None:
                    on_end(unit, outcomes[unit.id])
                if time.monotonic() - reported >= REPORT_EVERY_S and len(ran) + len(by_others) < len(todo):
                    build_study_report(store, plan, units, partial=True)
                    reported = time.monotonic()
        finally:
            backend.close()
    failed = [u.id for u in units if outcomes.get(u.id, {}).get("state") not in FINISHED]
    report = build_study_report(store, plan, units)
    return StudySummary(units, ran, skipped, failed, report, by_others)


def _estimate(store: Store, units: list[Unit], todo: list[Unit]) -> dict[str, float]:
    """The units left's expected seconds, said in one line and kept in estimate.json (a unit done earlier keeps the
    estimate made before it ran): advisory, so a failure to estimate is said and the study runs on."""
    from af1.study import cost

    if not todo:
        return {}
    path = store.root / "estimate.json"
    try:
        estimates = cost.estimate_store(store, units)
        before = {e["unit"]: e for e in read_json(path)["units"]} if path.is_file() else {}
        kept = [before.get(e.unit, asdict(e)) if e.basis == "done" else asdict(e) for e in estimates]
        write_json(path, {"units": kept, "about": cost.ABOUT})
    except Exception as exc:  # it reads configs, tasks and an earlier estimate.json that the units check again
        note(f"estimate: not available ({one_line(exc)})")
        return {}
    note(cost.summary_line(estimates))
    return {e.unit: 0.0 if e.basis == "gated" else e.seconds for e in estimates}  # progress: what will surely run


def _schedule(
    todo: list[Unit], outcomes: dict[str, Outcome], store: Store, leases: Leases, backend: Backend
) -> Iterator[tuple[Unit, Outcome, bool]]:
    """Each unit once as it ends: (unit, outcome, True) computed here, (unit, record, False) finished by another
    runner; a unit starts once its inputs ended and its lease is taken (else looked at again every POLL_S)."""
    since = now()
    waiting = list(todo)
    said: set[str] = set()
    while waiting or backend.busy():
        for unit in list(waiting):
            if not backend.free(unit) or any(d not in outcomes for d in unit.deps):
                continue
            if (record := store.ended_since(unit, since)) is not None:
                waiting.remove(unit)
                note(f"{unit.id}: {record['state']} by another runner")
                yield unit, record, False
                continue
            taken, why = leases.take(store.unit_dir(unit))
            if not taken:
                if unit.id not in said:
                    said.add(unit.id)
                    note(f"{unit.id}: {why}; coming back for it")
                continue
            if (record := store.ended_since(unit, since)) is not None:  # ended between the look and the lease
                leases.release(store.unit_dir(unit))
                waiting.remove(unit)
                yield unit, record, False
                continue
            if why:
                note(f"{unit.id}: {why}")
            store.started(unit, took_over=why)
            backend.submit(unit, [outcomes[d] for d in unit.deps], str(store.unit_dir(unit)))
            waiting.remove(unit)
        for unit, outcome in backend.ended(POLL_S):
            yield unit, outcome, True


class Backend(Protocol):
    def free(self, unit: Unit) -> bool: ...  # whether a unit of this model may be handed over now
    def busy(self) -> bool: ...
    def submit(self, unit: Unit, deps: list[Outcome], state_dir: str) -> None: ...
    def ended(self, timeout_s: float) -> list[tuple[Unit, Outcome]]: ...  # waits up to timeout_s for one
    def close(self) -> None: ...


class _Here:
    """One unit at a time in this process, one model in memory at a time."""

    def __init__(self, units: list[Unit], outcomes: dict[str, Outcome]) -> None:
        self.units, self.outcomes = units, outcomes
        self.worker: Worker | None = None
        self.queued: tuple[Unit, list[Outcome], str] | None = None

    def free(self, unit: Unit) -> bool:
        return self.queued is None

    def busy(self) -> bool:
        return self.queued is not None

    def submit(self, unit: Unit, deps: list[Outcome], state_dir: str) -> None:
        self.queued = (unit, deps, state_dir)

    def ended(self, timeout_s: float) -> list[tuple[Unit, Outcome]]:
        if self.queued is None:
            time.sleep(timeout_s)
            return []
        unit, deps, state_dir = self.queued
        self.queued = None
        if self.worker is None or self.worker.entry != unit.model:
            self.worker = Worker(unit.model)  # the previous model is freed with its worker
            remember_evaluations(self.worker, self.units, self.outcomes)
        return [(unit, self.worker.run(unit, *deps, state_dir=state_dir))]

    def close(self) -> None:
        self.worker = None


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


class _OnRay:
    """Each model's units on one actor with the model's resources, one in flight per actor. A node lost while its
    units run costs a restart of their actor on another node, not the units (`RESTARTS`)."""

    def __init__(self, ray: Any, address: str | None = None, init: dict[str, Any] | None = None) -> None:
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init or {}))
        self.remote_worker = ray.remote(Worker)
        self.actors: dict[str, Any] = {}
        self.pending: dict[Any, Unit] = {}

    @staticmethod
    def _name(unit: Unit) -> str:
        return unit.model.name or unit.model.spec  # plans fill the name in; a label, never None here

    def free(self, unit: Unit) -> bool:
        return all(self._name(u) != self._name(unit) for u in self.pending.values())

    def busy(self) -> bool:
        return bool(self.pending)

    def submit(self, unit: Unit, deps: list[Outcome], state_dir: str) -> None:
        entry, name = unit.model, self._name(unit)
        if name not in self.actors:
            resources: dict[str, Any] = {"num_cpus": entry.cpus, "num_gpus": entry.gpus}
            if entry.memory_gb:
                resources["memory"] = int(entry.memory_gb * 2**30)
            self.actors[name] = self.remote_worker.options(**resources, **RESTARTS).remote(
                entry, threads=max(1, int(entry.cpus))
            )
        self.pending[self.actors[name].run.remote(unit, *deps)] = unit

    def ended(self, timeout_s: float) -> list[tuple[Unit, Outcome]]:
        if not self.pending:
            time.sleep(timeout_s)
            return []
        ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout_s)
        ends = []
        for ref in ready:
            unit = self.pending.pop(ref)
            try:
                outcome = self.ray.get(ref)
            except Exception as exc:  # the actor died (out of memory, node lost) or an input did
                outcome = {"state": "failed", "error": f"on Ray: {one_line(exc)}"}
            ends.append((unit, outcome))
        return ends

    def close(self) -> None:
        for actor in self.actors.values():
            self.ray.kill(actor)
        if self.started:
            self.ray.shutdown()


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
