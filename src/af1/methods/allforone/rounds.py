"""How the search measures: cells asked for problems in rounds (one wavefront of the meter per round), each cell
stopped as soon as its part in the rule is decided (`af1.methods.allforone.search` states the rule)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Literal, Protocol

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.executors.protocol import Executor
from af1.progress import progress

Stop = Literal["reached", "cannot reach", "beaten", "all"]
STOPS: dict[str, str] = {
    "reached": "reached the threshold on the selection split (its remaining problems cannot undo it)",
    "cannot reach": "missed more selection problems than the threshold allows",
    "beaten": "missed more selection problems than the best cell so far",
    "all": "every selection problem measured",
}


@with_config(ConfigDict(extra="forbid"))
class Cell(TypedDict):
    """A cell as the search measured it on the selection split: right answers among the problems measured, and why
    measuring it stopped (`STOPS`)."""

    wait: int
    transfer: int
    right: int
    measured: int
    stopped: Stop


class Rule(Protocol):
    """What the rounds read of the search's rule (`af1.methods.allforone.search.Rule`)."""

    sel: list[int]  # the selection split's rows of the solved problems
    seed: int
    threshold: float
    pass_from: int  # right selection problems a cell needs to be chosen
    L: int

    def cells(self) -> list[tuple[int, int]]: ...


class Meter(Protocol):
    """Whether each of some solved problems is right at cells (`af1.executors.cells.Cells`, or a grid's bits): per
    ask (wait, transfer, rows), one bool per row."""

    def right(self, asks: list[tuple[int, int, list[int]]]) -> list[list[bool]]: ...

    def executors(self) -> list[tuple[Executor, str | None]]: ...


class Measure:
    """One cell on the selection split: the problems measured so far (rows of the solved problems), whether each was
    right, and why measuring it stopped (None: not yet)."""

    def __init__(self, cell: tuple[int, int]) -> None:
        self.cell = cell
        self.rows: list[int] = []
        self.right_M: list[bool] = []
        self.stopped: Stop | None = None

    @property
    def right(self) -> int:
        return sum(self.right_M)

    @property
    def misses(self) -> int:
        return len(self.right_M) - self.right

    @property
    def key(self) -> tuple[int, int, int]:
        """How the rule ranks cells: right answers, then the larger wait, then the smaller transfer."""
        return self.right, self.cell[0], -self.cell[1]

    def summary(self) -> Cell:
        w, k = self.cell
        return Cell(wait=w, transfer=k, right=self.right, measured=len(self.rows), stopped=self.stopped or "all")


class Rounds:
    """The selection split measured in rounds, each asking the meter for many cells' next problems: those most missed so
    far (seeded among equals), so a cell that cannot win stops early; the order changes no outcome, only its timing."""

    def __init__(self, rule: Rule, meter: Meter) -> None:
        self.rule, self.meter = rule, meter
        order = rule.sel.copy()
        random.Random(rule.seed).shuffle(order)
        self.place = {row: i for i, row in enumerate(order)}
        self.missed = dict.fromkeys(order, 0)
        self.measures: dict[tuple[int, int], Measure] = {}

    def of(self, cell: tuple[int, int]) -> Measure:
        if cell not in self.measures:
            self.measures[cell] = Measure(cell)
        return self.measures[cell]

    def run(self, work: list[tuple[Measure, int]]) -> None:
        """Measure `count` more problems of each (cell, count), in one call."""
        asks = []
        for m, count in work:
            done = set(m.rows)
            left = sorted((r for r in self.place if r not in done), key=lambda r: (-self.missed[r], self.place[r]))
            asks.append((*m.cell, left[: max(1, count)]))
        for (m, _), (_, _, rows), right in zip(work, asks, self.meter.right(asks), strict=True):
            m.rows += rows
            m.right_M += right
            for row, ok in zip(rows, right, strict=True):
                self.missed[row] += not ok

    def whole(self, m: Measure) -> None:
        """Every selection problem of the cell measured."""
        if len(m.rows) < len(self.place):
            self.run([(m, len(self.place) - len(m.rows))])


# the scan's first round measures this many undecided waits, from the largest, and per wait at most this many cells
# not measured yet; each round doubles both: few rounds where no cell reaches the threshold, little measured below
# the first wait that has one
WAITS_AT_ONCE = 6
FRESH_AT_ONCE = 4


def scan(rule: Rule, rounds: Rounds, frontier: bool) -> list[Measure]:
    """Per wait from the largest, its smallest transfer reaching the threshold, until the first wait that has one
    (`frontier`: every wait); each round gives cells not on course the fewest problems that could fail them."""
    n, need = len(rule.sel), rule.pass_from
    waits = sorted({w for w, _ in rule.cells()}, reverse=True)
    cells = {w: [rounds.of((w, k)) for k in range(rule.L - 1 - w)] for w in waits}
    reached: dict[int, Measure] = {}

    def open_cells(w: int) -> list[Measure]:  # undecided transfers below the smallest that has reached
        top = reached[w].cell[1] if w in reached else rule.L
        return [m for m in cells[w] if m.cell[1] < top and m.stopped is None]

    def round_by_round() -> Iterator[int]:
        for r in itertools.count():
            undecided = [w for w in waits if open_cells(w)]
            if not frontier:  # the waits above the largest one decided with a reaching cell
                top = next((w for w in waits if w in reached and not open_cells(w)), None)
                undecided = [w for w in undecided if top is None or w > top]
            if not undecided:
                return
            work = []
            for w in undecided[: WAITS_AT_ONCE << r]:
                fresh = 0
                for m in open_cells(w):
                    on_course = bool(m.rows) and m.right / len(m.rows) >= rule.threshold
                    fresh += not m.rows
                    if fresh > FRESH_AT_ONCE << r:
                        break
                    work.append((m, need - m.right if on_course else n - need - m.misses + 1))
                    if on_course:
                        break
            rounds.run(work)
            for m, _ in work:
                m.stopped = "reached" if m.right >= need else "cannot reach" if m.misses > n - need else None
                w = m.cell[0]
                if m.stopped == "reached" and (w not in reached or m.cell[1] < reached[w].cell[1]):
                    reached[w] = m
            yield len(work)

    for _ in progress(round_by_round(), "search: rounds to the threshold"):
        pass
    staircase = [reached[w] for w in waits if w in reached]
    return staircase if frontier else staircase[:1]


def best_cell(rule: Rule, rounds: Rounds) -> Measure | None:
    """The cell of most right selection problems (ties: larger wait, then smaller transfer) by branch and bound, each
    cell stopped once it misses more than the best (or as many, losing the tie); None when there are no cells."""
    n = len(rule.sel)
    cells = [rounds.of(c) for c in rule.cells()]
    if not cells:
        return None
    best = max(cells, key=lambda m: ((m.right / len(m.rows) if m.rows else 1.0), m.cell[0], -m.cell[1]))
    rounds.whole(best)
    best.stopped = "all"

    def round_by_round() -> Iterator[int]:
        nonlocal best
        while True:
            work = []
            for m in (m for m in cells if m.stopped not in ("beaten", "all")):
                if len(m.rows) == n:
                    m.stopped = "all"
                    best = m if m.key > best.key else best
                elif m.misses > best.misses or (m.misses == best.misses and m.key[1:] < best.key[1:]):
                    m.stopped = "beaten"
                else:  # the fewest problems that could beat it: a cell that wins comes back round after round
                    work.append((m, best.misses - m.misses + 1))
            if not work:
                return
            rounds.run(work)
            yield len(work)

    for _ in progress(round_by_round(), "search: rounds to the best cell"):
        pass
    return best
