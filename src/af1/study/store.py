"""The study's store: one atomically written record per unit (DIR/units/<model>/<task>/<experiment>/unit.json: state,
key, result or error, provenance); a rerun skips a unit done with the same key and redoes the rest."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from af1.experiments import REGISTRY
from af1.experiments.base import Result
from af1.results import read_json, write_json
from af1.study.plan import Unit

FINISHED = ("done", "not_applicable")  # a unit that does not apply is a finding, not a failure to redo


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class Store:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._typed: dict[tuple[str, str | None], Result | None] = {}  # (unit, when it finished): read once

    def unit_dir(self, unit: Unit) -> Path:
        return self.root / "units" / unit.id

    def record(self, unit: Unit) -> dict[str, Any] | None:
        path = self.unit_dir(unit) / "unit.json"
        if not path.is_file():
            return None
        try:
            return read_json(path)
        except (OSError, json.JSONDecodeError):  # written atomically, so only a foreign edit lands here
            return None

    def done(self, unit: Unit) -> dict[str, Any] | None:
        """The unit's record if it finished (done, or not applicable) with its current inputs, else None."""
        record = self.record(unit)
        if record is None or record.get("key") != unit.key or record.get("state") not in FINISHED:
            return None
        if record.get("state") == "done" and read_result(unit, record) is None:
            return None  # written by an af1 whose result had other fields: run again rather than misread
        return record

    def typed(self, unit: Unit) -> Result | None:
        """A done unit's result as its experiment's typed result, validated once per record (a report reads each
        several times; a runner, which only asks `done`, holds none); None where there is none that fits."""
        record = self.record(unit)
        if record is None or record.get("key") != unit.key or record.get("state") != "done":
            return None
        at = (unit.id, record.get("finished"))
        if at not in self._typed:
            self._typed[at] = read_result(unit, record)
        return self._typed[at]

    def ended_since(self, unit: Unit, since: str) -> dict[str, Any] | None:
        """The unit's record if it finished with its current inputs, or failed after `since` (in another runner of
        this study, whose failure is not retried in the same run)."""
        record = self.record(unit)
        if record is not None and record.get("key") == unit.key and record.get("state") == "failed":
            return record if (record.get("finished") or "") >= since else None
        return self.done(unit)

    def results(self) -> dict[str, Any]:
        """Every record's result (None where not done), keyed by unit id: what two runs are compared by."""
        records = (read_json(path) for path in (self.root / "units").rglob("unit.json"))
        return {record["id"]: record.get("result") for record in records}

    def started(self, unit: Unit, took_over: str | None = None) -> None:
        self._write(unit, {"state": "running", "started": now(), **({"took_over": took_over} if took_over else {})})

    def finished(self, unit: Unit, outcome: dict[str, Any]) -> dict[str, Any]:
        previous = self.record(unit) or {}
        kept = {k: previous[k] for k in ("started", "took_over") if k in previous}
        return self._write(unit, {**outcome, **kept, "finished": now()})

    def _write(self, unit: Unit, fields: dict[str, Any]) -> dict[str, Any]:
        record = {
            **unit.describe(),
            "key": unit.key,
            "options": unit.options.model_dump(),
            "deps": list(unit.deps),
            **fields,
        }
        write_json(self.unit_dir(unit) / "unit.json", record)
        return record


def read_result(unit: Unit, record: dict[str, Any]) -> Result | None:
    """A stored result as this af1's experiment types it (every field declared, each of its type), or None."""
    try:
        return REGISTRY[unit.experiment].Result.model_validate(record.get("result"))
    except (ValidationError, KeyError):
        return None
