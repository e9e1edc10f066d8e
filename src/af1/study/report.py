"""The study's report: each experiment's cross-model part (its `overview`: verdicts, AF1 per model and task,
paired base accuracy, shared heads, transfer), every finished unit's own section, and every unit's wall time."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from af1.errors import Af1Error
from af1.experiments import REGISTRY
from af1.experiments.base import Finished
from af1.progress import note
from af1.report.interactive import sortable
from af1.report.markup import READING_GUIDE, load_json, page, table_html, warnings_html
from af1.results import read_json, write_atomic, write_json
from af1.study.plan import StudyPlan, Unit, expand, task_label
from af1.study.store import Store


def _label(unit: Unit) -> str:
    return task_label(unit.task) if unit.task is not None else "model"


def _state(unit: Unit, record: dict[str, Any], done: bool) -> tuple[str, str | None]:
    """A unit's state in the report, and why where it did not finish: a record of other inputs, or a result this
    af1 cannot read, is stale (the next run of the study runs it again), never shown as done."""
    if record.get("key", unit.key) != unit.key:
        return "stale", "its inputs changed since it ran"
    if record.get("state") == "done" and not done:
        return "stale", f"its result does not fit this af1's {unit.experiment} result: the next run redoes it"
    return record.get("state", "missing"), record.get("error") or record.get("reason")


def _estimates(store: Store) -> dict[str, float]:
    """Each unit's expected seconds as the study's start estimated them (`study.cost`), where it did."""
    path = store.root / "estimate.json"
    try:
        return {e["unit"]: round(e["seconds"], 1) for e in read_json(path)["units"] if e["basis"] != "done"}
    except (OSError, ValueError, KeyError, TypeError):  # none, or not one af1 wrote: the report shows no estimates
        return {}


def _whole(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.0f}"


def collect(store: Store, units: list[Unit]) -> tuple[dict[str, Any], list[str]]:
    """The report's data (units, their states and times, each experiment's overview) and its cross-model HTML."""
    records = {u.id: store.record(u) or {} for u in units}
    expected = _estimates(store)
    done = {u.id: t for u in units if (t := store.typed(u)) is not None}
    rows = []
    finished: dict[str, list[Finished]] = {}
    for unit in units:
        rec = records[unit.id]
        state, why = _state(unit, rec, unit.id in done)
        rows.append(
            {
                **unit.describe(),
                "state": state,
                "seconds": rec.get("seconds"),
                "estimated_seconds": expected.get(unit.id),
                "host": (rec.get("worker") or {}).get("host"),
                "peak_rss_mb": (rec.get("worker") or {}).get("peak_rss_mb"),
                "peak_rss_covers": (rec.get("worker") or {}).get("peak_rss_covers", "the process so far"),
                "error": why,
            }
        )
        if unit.id not in done:
            continue
        result = done[unit.id]
        deps: dict[str, list[Any]] = {}
        for dep in unit.deps:
            if dep in done:
                deps.setdefault(dep.rsplit("/", 1)[1], []).append(done[dep])
        model = (rec.get("provenance") or {}).get("model") or {}
        finished.setdefault(unit.experiment, []).append(
            Finished(unit.model.name or "", _label(unit), result, deps, model.get("description"))
        )
    states = [r["state"] for r in rows]
    data: dict[str, Any] = {
        "n_units": len(rows),
        "n_done": states.count("done"),
        "n_not_applicable": states.count("not_applicable"),
        "n_failed": states.count("failed"),
        "n_unfinished": len(rows) - sum(states.count(s) for s in ("done", "failed", "not_applicable")),
        "units": rows,
        "seconds_total": sum(r["seconds"] or 0 for r in rows),
        "estimated_seconds_total": round(sum(expected.values()), 1) if expected else None,
    }
    parts: list[str] = []
    for name, experiment in sorted(REGISTRY.items(), key=lambda item: item[1].overview_rank):
        overview, html_parts = experiment.overview(finished.get(name, []))
        data.update(overview)
        parts += [sortable(part) for part in html_parts]  # the cross-model tables sort by a header click
    return data, parts


def unit_sections(store: Store, units: list[Unit]) -> list[str]:
    """Every finished unit's own section, written by its experiment, grouped by model and task."""
    by_place: dict[str, list[str]] = {}
    warned: dict[str, set[str]] = {}  # a warning a unit inherits is shown once per place, where it first arises
    for unit in units:
        result = store.typed(unit)
        if result is None:
            continue
        where = f"{unit.model.name} on {_label(unit) if unit.task is not None else 'its own'}"
        parts = by_place.setdefault(where, [f"<h2>{html.escape(where)}</h2>"])
        try:
            seen = warned.setdefault(where, set())
            new = [w for w in result.warnings if w not in seen]
            seen.update(new)
            section = [*REGISTRY[unit.experiment].section(result), warnings_html(new)]
        except Exception as exc:  # the report still renders, and the log says why a section is missing
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            note(f"report: {unit.id} cannot be shown ({reason})")
            section = [f"<p>{html.escape(unit.id)}: cannot show ({html.escape(reason)})</p>"]
        parts += [p.replace("<h2>", "<h3>").replace("</h2>", "</h3>") for p in section]
    return [part for parts in by_place.values() for part in parts]


