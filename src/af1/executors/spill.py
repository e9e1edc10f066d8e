"""Where large per-layer state tables live: in memory up to a budget (AF1_MEMORY_GB, default 2), past it in
files mapped from disk, so a long task's clean states do not grow the process without bound."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch

from af1.errors import Af1Error
from af1.models.cache import cache_root

DEFAULT_MEMORY_GB = 2.0


def memory_budget_bytes() -> int:
    """The bytes one table may hold in memory: AF1_MEMORY_GB (a positive number of GiB), else 2 GiB."""
    raw = os.environ.get("AF1_MEMORY_GB")
    try:
        gb = float(raw) if raw else DEFAULT_MEMORY_GB
    except ValueError:
        gb = math.nan
    if not gb > 0:
        raise Af1Error(f"AF1_MEMORY_GB must be a positive number of GiB, not {raw!r}")
    return int(gb * 2**30)


def layer_tables(n_layers: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[list[torch.Tensor], str]:
    """`n_layers` empty tensors of `shape` and where they live ("memory" or "disk"): in memory within the budget, else
    each backed by an unlinked file under the cache's spill folder."""
    numel = math.prod(shape)
    nbytes = n_layers * numel * torch.empty((), dtype=dtype).element_size()
    if nbytes <= memory_budget_bytes():
        return [torch.empty(shape, dtype=dtype) for _ in range(n_layers)], "memory"
    folder = cache_root() / "spill"
    folder.mkdir(parents=True, exist_ok=True)
    tables = []
    for _ in range(n_layers):
        fd, name = tempfile.mkstemp(dir=folder, suffix=".bin")
        os.close(fd)
        try:
            tables.append(torch.from_file(name, shared=True, size=numel, dtype=dtype).view(shape))
        finally:
            Path(name).unlink(missing_ok=True)
    return tables, "disk"
