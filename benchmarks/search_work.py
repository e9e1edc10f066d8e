"""The search's work beside the whole grid's, in plain forwards, measured side by side in one process per model.

    python benchmarks/search_work.py [--models smollm2 qwen0.5b] [--n smollm2=150 qwen0.5b=40]

On the demo's task (2-digit a+b, calculate, one shot, its seed) with fewer problems (the grid on every solved
problem is what the search avoids: on the demo's 350 it would take Qwen about an hour here), each model: one plain
forward of the solved problems' prompts (the unit of work), the search (`af1.methods.allforone.search.search`)
at the demo's threshold with a half/half split, and the whole grid (`af1 sweep`) with the rule read off it, which
must decide alike. Writes benchmarks/results/search_work.json.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("AF1_NO_PROGRESS", "1")

from af1 import load_model
from af1.experiments.sweep import same_verdict
from af1.interventions.af1 import AF1Config
from af1.methods import allforone
from af1.methods.setup import prepare
from af1.results import write_json
from af1.study.demo import DEMO_TASK
from af1.tasks.evaluation import last_logits

from common import RESULTS, best_of, machine

SELECTION, THRESHOLD = 0.5, 0.9


def measure(name: str, n: int) -> dict:
    lm = load_model(name)
    spec = DEMO_TASK.model_copy(update={"n": n})
    setup = prepare(lm, spec)
    ids_PT = setup.kept.input_ids_PT
    t_forward, _ = best_of(lambda: last_logits(lm.model, ids_PT, batch_size=64))
    options = {"threshold": THRESHOLD, "selection": SELECTION, "seed": 0}
    t0 = time.perf_counter()
    found = allforone.search.search(setup, AF1Config(), **options)
    t_search = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = allforone.sweep.sweep(setup, AF1Config())
    t_grid = time.perf_counter() - t0
    on_grid = allforone.search.on_grid(grid, n_layers=lm.adapter.n_layers, **options)
    return {
        "model": name,
        "task": spec.model_dump(),
        "n_solved": len(setup.kept),
        "plain_forward_s": round(t_forward, 3),
        "search": {
            "seconds": round(t_search, 1),
            "plain_forwards": round(t_search / t_forward, 1),
            "problem_cells": found.problem_cells,
            "outcome": found.claim["outcome"] if found.claim else None,
            "cell": found.cell(),
            "chosen": found.chosen,
        },
        "grid": {
            "seconds": round(t_grid, 1),
            "plain_forwards": round(t_grid / t_forward, 1),
            "problem_cells": on_grid.problem_cells,
        },
        "grid_over_search_time": round(t_grid / t_search, 2),
        "grid_over_search_problem_cells": round(on_grid.problem_cells / found.problem_cells, 2),
        "same_verdict": same_verdict(on_grid, found),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen0.5b"])
    parser.add_argument("--n", nargs="+", default=["smollm2=150", "qwen0.5b=40"], help="problems per model")
    args = parser.parse_args()
    ns = {k: int(v) for k, v in (item.split("=") for item in args.n)}
    rows = []
    for name in args.models:
        rows.append(measure(name, ns.get(name, 40)))
        print(rows[-1])
    path = write_json(
        RESULTS / "search_work.json",
        {
            "benchmark": "search_work",
            "machine": machine(),
            "selection": SELECTION,
            "threshold": THRESHOLD,
            "models": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
