"""The search: the AF1 cell chosen on a selection split of the solved problems, its claim decided on the other."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import CONFIRMED, NOT_CONFIRMED, Claim, capped, n_to_decide_rate, rate_reaches
from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.sweep import GridCells, unbits
from af1.methods.setup import Setup
from af1.results import Part
from af1.stats import LayoutRate, Rate, baseline_warning, rate, split_indices


def confirmation(setup: Setup, selection: float, seed: int) -> Setup:
    """The setup restricted to the problems a search did not choose on (the confirmation side of its split of
    `selection`, `seed`): where its config's later analyses are measured, so that nothing is scored on the problems
    that chose it."""
    _, conf = split_indices(len(setup.kept), selection, seed)
    return setup.on(conf)


def has_compute_stage(wait: int, transfer: int, n_layers: int) -> bool:
    """A cell whose transfer window (or wait) reaches the last layer leaves the last token nothing to compute."""
    return wait + transfer < n_layers - 1


@with_config(ConfigDict(extra="forbid"))
class Cell(TypedDict):
    """One (L_wait, L_transfer) cell as the search measures it: faithfulness on the confirmation split (with its
    interval), on the selection split that chose, and whether it may be chosen at all."""

    wait: int
    transfer: int
    faithfulness: float
    faithfulness_ci: list[float]
    faithfulness_selection: float
    faithfulness_selection_ci: list[float]
    eligible: bool
    faithfulness_by_layout: NotRequired[list[LayoutRate]]


class Found(Part):
    """The search's answer (`search`): the chosen cell (None where no cell passes) with its confirmation
    faithfulness, interval and constant guess, its selection faithfulness, the split, the frontier, the best
    eligible cell, and the claim 'an AF1 subgraph at the threshold' decided on the confirmation split."""

    threshold: float
    chosen: bool = False  # a cell reached the threshold on the selection split (the cell later analyses run at)
    found: bool  # the claim confirmed on the confirmation split
    claim: Claim | None = None  # None: no cell is eligible
    selection_fraction: float = 0.5
    split_seed: int = 0
    n_selection: int | None = None
    n_confirmation: int | None = None
    faithfulness_baseline_selection: float | None = None
    faithfulness_baseline: float | None = None
    wait: int | None = None
    transfer: int | None = None
    faithfulness: float | None = None
    faithfulness_ci: list[float] | None = None
    faithfulness_selection: float | None = None
    faithfulness_selection_ci: list[float] | None = None
    frontier: list[Cell] = []  # per L_wait (ascending), the smallest L_transfer reaching the threshold (selection)
    n_ineligible_no_compute: int = 0  # cells above the threshold that leave no layer to compute in
    stages: dict[str, list[int]] | None = None
    best: Cell | None = None
    best_measured: Cell | None = None  # where no cell is eligible: the best one with a compute stage, judged
    faithfulness_by_layout: list[LayoutRate] | None = None  # a task of several token layouts: each one's part
    grid_cells: int = 0  # cells measured, of the grid's grid_cells_possible ((L_wait, L_transfer), L_wait >= -1)
    grid_cells_possible: int = 0
    max_transfer_measured: int = 0  # below n_layers: the sweep was capped (max_transfer)

    def marked(self) -> Cell | None:
        """The chosen cell (the frontier's largest L_wait), or where none reached the threshold the best eligible."""
        return self.frontier[-1] if self.chosen else self.best

    def judged(self) -> Cell | None:
        """The cell the claim is about: the marked one, else (none eligible) the best with a compute stage."""
        return self.marked() or self.best_measured

    def judged_by_layout(self) -> list[LayoutRate] | None:
        """The judged cell's confirmation rate by token layout (a task of several layouts; None otherwise)."""
        if self.chosen:
            return self.faithfulness_by_layout
        cell = self.judged()
        return cell.get("faithfulness_by_layout") if cell else None


def subgraph_claim(
    correct_conf: list[bool], cell: tuple[int, int], threshold: float, chosen: bool, baseline: float
) -> Claim:
    """'This model has an AF1 subgraph at faithfulness >= threshold', at the search's cell, decided on the
    confirmation split by its Wilson interval; a cell that did not reach the threshold where it was chosen (the best
    eligible one) is never confirmed."""
    w, k = cell
    claim = rate_reaches(
        "af1_subgraph",
        f"an AF1 subgraph at faithfulness >= {threshold} (L_wait {w}, L_transfer {k})",
        correct_conf,
        threshold,
        f"the confirmation split ({len(correct_conf)} solved problems that did not choose the cell)",
        baseline,
    )
    low, value = claim["ci"][0], claim["estimate"]
    towards = value is not None and value >= threshold  # only a confirmation could decide it
    if low is None or low <= baseline:  # a threshold a constant guess could reach says nothing
        claim = capped(claim, NOT_CONFIRMED, "never confirmed where its interval does not clear the constant guess")
        if towards and value is not None:  # the n at which the interval would clear both the threshold and the guess
            needed = [
                n_to_decide_rate(value, threshold),
                n_to_decide_rate(value, baseline) if value > baseline else None,
            ]
            claim["n_to_decide"] = None if None in needed else max(n for n in needed if n is not None)
    if chosen:
        return claim
    claim = capped(claim, NOT_CONFIRMED, "never confirmed where no cell reached the threshold on the selection split")
    if towards:  # no n confirms it, and its interval cannot reject it
        claim["n_to_decide"] = None
    return claim


@dataclass(frozen=True)
class SplitGrid:
    """The grid's cells read on one selection/confirmation split of its solved problems (rates with the
    constant guess per token layout)."""

    grid: GridCells
    sel: list[int]
    conf: list[int]

    @classmethod
    def of(cls, grid: GridCells, selection: float, seed: int) -> SplitGrid:
        return cls(grid, *split_indices(len(grid.targets), selection, seed))

    def correct(self, w: int, k: int) -> list[bool]:
        return unbits(self.grid.cells[f"{w},{k}"])

    def rate(self, correct: list[bool], rows: list[int]) -> Rate:
        layouts = self.grid.kept_layouts or [0] * len(self.grid.targets)  # the baselines guess per layout
        return rate([correct[i] for i in rows], [self.grid.targets[i] for i in rows], [layouts[i] for i in rows])

    def cell(self, w: int, k: int, n_layers: int) -> Cell | None:
        if f"{w},{k}" not in self.grid.cells:
            return None
        correct = self.correct(w, k)
        s, c = self.rate(correct, self.sel), self.rate(correct, self.conf)
        return Cell(
            wait=w,
            transfer=k,
            faithfulness=c["value"],
            faithfulness_ci=c["ci"],
            faithfulness_selection=s["value"],
            faithfulness_selection_ci=s["ci"],
            eligible=has_compute_stage(w, k, n_layers) and s["ci"][0] > s["baseline"],
        )

    def by_layout(self, w: int, k: int) -> list[LayoutRate]:
        """The pooled confirmation rate's parts: each token layout's confirmation problems."""
        correct, layout_P, targets = self.correct(w, k), self.grid.kept_layouts or [], self.grid.targets
        out = []
        for g in sorted(set(layout_P)):
            rows = [i for i in self.conf if layout_P[i] == g]
            if not rows:  # the split put none of this layout's problems on the confirmation side
                continue
            r = rate([correct[i] for i in rows], [targets[i] for i in rows])
            out.append(LayoutRate(layout=g, value=r["value"], n=r["n"], ci=r["ci"], baseline=r["baseline"]))
        return out


def _strongest(cells: list[Cell]) -> Cell:
    """The cell of the highest selection faithfulness (ties: the larger wait, then the smaller transfer)."""
    return Cell(**max(cells, key=lambda m: (m["faithfulness_selection"], m["wait"], -m["transfer"])))


def search(grid: GridCells, *, n_layers: int, threshold: float, selection: float, seed: int) -> Found:
    """The AF1 cell, chosen on a selection split of the solved problems, and its claim judged on the rest.

    Choice: the largest wait, then the smallest transfer, whose selection faithfulness reaches the
    threshold. Never chosen: cells with no compute stage, and cells whose selection interval does not
    clear the constant-guess baseline. Also the frontier: for every wait, the smallest such transfer.
    The claim (`subgraph_claim`) is decided on the confirmation split alone: `found` only where it is confirmed."""
    if not (0 <= threshold <= 1 and 0 < selection < 1):  # search's Options refuse these first, by name
        raise Af1Error(f"threshold {threshold} must be in [0, 1] and selection {selection} in (0, 1)")
    L, split = n_layers, SplitGrid.of(grid, selection, seed)
    measured = {(w, k): m for w in range(-1, L) for k in range(L - w) if (m := split.cell(w, k, L)) is not None}
    passing = {wk: m for wk, m in measured.items() if m["eligible"] and m["faithfulness_selection"] >= threshold}
    frontier = [passing[(w, min(k for ww, k in passing if ww == w))] for w in sorted({w for w, _ in passing})]
    base_conf = split.rate([True] * len(split.grid.targets), split.conf)["baseline"]
    result = Found(
        threshold=threshold,
        chosen=bool(passing),
        found=False,
        claim=None,
        selection_fraction=selection,
        split_seed=seed,
        n_selection=len(split.sel),
        n_confirmation=len(split.conf),
        faithfulness_baseline_selection=split.rate([True] * len(split.grid.targets), split.sel)["baseline"],
        faithfulness_baseline=base_conf,
        wait=None,
        transfer=None,
        faithfulness=None,
        faithfulness_ci=None,
        faithfulness_selection=None,
        faithfulness_selection_ci=None,
        frontier=frontier,
        n_ineligible_no_compute=sum(1 for w, k in measured if not has_compute_stage(w, k, L)),
        warnings=[],
        grid_cells=len(measured),
        grid_cells_possible=sum(L - w for w in range(-1, L)),
        max_transfer_measured=max((k for _, k in measured), default=0),
    )
    eligible = [m for m in measured.values() if m["eligible"]]
    if eligible:
        best = result.best = _strongest(eligible)
        if grid.kept_layouts is not None:
            best["faithfulness_by_layout"] = split.by_layout(best["wait"], best["transfer"])
    judged = result.best
    if passing:
        w = max(w for w, _ in passing)
        judged = passing[(w, min(kk for ww, kk in passing if ww == w))]
        result.wait, result.transfer = w, judged["transfer"]
        result.faithfulness, result.faithfulness_ci = judged["faithfulness"], judged["faithfulness_ci"]
        result.faithfulness_selection = judged["faithfulness_selection"]
        result.faithfulness_selection_ci = judged["faithfulness_selection_ci"]
        result.stages = AF1Config(**{**grid.config, "wait": w, "transfer": judged["transfer"]}).stages(L)
        if grid.kept_layouts is not None:
            result.faithfulness_by_layout = split.by_layout(w, judged["transfer"])
    computing = [m for (w, k), m in measured.items() if has_compute_stage(w, k, L)]
    if judged is None and computing:  # nothing eligible: the numbers of the best cell still say how far it is
        judged = result.best_measured = _strongest(computing)
    if judged is not None:
        correct, cell = split.correct(judged["wait"], judged["transfer"]), (judged["wait"], judged["transfer"])
        claim = subgraph_claim([correct[i] for i in split.conf], cell, threshold, bool(passing), base_conf)
        result.claim, result.found = claim, claim["outcome"] == CONFIRMED
    if note := baseline_warning("faithfulness (confirmation split)", base_conf, len(split.conf)):
        result.warnings.append(note)
    return result
