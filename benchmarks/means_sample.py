"""CAMA means from the seeded sample against means over the whole grid (issue 26): the time of each, and the
faithfulness of the same configurations on the same solved problems under each, with intervals and paired
McNemar p. The sample is meant to change the cost, not the verdicts.

    python benchmarks/means_sample.py   # SmolLM2, 2-digit a+b, calculate, 3 shots, n 300; about 10 minutes
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("AF1_NO_PROGRESS", "1")

from af1 import load_model
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.faithfulness import faithfulness
from af1.methods.setup import make_setup
from af1.stats import mcnemar_exact
from af1.tasks.evaluation import evaluated
from af1.tasks.means_sample import distribution_task
from af1.tasks.problems import problem_pool
from af1.tasks.spec import TaskSpec
from af1.tasks.task import tokenize_task

from common import write

SPEC = TaskSpec(operation="a+b", digits=2, n=300, style="calculate", shots=3)  # the command, full scoring
CONFIGS = [(5, 4), (10, 4), (15, 4), (19, 5), (20, 4), (24, 4)]


def main() -> None:
    lm = load_model("smollm2")
    done = evaluated(lm.model, lm.tokenizer, SPEC)
    task, base = done.task, done.base
    examples, pool = problem_pool(SPEC)
    setups, seconds, sizes, origins = {}, {}, {}, {}
    for name in ("sample", "whole grid"):
        t0 = time.perf_counter()
        if name == "sample":
            dist = distribution_task(SPEC, lm.tokenizer, task)
        else:
            dist = tokenize_task(SPEC, examples, pool, lm.tokenizer, like=task)
            for part in [dist, *dist.groups]:
                part.origin = "grid"
        setups[name] = make_setup(lm, SPEC, task, base, dist, cache_means=False)
        seconds[name], sizes[name], origins[name] = time.perf_counter() - t0, len(dist), dist.origin
        print(f"{name}: {sizes[name]} problems ({origins[name]}), {seconds[name]:.1f} s")
    rows = []
    for wait, transfer in CONFIGS:
        config = AF1Config(wait=wait, transfer=transfer)
        scores = {name: faithfulness(setup, config) for name, setup in setups.items()}
        rates = {name: s.rate(setups[name].kept) for name, s in scores.items()}
        a, b = (scores[n].correct_P.tolist() for n in ("sample", "whole grid"))
        low_a, high_a = rates["sample"]["ci"]
        low_b, high_b = rates["whole grid"]["ci"]
        rows.append(
            {
                "wait": wait,
                "transfer": transfer,
                "n": rates["sample"]["n"],
                "constant_guess": rates["sample"]["baseline"],
                **{f"faithfulness_{n.replace(' ', '_')}": r["value"] for n, r in rates.items()},
                **{f"faithfulness_{n.replace(' ', '_')}_ci": r["ci"] for n, r in rates.items()},
                "problems_that_differ": sum(x != y for x, y in zip(a, b, strict=True)),
                "mcnemar_p": mcnemar_exact(a, b)["p_value"],
                "each_inside_the_others_interval": low_b <= rates["sample"]["value"] <= high_b
                and low_a <= rates["whole grid"]["value"] <= high_a,
                "same_verdict_at_0.9": (rates["sample"]["value"] >= 0.9) == (rates["whole grid"]["value"] >= 0.9),
            }
        )
        print(rows[-1])
    data = {
        "n_solved": len(setups["sample"].kept),
        "means_problems": sizes,
        "means_origin": origins,
        "means_seconds": seconds,
        "whole_grid_over_sample_time": seconds["whole grid"] / seconds["sample"],
        "configs": rows,
        "all_verdicts_agree": all(r["same_verdict_at_0.9"] and r["each_inside_the_others_interval"] for r in rows),
    }
    write("means_sample", lm, task, data)


if __name__ == "__main__":
    main()
