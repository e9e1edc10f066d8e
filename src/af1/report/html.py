"""One self-contained HTML report of the results a directory holds: a section per experiment found there, each
written by its experiment (figures embedded); a study's store gets its study report."""

from __future__ import annotations

import html
import json
from pathlib import Path

from af1.errors import Af1Error
from af1.report.markup import load_json, page
from af1.results import read_json, write_atomic


def build_report(d: str | Path) -> Path:
    """Write DIR/report.html from the experiments' result files found in DIR (or DIR's study store)."""
    from af1.experiments import REGISTRY

    d = Path(d)
    if not d.is_dir():
        raise Af1Error(f"no such results directory: {d}")
    if (d / "plan.json").is_file() and (d / "units").is_dir():
        return _study_report(d)
    parts: list[str] = []
    provenance = None
    for experiment in REGISTRY.values():
        data = load_json(d, experiment.file)
        if data is None:
            continue
        provenance = provenance or data.get("provenance")
        try:
            parts += experiment.section(experiment.Result.model_validate(data), d)
        except Exception as exc:  # a result file of another af1 version: say so, render the rest
            parts.append(
                f"<p>{html.escape(experiment.file)}: cannot show ({html.escape(str(exc).splitlines()[0])})</p>"
            )
    if not parts:
        raise Af1Error(f"{d} holds no af1 results")
    if provenance:
        parts.append("<h2>Provenance</h2><pre>" + html.escape(json.dumps(provenance, indent=2)) + "</pre>")
    return write_atomic(d / "report.html", page("af1 report", parts))


def _study_report(d: Path) -> Path:
    from af1.study.plan import StudyPlan, expand
    from af1.study.report import build_study_report
    from af1.study.store import Store

    plan = StudyPlan.model_validate(read_json(d / "plan.json")["plan"])
    return build_study_report(Store(d), plan, expand(plan))
