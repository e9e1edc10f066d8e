"""The grid and the unembedding's products on this CPU as it is and restricted to AVX2 (`AVX2_ONLY`: torch, oneDNN
and MKL told to use AVX2 kernels only, the nearest this machine comes to a CPU without bfloat16 dot products; same
cores, caches and clock, so it is a stand-in, not the other machine). Each mode runs in its own process:

- the unembedding product of each bundled model's shape (256 rows) in float32, bfloat16 and int8 (`torch._int_mm`,
  the candidate for a screen where bfloat16 does not pay);
- SmolLM2's whole grid on the demo task (every answer token) in plain forwards of the same problems, with the
  screen the executor chose (`bf16_pays`).

    python benchmarks/grid_cpus.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("AF1_NO_PROGRESS", "1")

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SHAPES = {"smollm2": (576, 49152), "qwen0.5b": (896, 151936)}  # (D, V) of each bundled model's unembedding


def products(rows: int = 256) -> dict[str, dict[str, float]]:
    """Seconds of one [rows, D] x [D, V] product per dtype (best of 3)."""
    return {name: _product_times(rows, D, V) for name, (D, V) in SHAPES.items()}


def _product_times(rows: int, D: int, V: int) -> dict[str, float]:
    import torch

    from common import best_of

    x, w = torch.randn(rows, D), torch.randn(D, V)
    xb, wb = x.bfloat16(), w.bfloat16()
    xi = torch.randint(-127, 128, (rows, D), dtype=torch.int8)
    wi = torch.randint(-127, 128, (V, D), dtype=torch.int8).T  # column-major, as a screen would keep it
    times = {
        "float32": best_of(lambda: x @ w)[0],
        "bfloat16": best_of(lambda: xb @ wb, repeat=1 if _slow_bf16() else 3)[0],
        "int8": best_of(lambda: torch._int_mm(xi, wi))[0],  # pyright: ignore[reportPrivateImportUsage]
    }
    return {k: round(v, 4) for k, v in times.items()}


def _slow_bf16() -> bool:
    from af1.executors.greedy import bf16_pays

    return not bf16_pays()


def grid() -> dict[str, Any]:
    """SmolLM2's grid on the demo task (full answers) against plain forwards of its problems, in seconds."""
    import torch

    from af1 import load_model
    from af1.executors.greedy import bf16_pays
    from af1.methods import allforone
    from af1.methods.setup import make_setup
    from af1.tasks.evaluation import Scores, last_logits
    from af1.tasks.spec import TaskSpec
    from af1.tasks.task import build_task

    from common import best_of

    lm = load_model("smollm2")
    task = build_task(TaskSpec(operation="a+b", style="calculate", shots=3), lm.tokenizer)
    right = Scores([list(a) for a in task.scored_tokens], torch.ones(len(task)), torch.ones(len(task)) > 0)
    s = make_setup(lm, task.spec, task, right, task, cache_means=False)  # every problem, as if all were solved
    forward, _ = best_of(lambda: last_logits(lm.model, task.input_ids_PT, batch_size=64))
    t0 = time.perf_counter()
    allforone.sweep.sweep(s)
    seconds = time.perf_counter() - t0
    return {
        "n_problems": len(task),
        "plain_forward_s": round(forward, 2),
        "grid_s": round(seconds, 1),
        "grid_in_forwards": round(seconds / forward, 1),
        "bf16_screen_used": bf16_pays(),
    }


def one_mode() -> dict[str, Any]:
    import torch

    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "products_s": products(),
        "smollm2_grid": grid(),
    }


def main() -> None:
    if "--one" in sys.argv:
        print(json.dumps(one_mode()))
        return
    from af1.results import write_json

    from common import RESULTS, machine

    modes = {}
    for mode, env in (("native", {}), ("avx2_only", AVX2_ONLY)):
        done = subprocess.run(
            [sys.executable, __file__, "--one"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
        modes[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(mode, modes[mode])
    path = write_json(
        RESULTS / "grid_cpus.json",
        {
            "benchmark": "grid_cpus",
            "machine": machine(),
            "avx2_only_env": AVX2_ONLY,
            "task": "a+b, 1 digit, calculate, 3 shots, every answer token (97 problems, all treated as solved)",
            "modes": modes,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
