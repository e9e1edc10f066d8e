"""What runs one unit: a worker that holds one model (loaded at first need) and runs the registry's experiments."""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from af1.experiments import REGISTRY, Inputs, NotApplicable, run_on
from af1.experiments.base import Result
from af1.experiments.search import NO_CELL
from af1.experiments.session import Session, one_line
from af1.models import load_model
from af1.progress import peak_memory
from af1.results import provenance, to_json
from af1.study.plan import ModelEntry, Unit
from af1.threads import configure

__all__ = ["NO_CELL", "Worker", "one_line", "run_unit"]


class Worker(Session):
    """One model and the units that use it; a Ray actor wraps exactly this class."""

    def __init__(self, entry: ModelEntry, threads: int | None = None) -> None:
        super().__init__(self._load_entry)
        self.entry = entry
        if threads:
            configure(threads, asked_by="the plan's cpus for this model (a Ray actor)")

    def _load_entry(self) -> Any:

        e = self.entry
        return load_model(
            e.spec,
            dtype=e.dtype,
            attn_implementation=e.attn,
            trust_remote_code=e.trust_remote_code,
            device_map=e.device_map,
        )

    def run(self, unit: Unit, *deps: dict[str, Any], state_dir: str | None = None) -> dict[str, Any]:
        """The unit's outcome: done with a JSON-ready result, not applicable with its reason (a finding), or failed
        with its error. Never raises for a unit's own failure, so one bad unit does not stop the others."""
        t0 = time.perf_counter()
        experiment = REGISTRY[unit.experiment]
        required = set(experiment.needs(unit.options))
        done = {d["id"]: d["result"] for d in deps if d.get("state") == "done"}
        missing = [d["id"] for d in deps if d.get("state") != "done" and d["id"].rsplit("/", 1)[1] in required]
        inapplicable = [d["id"] for d in deps if d.get("state") == "not_applicable" and d["id"] in missing]
        with peak_memory() as peak:
            if missing and not (experiment.scope == "models" and done):  # cross-model does with the sources it has
                if inapplicable:
                    outcome = {"state": "not_applicable", "reason": f"reads {inapplicable[0]}, which did not apply"}
                else:
                    outcome = {"state": "failed", "error": f"needs {missing[0]}, which did not finish"}
            else:  # an optional input that did not finish is left out
                try:
                    result = run_unit(self, unit, done, state_dir)
                    if missing:
                        result["missing_sources"] = missing
                    outcome = {"state": "done", "result": json.loads(to_json(result))}
                except NotApplicable as why:
                    outcome = {"state": "not_applicable", "reason": str(why)}
                except Exception as exc:
                    outcome = {"state": "failed", "error": one_line(exc), "traceback": traceback.format_exc(limit=-8)}
        lm = self.loaded
        info = lm.info if lm is not None else described(self.entry, deps)
        task = unit.task.described() if unit.task is not None else None
        return {
            "id": unit.id,
            **outcome,
            "seconds": time.perf_counter() - t0,
            "worker": {
                "host": platform.node(),
                "pid": os.getpid(),
                "threads": torch.get_num_threads(),
                "model_loads": self.loads,
                "peak_rss_mb": peak[0].mb,
                "peak_rss_covers": peak[0].covers,  # the unit's own, where the OS lets it be measured
            },
            "provenance": json.loads(to_json(provenance(info, task=task))),
        }


def described(entry: ModelEntry, deps: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The model as a unit that did not load it records it: as a dependency of the same plan entry (its name, so
    its dtype and attention too) that loaded it described it, else by its spec alone."""
    for dep in deps:
        model = (dep.get("provenance") or {}).get("model") or {}
        if dep.get("id", "").startswith(f"{entry.name}/") and model.get("source"):
            return model
    return {"spec": entry.spec}


def run_unit(worker: Session, unit: Unit, deps: dict[str, dict[str, Any]], state_dir: str | None) -> dict[str, Any]:
    """One unit on its dependencies' JSON (by unit id, as a store or another process holds them), each typed once
    here; a JSON-ready dict. It follows the warnings of what it read on its own model, not other models'."""
    typed = {d: REGISTRY[d.rsplit("/", 1)[1]].Result.model_validate(r) for d, r in deps.items()}
    read: dict[str, list[Result]] = {}
    for dep_id, result in typed.items():
        read.setdefault(dep_id.rsplit("/", 1)[1], []).append(result)
    inputs = Inputs(worker, unit.task, unit.model.name or unit.model.spec, read, Path(state_dir) if state_dir else None)
    own = [r for d, r in typed.items() if d.startswith(f"{unit.model.name}/")]
    return run_on(inputs, unit.experiment, unit.options, own).data()
