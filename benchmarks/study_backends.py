"""One study plan run here and on a local Ray cluster, side by side: wall time, identical results, rerun cost."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("AF1_NO_PROGRESS", "1")

from af1.methods.setup import prepare
from af1.study import load_plan, run_study
from af1.study.store import Store

from common import setup, write

PLAN = Path(__file__).parent.parent / "examples" / "smollm2_study.yaml"


def main() -> None:
    plan = load_plan(PLAN)
    lm, task = setup(plan.tasks[0])
    for spec in plan.task_specs():  # position means cached before timing, so both runs start equal
        prepare(lm, spec)
    with tempfile.TemporaryDirectory() as tmp:
        here, on_ray = Path(tmp) / "local", Path(tmp) / "ray"
        t0 = time.perf_counter()
        local = run_study(plan, here)
        local_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray = run_study(plan, on_ray, ray=True, ray_init={"num_cpus": 2})
        ray_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = run_study(plan, here)
        rerun_s = time.perf_counter() - t0
        identical = Store(here).results() == Store(on_ray).results()
    assert not local.failed and not ray.failed and not again.ran
    data = {
        "plan": str(PLAN.relative_to(PLAN.parent.parent)),
        "units": len(local.units),
        "local_seconds": local_s,
        "ray_seconds": ray_s,
        "ray_over_local": ray_s / local_s,
        "rerun_all_done_seconds": rerun_s,
        "identical_results": identical,
    }
    print(json.dumps(data, indent=2))
    write("study_backends", lm, task, data)


if __name__ == "__main__":
    main()
