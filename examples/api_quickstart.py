"""The Python API in one page: base accuracy, one AF1 configuration, a small grid and the search.

    python examples/api_quickstart.py [--model smollm2] [--n 40]

Every rate comes with its n, 95 % Wilson interval and constant-guess baseline; the search chooses on
half of the solved problems and reports the other half. The tests run `quickstart` on SmolLM2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import af1
from af1 import experiments
from af1.allforone import AF1Config
from af1.tasks import TaskSpec


def quickstart(lm: af1.LoadedModel, n: int = 40, max_transfer: int = 2) -> dict[str, Any]:
    """Measure 1-digit a+b (calculate style, 3 shots) on a loaded model and return the numbers."""
    spec = TaskSpec(operation="a+b", style="calculate", shots=3, n=n)
    setup = experiments.prepare(lm, spec)  # base scores, solved problems, CAMA means per answer step
    described = setup.describe()  # base_accuracy, base_accuracy_ci, base_accuracy_baseline, n, n_solved, ...
    L = setup.adapter.n_layers
    config = AF1Config(wait=L // 2, transfer=2)  # CAMA at block L/2, the last token peeks in the next two
    run = experiments.run_result(setup, config)  # faithfulness with its CI and baseline, every problem's row
    grid = experiments.sweep(setup, max_transfer=max_transfer)  # every (wait, transfer <= max_transfer) cell
    found = experiments.search(grid, threshold=0.9)  # chosen on a seeded half, confirmed on the other
    return {
        "base_accuracy": [described["base_accuracy"], described["base_accuracy_ci"]],
        "base_accuracy_baseline": described["base_accuracy_baseline"],
        "n": described["n"],
        "n_solved": described["n_solved"],
        "config": [config.wait, config.transfer],
        "stages": config.stages(L),
        "faithfulness": [run["faithfulness"], run["faithfulness_ci"]],
        "faithfulness_baseline": run["faithfulness_baseline"],
        "executor": run["executor"],
        "first_problem_input": run["problems"][0]["input"],
        "search": {k: found[k] for k in ("found", "wait", "transfer", "faithfulness", "faithfulness_ci")},
        "best_eligible_cell": found.get("best"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="The af1 Python API in one page, on a bundled or local model.")
    parser.add_argument("--model", default="smollm2", help="a bundled short name, a directory or a .gguf file")
    parser.add_argument("--n", type=int, default=40, help="problems to sample")
    args = parser.parse_args()
    print(json.dumps(quickstart(af1.load_model(args.model), n=args.n), indent=1))


if __name__ == "__main__":
    main()
