"""Progress of long work on stderr: a bar on a terminal, plain timed lines in a log (stderr not a terminal)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

LOG_EVERY_SECONDS = 60.0  # a log line at least this often while a stage runs


def enabled() -> bool:
    return not os.environ.get("AF1_NO_PROGRESS")


def progress(items: Iterable[T], desc: str | None = None, total: int | None = None) -> Iterator[T]:
    """Yield `items`, showing how far a stage named `desc` has got (nothing when `desc` is None)."""
    if not desc or not enabled():
        yield from items
        return
    if total is None and isinstance(items, Sized):
        total = len(items)
    if sys.stderr.isatty():
        from rich.progress import track

        yield from track(items, description=desc, total=total, transient=True, console=_console())
        return
    yield from _logged(items, desc, total)


def _logged(items: Iterable[T], desc: str, total: int | None) -> Iterator[T]:
    """One line when a stage starts, one at least every LOG_EVERY_SECONDS, one when it ends: counts and time."""
    of = f"/{total}" if total is not None else ""
    t0 = last = time.perf_counter()
    done = 0
    _line(f"{desc}: started ({total if total is not None else '?'} items)")
    for item in items:
        yield item
        done += 1
        now = time.perf_counter()
        if now - last >= LOG_EVERY_SECONDS:
            last = now
            _line(f"{desc}: {done}{of} after {now - t0:.0f} s")
    _line(f"{desc}: {done}{of} done in {time.perf_counter() - t0:.1f} s")


@contextmanager
def stage(name: str, timings: dict[str, float] | None = None) -> Iterator[None]:
    """Time a stage of a long job: a line on stderr when it starts and ends; its seconds into `timings`."""
    if enabled():
        _line(f"{name}: started")
    t0 = time.perf_counter()
    yield
    seconds = time.perf_counter() - t0
    if timings is not None:
        timings[name] = seconds
    if enabled():
        _line(f"{name}: done in {seconds:.1f} s")


def note(text: str) -> None:
    """One line of what a long job did (a file written), on stderr unless progress is off."""
    if enabled():
        _line(text)


def _line(text: str) -> None:
    sys.stderr.write(f"af1: {text}\n")
    sys.stderr.flush()


def _console():
    from rich.console import Console

    return Console(stderr=True)
