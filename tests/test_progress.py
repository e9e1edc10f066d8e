"""Progress in a log: plain timed lines when stderr is not a terminal; nothing when switched off."""

from __future__ import annotations

from af1 import progress


def test_progress_logs_counts_and_time_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("AF1_NO_PROGRESS", raising=False)
    assert list(progress.progress(range(3), desc="quick")) == [0, 1, 2]
    assert capsys.readouterr().err.splitlines()[0].startswith("af1: quick: 3/3 done in")  # one line: it was quick
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    assert list(progress.progress(range(3), desc="grid")) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("af1: grid: 1/3 after") and lines[0].endswith(" s left")  # with what is left
    assert lines[1].startswith("af1: grid: 2/3 after") and len(lines) == 3
    assert lines[-1].startswith("af1: grid: 3/3 done in") and lines[-1].endswith(" s")


def test_stage_records_its_time_and_logs_two_lines(capsys, monkeypatch):
    monkeypatch.delenv("AF1_NO_PROGRESS", raising=False)
    timings: dict[str, float] = {}
    with progress.stage("necessity", timings):
        pass
    assert set(timings) == {"necessity"} and timings["necessity"] >= 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "af1: necessity: started" and err[1].startswith("af1: necessity: done in")


def test_progress_off_is_silent_and_still_yields_everything(capsys, monkeypatch):
    monkeypatch.setenv("AF1_NO_PROGRESS", "1")
    assert list(progress.progress(iter([1, 2]), desc="x")) == [1, 2]
    with progress.stage("y", None):
        pass
    assert capsys.readouterr().err == ""


def test_peak_memory_is_the_blocks_own_where_linux_allows_it():
    """A block that touches 300 MB peaks at least that high; a later block that allocates nothing does not carry
    the earlier peak (the high-water mark is reset at its start)."""
    import sys

    import numpy as np

    from af1.progress import peak_memory

    with peak_memory() as big:
        block = np.ones(300 * (1 << 20) // 8)  # 300 MB, every page touched
        del block
    with peak_memory() as small:
        pass
    assert big[0].mb > 0 and small[0].mb > 0
    if sys.platform.startswith("linux"):
        assert big[0].covers == small[0].covers == "its own"
        assert big[0].mb - small[0].mb > 250
    else:
        assert small[0].covers == "the process so far"


def test_the_time_left_follows_the_work_left_where_items_weigh_differently(capsys, monkeypatch):
    """A study's units differ in cost: with weights (their estimates) the time left is the time per unit of work
    done times the work left, not the mean time per item times the items left."""
    monkeypatch.delenv("AF1_NO_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    clock = iter(range(100))
    monkeypatch.setattr(progress.time, "perf_counter", lambda: float(next(clock)))
    weights = {"small": 1.0, "large": 9.0}
    list(progress.progress(["small", "large"], desc="study", weights=(weights.__getitem__, 10.0)))
    first = capsys.readouterr().err.splitlines()[0]
    assert first == "af1: study: 1/2 after 1 s, about 9 s left"  # 1 s for 1 of 10 units of work
    clock = iter(range(100))
    list(progress.progress(["small", "large"], desc="study"))
    assert capsys.readouterr().err.splitlines()[0] == "af1: study: 1/2 after 1 s, about 1 s left"  # by count
