"""The search: on a selection split of the solved problems, the largest L_wait then smallest L_transfer that reaches the
threshold (with a compute stage, clearing the constant guess; else the best, never confirmed), judged on the other."""

from __future__ import annotations

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import CONFIRMED, NOT_CONFIRMED, About, Claim, capped, n_to_decide_rate, rate_above
from af1.errors import Af1Error
from af1.executors.cells import Cells
from af1.executors.protocol import recorded
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.rounds import Cell, Meter, Rounds, best_cell, scan
from af1.methods.allforone.sweep import GridCells, unbits
from af1.methods.setup import Setup
from af1.results import Part
from af1.stats import LayoutRate, Rate, exact_interval, rate, split_indices


def confirmation(setup: Setup, selection: float, seed: int) -> Setup:
    """The setup on the confirmation side of a search's split (`selection`, `seed`): where its config's later analyses
    are measured, so nothing is scored on the problems that chose it."""
    _, conf = split_indices(len(setup.kept), selection, seed)
    return setup.on(conf)


def has_compute_stage(wait: int, transfer: int, n_layers: int) -> bool:
    """A cell whose transfer window (or wait) reaches the last layer leaves the last token nothing to compute."""
    return wait + transfer < n_layers - 1


@with_config(ConfigDict(extra="forbid"))
class Judged(TypedDict):
    """The cell the claim is about, measured on every problem of both splits: whether it may be chosen at all (a
    compute stage, a selection interval above the constant guess), and its rates."""

    wait: int
    transfer: int
    eligible: bool
    selection: Rate
    confirmation: Rate


class Found(Part):
    """The search's answer: whether a cell reached the threshold on selection (`chosen`: later analyses run there), the
    judged cell (chosen, else best) with both splits' rates, its claim on confirmation, the frontier and all cells."""

    threshold: float
    selection_fraction: float
    split_seed: int
    n_selection: int
    n_confirmation: int
    chosen: bool  # a cell reached the threshold on the selection split
    found: bool  # the claim confirmed on the confirmation split
    claim: Claim | None  # None: no cell has a compute stage
    judged: Judged | None
    stages: dict[str, list[int]] | None = None  # the chosen cell's wait, transfer and compute blocks
    frontier: list[Cell]  # per L_wait measured (descending), its smallest L_transfer reaching the threshold
    measured: list[Cell]  # every cell measured on the selection split, in the order measured
    exhaustive: bool  # every cell measured on every problem (`on_grid`), or only what the rule needs (`search`)
    problem_cells: int  # (problem, cell) pairs measured, both splits
    problem_cells_grid: int  # those of the whole grid, (L_wait, L_transfer) with L_wait >= -1, on every problem
    executor: str
    fallback_reason: str | None = None

    def cell(self) -> tuple[int, int] | None:
        """The judged cell's (L_wait, L_transfer); None where no cell has a compute stage."""
        return None if self.judged is None else (self.judged["wait"], self.judged["transfer"])

    def marked(self) -> Judged | None:
        """The cell later analyses run at: the chosen one, or where none reached the threshold the best eligible."""
        judged = self.judged
        return judged if judged is not None and (self.chosen or judged["eligible"]) else None

    def config_at(self, base: AF1Config) -> AF1Config | None:
        """`base` at the marked cell; None where no cell is eligible."""
        cell = self.marked()
        return None if cell is None else base.model_copy(update={"wait": cell["wait"], "transfer": cell["transfer"]})


def subgraph_claim(
    correct_conf: list[bool], cell: tuple[int, int], threshold: float, chosen: bool, baseline: float
) -> Claim:
    """'An AF1 subgraph at faithfulness >= threshold' at the cell, by one-sided exact binomial tests on the confirmation
    split; never confirmed when not `chosen` (the best eligible) or its interval does not clear the constant guess."""
    w, k = cell
    claim = rate_above(
        About(
            "af1_subgraph",
            f"an AF1 subgraph at faithfulness >= {threshold} (L_wait {w}, L_transfer {k})",
            f"the confirmation split ({len(correct_conf)} solved problems that did not choose the cell)",
            baseline=baseline,
        ),
        correct_conf,
        threshold,
    )
    low, value = claim["ci"][0], claim["estimate"]
    towards = value is not None and value > threshold  # only a confirmation could decide it
    if low is None or low <= baseline:  # a threshold a constant guess could reach says nothing
        claim = capped(claim, NOT_CONFIRMED, "never confirmed where its interval does not clear the constant guess")
        if towards and value is not None:  # the n at which it would clear both the threshold and the guess
            needed = [
                n_to_decide_rate(value, threshold),
                n_to_decide_rate(value, baseline) if value > baseline else None,
            ]
            claim["n_to_decide"] = None if None in needed else max(n for n in needed if n is not None)
    if chosen:
        return claim
    claim = capped(claim, NOT_CONFIRMED, "never confirmed where no cell reached the threshold on the selection split")
    if towards:  # no n confirms it, and no n rejects it at this estimate
        claim["n_to_decide"] = None
    return claim