def build_study_report(store: Store, plan: StudyPlan, units: list[Unit], partial: bool = False) -> Path:
    """DIR/report.json and a self-contained DIR/report.html; `partial` while the study still runs (marked so on the
    page and in the JSON)."""
    data, overview = collect(store, units)
    data = {"name": plan.name, "partial": partial, **data}
    write_json(store.root / "report.json", data)
    running = (
        '<p class="partial"><b>Partial: the study is still running.</b> This page is rewritten as units end; '
        "the numbers below are those of the units that have ended.</p>"
    )
    parts = [
        *([running] if partial else []),
        *([f"<p>{html.escape(plan.about)}</p>"] if plan.about else []),
        READING_GUIDE,
        f"<p>{data['n_done']} of {data['n_units']} units done, {data['n_not_applicable']} not applicable, "
        f"{data['n_failed']} failed, {data['n_unfinished']} not finished. Each unit's record, result and figure are "
        "under <code>units/&lt;model&gt;/&lt;task&gt;/&lt;experiment&gt;/</code>. Every rate comes with its n, "
        "its exact 95 % interval and what a constant guess scores on the same problems.</p>",
        *overview,
        *unit_sections(store, units),
        "<h2>Units and wall time</h2>",
        table_html(
            [
                "unit",
                "state",
                "seconds",
                "estimated before the run (s)",
                "peak RSS during the unit (MB, model included)",
                "host",
                "error or reason",
            ],
            [
                [
                    r["id"],
                    r["state"],
                    "" if r["seconds"] is None else r["seconds"],
                    _whole(r["estimated_seconds"]),
                    peak_rss(r),
                    r["host"] or "",
                    r["error"] or "",
                ]
                for r in data["units"]
            ]
            + [["total", "", data["seconds_total"], _whole(data["estimated_seconds_total"]), "", "", ""]],
        ),
    ]
    return write_atomic(store.root / "report.html", page(f"af1 study: {plan.name}", parts))


def build_report(d: str | Path) -> Path:
    """Write DIR/report.html from the experiments' result files found in DIR (or DIR's study store), one offline
    file (plotly.js embedded)."""

    d = Path(d)
    if not d.is_dir():
        raise Af1Error(f"no such results directory: {d}")
    if (d / "plan.json").is_file() and (d / "units").is_dir():
        return _study_report(d)
    return _results_report(d)


def _results_report(d: Path) -> Path:
    parts: list[str] = []
    provenance = None
    for experiment in REGISTRY.values():
        data = load_json(d, experiment.file)
        if data is None:
            continue
        provenance = provenance or data.get("provenance")
        try:
            result = experiment.Result.model_validate({k: v for k, v in data.items() if k != "provenance"})
            parts += [*experiment.section(result), warnings_html(result.warnings)]
        except Exception as exc:  # a result file of another af1 version: say so, render the rest
            parts.append(
                f"<p>{html.escape(experiment.file)}: cannot show ({html.escape(str(exc).splitlines()[0])})</p>"
            )
    if not parts:
        raise Af1Error(f"{d} holds no af1 results")
    parts.insert(0, READING_GUIDE)
    if provenance:
        parts.append("<h2>Provenance</h2><pre>" + html.escape(json.dumps(provenance, indent=2)) + "</pre>")
    return write_atomic(d / "report.html", page("af1 report", parts))


def _study_report(d: Path) -> Path:

    plan = StudyPlan.model_validate(read_json(d / "plan.json")["plan"])
    return build_study_report(Store(d), plan, expand(plan))


def peak_rss(row: dict[str, Any]) -> str:
    """A unit's peak RSS in MB; marked where only its process's peak so far could be read (no Linux /proc)."""
    if row["peak_rss_mb"] is None:
        return ""
    mb = f"{row['peak_rss_mb']:.0f}"
    return mb if row["peak_rss_covers"] == "its own" else f"{mb} (process so far)"
