"""Progress of long work on stderr: a bar on a terminal, plain timed lines in a log (stderr not a terminal); and its
memory: the peak RSS of a stretch of work, freed heap pages given back."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

LOG_EVERY_SECONDS = 20.0  # a log line at least this often while a stage runs
QUIET_SECONDS = 2.0  # a stage shorter than this logs one line, when it ends


def enabled() -> bool:
    return not os.environ.get("AF1_NO_PROGRESS")


Weights = tuple[Callable[[Any], float], float]  # an item's expected work, and all the items' together


def progress(
    items: Iterable[T], desc: str | None = None, total: int | None = None, weights: Weights | None = None
) -> Iterator[T]:
    """Yield `items`, showing how far a stage named `desc` has got (nothing when `desc` is None); with `weights` the
    time left follows the work left (items of unequal cost), not the count."""
    if not desc or not enabled():
        yield from items
        return
    if total is None and isinstance(items, Sized):
        total = len(items)
    if sys.stderr.isatty():
        from rich.progress import track

        yield from track(items, description=desc, total=total, transient=True, console=_console())
        return
    yield from _logged(items, desc, total, weights)


def _logged(items: Iterable[T], desc: str, total: int | None, weights: Weights | None = None) -> Iterator[T]:
    """A stage in a log: one line when it ends (count and time); a longer one also says how far it has got and about
    how long is left, once after QUIET_SECONDS and then at least every LOG_EVERY_SECONDS."""
    of = f"/{total}" if total is not None else ""
    t0 = time.perf_counter()
    last = None
    done = 0
    work = 0.0  # the expected work of the items done
    for item in items:
        yield item
        done += 1
        work += weights[0](item) if weights else 0.0
        now = time.perf_counter()
        if now - t0 >= QUIET_SECONDS and (last is None or now - last >= LOG_EVERY_SECONDS) and done != total:
            last = now
            if weights and work > 0:
                left = f", about {(now - t0) / work * max(weights[1] - work, 0):.0f} s left"
            else:
                left = f", about {(now - t0) / done * (total - done):.0f} s left" if total is not None else ""
            _line(f"{desc}: {done}{of} after {now - t0:.0f} s{left}")
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


@dataclass(frozen=True)
class PeakMemory:
    """The peak resident memory of a stretch of work, in MB, and what it covers: "its own" where Linux lets the
    high-water mark be reset at its start, else "the process so far" (units sharing a process share it)."""

    mb: float
    covers: str


@contextmanager
def peak_memory() -> Iterator[list[PeakMemory]]:
    """Measure the peak RSS of the work inside: yields a list that holds one `PeakMemory` once the block ends."""
    own = _reset_high_water_mark()
    out: list[PeakMemory] = []
    try:
        yield out
    finally:
        hwm = _high_water_mark_mb() if own else None
        out.append(PeakMemory(hwm, "its own") if hwm is not None else PeakMemory(max_rss_mb(), "the process so far"))


def _reset_high_water_mark() -> bool:
    """Linux: writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS (since 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _high_water_mark_mb() is not None


def _high_water_mark_mb() -> float | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def max_rss_mb() -> float:
    """This process's peak RSS so far (Linux reports KB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def return_freed_memory() -> None:
    """Give the heap's freed pages back to the OS: glibc keeps them, and batches of large logits grow the RSS with n
    (3,000 problems on the tiny model: 4.2 GB; 1.1 GB when this runs every 4 batches)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), "malloc_trim", None)
    except OSError:  # not glibc (musl has no malloc_trim)
        return None