class Rule:
    """The search's rule on one split: what a cell's count of right selection problems must reach, and the rates and
    claim of the judged cell."""

    def __init__(
        self,
        targets: list[str],
        layouts: list[int] | None,
        n_layers: int,
        threshold: float,
        selection: float,
        seed: int,
        split: tuple[list[int], list[int]] | None = None,
    ) -> None:
        """`split`: the (selection, confirmation) rows when not the seeded split of every row (a group's rows)."""
        if not (0 <= threshold <= 1 and 0 < selection < 1):  # search's Options refuse these first, by name
            raise Af1Error(f"threshold {threshold} must be in [0, 1] and selection {selection} in (0, 1)")
        self.targets, self.layouts, self.L = targets, layouts or [0] * len(targets), n_layers
        self.threshold, self.selection, self.seed = threshold, selection, seed
        self.sel, self.conf = split or split_indices(len(targets), selection, seed)
        n = len(self.sel)
        if not n or not self.conf:
            raise Af1Error(f"{len(self.sel) + len(self.conf)} solved problems split at {selection} leave a side empty")
        self.baseline = self.rate([True] * n, self.sel)["baseline"]
        self.eligible_from = next((c for c in range(n + 1) if exact_interval(c, n)[0] > self.baseline), n + 1)
        reaching = next((c for c in range(n + 1) if c / n >= threshold), n + 1)
        self.pass_from = max(reaching, self.eligible_from)  # right selection problems a cell needs to be chosen

    def cells(self) -> list[tuple[int, int]]:
        """The cells that may be judged (a compute stage), in the order the rule reads them: the largest wait first,
        then the smallest transfer."""
        return [(w, k) for w in range(self.L - 2, -2, -1) for k in range(self.L - 1 - w)]

    def rate(self, right_R: list[bool], rows: list[int]) -> Rate:
        """The rate of `right_R` (one per row of `rows`), its baseline a constant guess per token layout."""
        return rate(right_R, [self.targets[i] for i in rows], [self.layouts[i] for i in rows])

    def judged(self, cell: tuple[int, int], right_sel: list[bool], right_conf: list[bool]) -> Judged:
        selection, confirmation = self.rate(right_sel, self.sel), self.rate(right_conf, self.conf)
        if len(set(self.layouts)) > 1:
            confirmation["by_layout"] = self.by_layout(right_conf)
        eligible = selection["k"] >= self.eligible_from
        return Judged(wait=cell[0], transfer=cell[1], eligible=eligible, selection=selection, confirmation=confirmation)

    def by_layout(self, right_conf: list[bool]) -> list[LayoutRate]:
        """The confirmation rate's parts: each token layout's confirmation problems."""
        out = []
        for g in sorted(set(self.layouts)):
            idx = [j for j, i in enumerate(self.conf) if self.layouts[i] == g]
            if idx:  # the split put some of this layout's problems on the confirmation side
                r = rate([right_conf[j] for j in idx], [self.targets[self.conf[j]] for j in idx])
                out.append(LayoutRate(layout=g, value=r["value"], n=r["n"], ci=r["ci"], baseline=r["baseline"]))
        return out

    def found(
        self,
        judged: Judged | None,
        right_conf: list[bool],
        chosen: bool,
        base: AF1Config,
        **fields: object,
    ) -> Found:
        claim, stages = None, None
        if judged is not None:
            cell = (judged["wait"], judged["transfer"])
            base_conf = judged["confirmation"]["baseline"]
            claim = subgraph_claim(right_conf, cell, self.threshold, chosen, base_conf)
            if chosen:
                stages = base.model_copy(update={"wait": cell[0], "transfer": cell[1]}).stages(self.L)
        return Found(
            threshold=self.threshold,
            selection_fraction=self.selection,
            split_seed=self.seed,
            n_selection=len(self.sel),
            n_confirmation=len(self.conf),
            chosen=chosen,
            found=claim is not None and claim["outcome"] == CONFIRMED,
            claim=claim,
            judged=judged,
            stages=stages,
            problem_cells_grid=(len(self.sel) + len(self.conf)) * sum(self.L - w for w in range(-1, self.L)),
            **fields,  # type: ignore[arg-type]  # the measured fields, named as Found declares them
        )


