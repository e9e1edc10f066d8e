"""How long af1's commands take to answer `--help`, and what registering af1's attention kernels on the first plan
(not at import) saves each of them: the import of an experiment's module with and without that registration, side by
side in one run. Each time is a fresh process, the best of `REPEAT`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from af1.results import write_json

from common import RESULTS, machine

AF1 = str(Path(sys.executable).parent / "af1")
REPEAT = 5
IMPORT = "import af1.experiments.run"
REGISTERED = IMPORT + "; from af1.interventions.attention import _register_kernels; _register_kernels()"


def best(command: list[str]) -> float:
    fastest = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        fastest = min(fastest, time.perf_counter() - t0)
    return fastest


def main() -> None:
    helps = {
        " ".join(["af1", *args]): best([AF1, *args]) for args in (["--help"], ["run", "--help"], ["heads", "--help"])
    }
    imported = best([sys.executable, "-c", IMPORT])
    registered = best([sys.executable, "-c", REGISTERED])
    record = {
        "benchmark": "startup",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "repeat": REPEAT,
        "help_seconds": helps,
        "import_seconds": imported,
        "import_and_register_kernels_seconds": registered,
        "registration_saved_seconds": registered - imported,
    }
    print(record)
    print(f"wrote {write_json(RESULTS / 'startup.json', record)}")


if __name__ == "__main__":
    main()
