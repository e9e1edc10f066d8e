"""How many threads torch computes with: the cores this process may use (its CPU affinity and cgroup quota), or
`af1 --threads N` / AF1_THREADS; what was chosen and why goes into every result's provenance."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from af1.errors import Af1Error

CHOSEN: dict[str, int | str] = {}  # {"threads": n, "from": why}, once `configure` ran


def usable_cores() -> tuple[int, str]:
    """The cores this process may run on, and what limits them (affinity, or a cgroup CPU quota below it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    why = f"{cores} cores in this process's CPU affinity"
    quota = cgroup_quota()
    if quota is not None and quota < cores:
        return max(1, math.floor(quota)), f"a cgroup CPU quota of {quota:g} cores ({cores} in the affinity)"
    return cores, why


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota in cores (cgroup v2 cpu.max, else v1 cfs quota / period), None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def configure(requested: int | None = None, asked_by: str = "--threads") -> dict[str, int | str]:
    """Set torch's intra-op threads: `requested` (by `asked_by`), else AF1_THREADS, else the usable cores; returns
    what and why."""
    raw = os.environ.get("AF1_THREADS")
    if requested is not None:
        n, why = requested, asked_by
    elif raw:
        n = int(raw) if raw.strip().isdigit() else 0
        why = "AF1_THREADS"
    else:
        n, why = usable_cores()
    if n < 1:
        raise Af1Error(f"{why} must be a positive number of threads, not {raw if requested is None else requested!r}")
    torch.set_num_threads(n)
    CHOSEN.update(threads=n, **{"from": why})
    return dict(CHOSEN)


def busy_hint(samples: int = 5, every_s: float = 0.05) -> str | None:
    """A line for a machine whose cores other processes keep busy right now (in every one of a few samples of the
    kernel's runnable tasks, this process aside), where fewer threads are often faster; None otherwise."""
    n = torch.get_num_threads()
    others = []
    for i in range(samples):
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        others.append(running - 1)  # the reader itself is running
        if i + 1 < samples:
            time.sleep(every_s)
    busy = min(others)
    if n < 2 or busy < 1:
        return None
    return (
        f"{busy} other process{'es' * (busy > 1)} keep{'s' * (busy == 1)} this machine's cores busy: beside them, "
        "`af1 --threads 1 ...` (or AF1_THREADS=1) is often faster"
    )
