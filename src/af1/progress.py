"""Progress bars for long work, on stderr, only where a person watches (a terminal)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sized
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("AF1_NO_PROGRESS")


def progress(items: Iterable[T], desc: str | None = None, total: int | None = None) -> Iterator[T]:
    if not desc or not enabled():
        yield from items
        return
    from rich.progress import track

    if total is None and isinstance(items, Sized):
        total = len(items)
    yield from track(items, description=desc, total=total, transient=True, console=_console())


def _console():
    from rich.console import Console

    return Console(stderr=True)
