"""The Python API in one page: base accuracy, one AF1 configuration and the search.

    python examples/api_quickstart.py [--model smollm2] [--n 40]

Every rate comes with its n, exact 95 % interval and constant-guess baseline; the search chooses on half of the
solved problems, measuring only what its rule needs, and judges its cell on the other half. The tests run
`quickstart` on SmolLM2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import af1.api as af1


def quickstart(lm: af1.LoadedModel, n: int = 40) -> dict[str, Any]:
    """Measure 1-digit a+b (calculate style, 3 shots) on a loaded model and return the numbers."""
    task = af1.TaskSpec(operation="a+b", style="calculate", shots=3, n=n)
    held = af1.session(lm)  # the task is evaluated once and its CAMA means made once, for every run below
    base = af1.run("eval", held, task)  # base accuracy with n, interval, constant guess, every problem
    L = lm.adapter.n_layers
    run = af1.run("run", held, task, wait=L // 2, transfer=2)  # CAMA at block L/2, the last token peeks in two more
    found = af1.run("search", held, task, threshold=0.9)  # stops every cell once its part in the rule is decided
    judged = found.judged
    return {
        "base_accuracy": [base.base_accuracy["value"], base.base_accuracy["ci"]],
        "base_accuracy_baseline": base.base_accuracy["baseline"],
        "n": base.n,
        "n_solved": base.n_solved,
        "config": [run.config.wait, run.config.transfer],
        "stages": run.stages,
        "faithfulness": [run.faithfulness["value"], run.faithfulness["ci"]],
        "faithfulness_baseline": run.faithfulness["baseline"],
        "executor": run.executor,
        "first_problem_input": base.problems[0]["input"],
        "search": {
            "chosen": found.chosen,
            "found": found.found,
            "cell": found.cell(),
            "confirmation": judged["confirmation"] if judged else None,
            "problem_cells": [found.problem_cells, found.problem_cells_grid],  # measured, and the whole grid's
        },
        "claim": found.claim,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="The af1 Python API in one page, on a bundled or local model.")
    parser.add_argument("--model", default="smollm2", help="a bundled short name, a directory or a .gguf file")
    parser.add_argument("--n", type=int, default=40, help="problems to sample")
    args = parser.parse_args()
    print(json.dumps(quickstart(af1.load_model(args.model), n=args.n), indent=1))


if __name__ == "__main__":
    main()
