"""Registering hooks for the duration of a block: the one place that removes them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from torch.utils.hooks import RemovableHandle


@contextlib.contextmanager
def hooks_removed_after(handles: Iterable[RemovableHandle]) -> Iterator[None]:
    """Keep the given hooks for the block, remove them afterwards (also on error)."""
    handles = list(handles)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
