"""Shared setup of the benchmarks: the bundled SmolLM2, the issue's task, timing and JSON output."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from af1 import load_model
from af1.executors.greedy import bf16_pays
from af1.results import provenance, write_json
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

RESULTS = Path(__file__).parent / "results"
# 97 problems, 1 digit, scored on the first token (the timings' task before full-answer scoring existed)
SPEC = TaskSpec(operation="a+b", style="calculate", shots=3, answer_digits="any", scoring="first")


def setup(spec: TaskSpec = SPEC):
    lm = load_model("smollm2")
    return lm, build_task(spec, lm.tokenizer)


def best_of(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Fastest wall time of `repeat` runs, and the last result (this VM's speed drifts: short timings repeat
    more)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def machine() -> dict[str, Any]:
    """What the timings depend on: the platform, cores, torch threads, the CPU's vector capability."""
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_screen_used": bf16_pays(),  # the grid's greedy screen (af1.executors.greedy) runs only where it pays
    }


def write(name: str, lm, task, data: dict[str, Any]) -> Path:
    record = {
        "benchmark": name,
        "model": lm.info.get("spec"),
        "task": task.spec.model_dump(),
        "n_problems": len(task),
        "tokens_per_prompt": task.n_positions,
        "layers": lm.adapter.n_layers,
        "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        **data,
        "provenance": provenance(lm.info),
    }
    path = write_json(RESULTS / f"{name}.json", record)
    print(f"wrote {path}")
    return path
