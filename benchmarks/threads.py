"""`af1 eval` on SmolLM2 alone and beside a second busy process, with af1's default threads against one thread.

The second process is another torch job with its own default threads (a colleague's run on a shared machine).
Each wall time is a whole command as a user types it (start, model load from af1's cache, evaluation), the best of
`REPEAT`; the ratios compare timings taken in this one run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from af1.results import write_json
from af1.threads import usable_cores

from common import RESULTS, machine

AF1 = str(Path(sys.executable).parent / "af1")
EVAL = ["eval", "--model", "smollm2", "--task", "a+b", "--digits", "2", "--n", "300", "--json"]
REPEAT = 2
BUSY = "import torch\nx = torch.randn(1024, 1024)\nwhile True:\n    x = (x @ x).tanh()\n"


def timed(threads: list[str]) -> tuple[float, int]:
    best, used = float("inf"), 0
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        done = subprocess.run([AF1, *threads, *EVAL], capture_output=True, text=True, check=True)
        best = min(best, time.perf_counter() - t0)
        used = json.loads(done.stdout)["provenance"]["threads"]["threads"]
    return best, used


def main() -> None:
    rows = []
    for beside in (False, True):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if beside else None
        try:
            time.sleep(2 if beside else 0)
            for label, flag in (("default", []), ("one thread", ["--threads", "1"])):
                seconds, used = timed(flag)
                rows.append({"beside_a_busy_process": beside, "threads": label, "used": used, "seconds": seconds})
                print(rows[-1])
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    by = {(r["beside_a_busy_process"], r["threads"]): r["seconds"] for r in rows}
    record = {
        "benchmark": "threads",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "af1_command": " ".join(["af1", *EVAL]),
        "machine": machine(),
        "usable_cores": usable_cores(),
        "repeat": REPEAT,
        "rows": rows,
        "alone_one_thread_over_default": by[False, "one thread"] / by[False, "default"],
        "beside_one_thread_over_default": by[True, "one thread"] / by[True, "default"],
    }
    print(f"wrote {write_json(RESULTS / 'threads.json', record)}")


if __name__ == "__main__":
    main()
