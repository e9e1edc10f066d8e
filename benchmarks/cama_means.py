"""Position means: time and peak memory vs the number of problems (each size in a fresh process)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("AF1_NO_PROGRESS", "1")

from common import SPEC

SIZES = [100, 200, 400, 700]
SPEC_ABC = SPEC.model_copy(update={"operation": "a+b+c", "answer_digits": "constant"})  # 777 problems


def one(n: int) -> None:
    from af1.interventions.means import compute_means

    from common import setup

    lm, task = setup(SPEC_ABC.model_copy(update={"n": n}))
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    compute_means(lm.adapter, task, batch_size=32)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"n": n, "seconds": seconds, "peak_rss_mb": peak / 1024, "rss_before_mb": base_rss / 1024}))


def main() -> None:
    if len(sys.argv) > 1:
        one(int(sys.argv[1]))
        return
    rows = []
    for n in SIZES:
        out = subprocess.run([sys.executable, __file__, str(n)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1])
    from common import setup, write

    lm, task = setup(SPEC_ABC.model_copy(update={"n": SIZES[-1]}))
    per_problem = [r["seconds"] / r["n"] for r in rows]
    data = {
        "rows": rows,
        "seconds_per_problem": per_problem,
        "time_linear_ratio": per_problem[-1] / per_problem[0],
        "memory_growth_mb": rows[-1]["peak_rss_mb"] - rows[0]["peak_rss_mb"],
    }
    write("cama_means", lm, task, data)


if __name__ == "__main__":
    main()
