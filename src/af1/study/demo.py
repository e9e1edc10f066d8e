"""The main job as a built-in plan: every model's AF1 grid and search, each model's config on the others, the
analyses where a model's search found a subgraph, paired base accuracy; run by the study runner like any plan."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from af1.study.plan import StudyPlan, order
from af1.study.runner import StudySummary, run_study
from af1.tasks.spec import TaskSpec

DEMO_MODELS = ("smollm2", "qwen0.5b")
GATED = {"require_found": True}  # the analyses of a subgraph run where the search found one (else recorded n/a)


def demo_plan(
    models: list[str],
    spec: TaskSpec,
    threshold: float | None = None,
    full: bool = False,
    dtype: str = "float32",
    attn: str | None = None,
    device_map: str | None = None,
) -> StudyPlan:
    """The demo's plan: a study plan like any other (`af1 demo --show-plan` prints it as YAML)."""
    experiments: dict[str, Any] = {
        "eval": {},
        "sweep": {},
        "search": {} if threshold is None else {"threshold": threshold},
        "components": dict(GATED),
        "necessity": dict(GATED),
        "alternatives": dict(GATED),
        "prune": dict(GATED),
        "heads": dict(GATED),
        "transfer": {},
    }
    if full:  # the input styles (a+b and a-b), the heads compared with two other tasks, position + meaning
        experiments.update(
            styles={**GATED, "operations": ["a+b", "a-b"]},
            heads={**GATED, "compare": ["a-b", "a+b+c"]},
            positional={},
        )
    names: list[str] = []
    entries = []
    for m in models:  # folder names from short names or paths, made unique
        name = Path(m.rstrip("/")).name.removesuffix(".gguf") or "model"
        name = name if name not in names else f"{name}-{len(names)}"
        names.append(name)
        entries.append({"spec": m, "name": name, "dtype": dtype, "attn": attn, "device_map": device_map})
    return StudyPlan.model_validate(
        {"name": "demo", "models": entries, "tasks": [spec.model_dump()], "experiments": experiments}
    )


def plan_yaml(plan: StudyPlan) -> str:
    """The plan as a YAML file a user can edit and pass to `af1 study`."""
    import yaml

    data = plan.model_dump(exclude_defaults=True)
    data["experiments"] = {
        name: options.model_dump(exclude_defaults=True)
        for name in order()
        if (options := getattr(plan.experiments, name, None)) is not None
    }
    return yaml.safe_dump(data, sort_keys=False)


def run_demo(plan: StudyPlan, out_dir: Path, say: Callable[[str], None] = print, static: bool = False) -> StudySummary:
    """Run the demo plan (resuming what is done), then say each model's verdict, the report (with `static`: its
    PNG figures only) and the time."""
    import json

    t0 = time.perf_counter()
    summary = run_study(plan, out_dir, static=static)
    report = json.loads((Path(out_dir) / "report.json").read_text())
    for line in report["verdicts"]:
        say(line)
    say(f"wrote {summary.report}")
    say(
        f"demo time: {time.perf_counter() - t0:.0f} s "
        f"({len(summary.ran)} units ran, {len(summary.skipped)} done before"
        + (f", {len(summary.by_others)} by another runner meanwhile)" if summary.by_others else ")")
    )
    return summary