def search(
    setup: Setup,
    base: AF1Config,
    *,
    threshold: float,
    selection: float,
    seed: int,
    frontier: bool = False,
    reference: bool = False,
) -> Found:
    """The rule (this module's docstring) on a setup's solved problems, measuring what it needs (`decide`)."""
    layouts = setup.kept.layout_P.tolist() if setup.kept.groups else None
    rule = Rule(setup.kept.targets(), layouts, setup.adapter.n_layers, threshold, selection, seed)
    return decide(rule, Cells(setup.kept, setup.steps, base, reference), base, frontier)


def decide(rule: Rule, meter: Meter, base: AF1Config, frontier: bool = False) -> Found:
    """On selection, wait by wait from the largest, the first transfer reaching the threshold, each cell stopped once
    decided (`frontier`: every lower wait's too); else the best by branch and bound. Confirmation: judged cell only."""
    rounds = Rounds(rule, meter)
    staircase = scan(rule, rounds, frontier) if rule.pass_from <= len(rule.sel) else []
    frontier_cells = [m.summary() for m in staircase]  # as the rule left them, before the chosen one is completed
    judged, right_conf = None, []
    best = staircase[0] if staircase else best_cell(rule, rounds)
    if best is not None:
        rounds.whole(best)  # the judged cell's selection rate, whole
        right_conf = meter.right([(*best.cell, rule.conf)])[0]
        by_row = dict(zip(best.rows, best.right_M, strict=True))
        judged = rule.judged(best.cell, [by_row[i] for i in rule.sel], right_conf)
    measures = rounds.measures.values()
    return rule.found(
        judged,
        right_conf,
        bool(staircase),
        base,
        frontier=frontier_cells,
        measured=[m.summary() for m in measures if m.rows],
        exhaustive=False,
        problem_cells=sum(len(m.rows) for m in measures) + len(right_conf),
        **recorded(meter.executors()),
    )


def on_grid(
    grid: GridCells,
    *,
    n_layers: int,
    threshold: float,
    selection: float,
    seed: int,
    split: tuple[list[int], list[int]] | None = None,
) -> Found:
    """The rule read off a complete grid (`af1 sweep`; `split`: a group's rows): the same choice, judged cell and claim
    as `search`, which the tests check."""
    rule = Rule(grid.targets, grid.kept_layouts, n_layers, threshold, selection, seed, split)
    bits = {
        cell: unbits(grid.cells[f"{cell[0]},{cell[1]}"])
        for cell in rule.cells()
        if f"{cell[0]},{cell[1]}" in grid.cells
    }
    if len(bits) < len(rule.cells()):
        raise Af1Error("the search's rule reads every cell with a compute stage: this grid was capped (max_transfer)")
    right = {cell: sum(b[i] for i in rule.sel) for cell, b in bits.items()}
    passing = [cell for cell in rule.cells() if right[cell] >= rule.pass_from]
    staircase = [
        min((c for c in passing if c[0] == w), key=lambda c: c[1])
        for w in sorted({w for w, _ in passing}, reverse=True)
    ]
    n = len(rule.sel)
    summaries = [Cell(wait=w, transfer=k, right=right[w, k], measured=n, stopped="all") for w, k in rule.cells()]
    at = staircase[0] if staircase else max(rule.cells(), key=lambda c: (right[c], c[0], -c[1]), default=None)
    judged, right_conf = None, []
    if at is not None:
        right_conf = [bits[at][i] for i in rule.conf]
        judged = rule.judged(at, [bits[at][i] for i in rule.sel], right_conf)
    return rule.found(
        judged,
        right_conf,
        bool(staircase),
        AF1Config(**grid.config) if grid.config else AF1Config(),
        frontier=[Cell(wait=w, transfer=k, right=right[w, k], measured=n, stopped="all") for w, k in staircase],
        measured=summaries,
        exhaustive=True,
        problem_cells=(len(rule.sel) + len(rule.conf)) * len(grid.cells),
        executor="grid",
    )
