"""What runs one unit: a worker that holds one model (loaded at first need) and each experiment's body."""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from af1.allforone import AF1Config
from af1.errors import Af1Error
from af1.evaluation import Evaluated, evaluated
from af1.interventions.attention import check_maskable
from af1.models import LoadedModel
from af1.results import provenance, to_json
from af1.study.plan import ModelEntry, Unit
from af1.tasks import TaskSpec


def one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, Af1Error) else f"{type(exc).__name__}: {first}"


NO_CELL = "its search found no cell whose interval clears the constant-guess baseline"


def searched_config(search: dict[str, Any]) -> AF1Config | None:
    """The AF1 config a search unit settled on: the subgraph it found, else its best eligible cell; None when
    no cell is eligible (a finding, not a failure: the units that read it say so)."""
    cell = search if search["found"] else search.get("best")
    if cell is None:
        return None
    return AF1Config(**{**search["config"], "wait": cell["wait"], "transfer": cell["transfer"]})


class Worker:
    """One model and the units that use it; a Ray actor wraps exactly this class."""

    def __init__(self, entry: ModelEntry, threads: int | None = None) -> None:
        self.entry = entry
        self._lm: LoadedModel | None = None
        self._load_error: str | None = None
        self._setups: dict[str, Any] = {}
        self._evaluated: dict[str, Any] = {}
        self.loads = 0
        if threads:
            torch.set_num_threads(threads)

    def lm(self) -> LoadedModel:
        """The model, loaded once; a failed load is remembered, not retried per unit."""
        if self._load_error is not None:
            raise Af1Error(self._load_error)
        if self._lm is None:
            from af1.models import load_model

            e = self.entry
            self.loads += 1
            try:
                self._lm = load_model(
                    e.spec,
                    dtype=e.dtype,
                    attn_implementation=e.attn,
                    trust_remote_code=e.trust_remote_code,
                    device_map=e.device_map,
                )
            except Exception as exc:
                self._load_error = one_line(exc)
                raise
        return self._lm

    def evaluated(self, spec: TaskSpec) -> Evaluated:
        """The task and the model's base scores on it: one evaluation per task, shared by every unit."""
        key = spec.model_dump_json()
        if key not in self._evaluated:
            self._evaluated.clear()  # units come task by task
            lm = self.lm()
            self._evaluated[key] = evaluated(lm.model, lm.tokenizer, spec)
        return self._evaluated[key]

    def setup(self, spec: TaskSpec) -> Any:
        from af1 import experiments

        key = spec.model_dump_json()
        if key not in self._setups:
            self._setups.clear()  # units come task by task: one task's setup (means, caches) at a time
            check_maskable(self.lm().adapter)  # refused before any evaluation is spent
            self._setups[key] = experiments.prepare(self.lm(), spec, done=self.evaluated(spec))
        return self._setups[key]

    def run(self, unit: Unit, *deps: dict[str, Any], state_dir: str | None = None) -> dict[str, Any]:
        """The unit's outcome: state done with a JSON-ready result, or failed with its error. Never raises
        for a unit's own failure, so one bad unit does not stop the others."""
        t0 = time.perf_counter()
        done = {d["id"]: d["result"] for d in deps if d.get("state") == "done"}
        missing = [d["id"] for d in deps if d.get("state") != "done"]
        if missing and not (unit.experiment == "transfer" and done):  # transfer does without some sources
            outcome = {"state": "failed", "error": f"needs {missing[0]}, which did not finish"}
        else:
            try:
                result = run_unit(self, unit, done, state_dir)
                if missing:
                    result["missing_sources"] = missing
                outcome = {"state": "done", "result": json.loads(to_json(result))}
            except Exception as exc:
                outcome = {"state": "failed", "error": one_line(exc), "traceback": traceback.format_exc(limit=-8)}
        info = self._lm.info if self._lm is not None else {"spec": self.entry.spec}
        task = unit.task.model_dump() if unit.task is not None else None
        return {
            "id": unit.id,
            **outcome,
            "seconds": time.perf_counter() - t0,
            "worker": {
                "host": platform.node(),
                "pid": os.getpid(),
                "threads": torch.get_num_threads(),
                "model_loads": self.loads,
            },
            "provenance": json.loads(to_json(provenance(info, task=task))),
        }


def run_unit(worker: Worker, unit: Unit, deps: dict[str, dict[str, Any]], state_dir: str | None) -> dict[str, Any]:
    """The body of one experiment on one model and task; deps are the results of the units it reads."""
    from af1 import experiments

    opts, spec, exp = unit.options, unit.task, unit.experiment
    if exp == "search":
        (sweep,) = deps.values()
        found = experiments.search(sweep, opts["threshold"])
        return {**found, "model": unit.model.name, "n_layers": sweep["n_layers"], "config": sweep["config"]}
    if exp == "positional":
        from af1 import positional

        lm = worker.lm()
        config = positional.PositionalConfig(window=opts["window"], n_windows=opts["n_windows"], seed=opts["seed"])
        return positional.study(lm.adapter, lm.tokenizer, config)
    assert spec is not None
    if exp == "eval":
        from af1.api import base_accuracy

        result = base_accuracy(worker.lm(), spec, done=worker.evaluated(spec))
        result.pop("provenance")
        return result
    if exp == "heads":
        from af1 import heads

        return heads.study(worker.lm(), spec, opts["threshold"], opts["k"], opts["draws"], done=worker.evaluated(spec))
    setup = worker.setup(spec)
    if exp == "sweep":
        config = AF1Config(ablation=opts["ablation"], abp=opts["abp"])
        state = Path(state_dir) / "sweep.state.json" if state_dir else None
        return experiments.sweep(setup, config, opts["max_transfer"], opts["reference"], state_path=state)
    if exp == "necessity":
        found = None
        if deps:
            (search,) = deps.values()
            found = searched_config(search)
        found_on = experiments.confirmation(setup, search) if deps and found is not None else None
        result = experiments.necessity(setup, tuple(opts["windows"]), found, found_on)
        if deps and found is None:  # the unmodified model's windows still say where the last token reads
            result["no_config"] = f"the transfer window is not moved: {NO_CELL}"
        return result
    if exp == "styles":
        if opts["wait"] is not None:
            config = AF1Config(wait=opts["wait"], transfer=opts["transfer"])
        else:
            (search,) = deps.values()
            config = searched_config(search)
            if config is None:
                raise Af1Error(f"no config to apply to the styles: {NO_CELL} (give styles a wait and transfer)")
        config.check(setup.adapter.n_layers)
        return experiments.styles_table(
            setup.lm, config, spec, opts["styles"], tuple(opts["operations"] or [spec.operation])
        )
    if exp == "transfer":
        rows, without = [], []
        for search in deps.values():
            config = searched_config(search)
            if config is None:
                without.append(search["model"])
                continue
            row = experiments.transfer_config(setup, config, search["n_layers"])
            row["source"].update(model=search["model"], found=search["found"], threshold=search["threshold"])
            rows.append(row)
        result = {**setup.describe(), "target": unit.model.name, "rows": rows}
        if without:
            result["sources_without_config"] = {model: NO_CELL for model in without}
        return result
    raise Af1Error(f"unknown experiment {exp}")
