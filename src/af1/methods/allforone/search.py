"""The search: the AF1 cell chosen on a selection split of the solved problems, its claim decided on the other."""

from __future__ import annotations

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import CONFIRMED, NOT_CONFIRMED, Claim, capped, rate_reaches
from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.grid import GridCells, unbits
from af1.methods.setup import Setup
from af1.stats import LayoutRate, baseline_warning, rate, split_indices


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


@with_config(ConfigDict(extra="forbid"))
class Found(TypedDict):
    """The search's answer (`search`): the chosen cell (None where no cell passes) with its confirmation
    faithfulness, interval and constant guess, its selection faithfulness, the split, the frontier, the best
    eligible cell, and the claim 'an AF1 subgraph at the threshold' decided on the confirmation split."""

    threshold: float
    chosen: bool  # a cell reached the threshold on the selection split (the cell later analyses run at)
    found: bool  # the claim confirmed on the confirmation split
    claim: Claim | None  # None: no cell is eligible
    selection_fraction: float
    split_seed: int
    n_selection: int
    n_confirmation: int
    faithfulness_baseline_selection: float
    faithfulness_baseline: float
    wait: int | None
    transfer: int | None
    faithfulness: float | None
    faithfulness_ci: list[float] | None
    faithfulness_selection: float | None
    faithfulness_selection_ci: list[float] | None
    frontier: list[Cell]
    n_ineligible_no_compute: int
    warnings: list[str]
    stages: NotRequired[dict[str, list[int]]]
    best: NotRequired[Cell]
    best_measured: NotRequired[Cell]  # where no cell is eligible: the best one with a compute stage, judged
    faithfulness_by_layout: NotRequired[list[LayoutRate]]
    grid_cells: int  # cells measured, of the grid's grid_cells_possible ((L_wait, L_transfer) with L_wait >= -1)
    grid_cells_possible: int
    max_transfer_measured: int  # below n_layers: the sweep was capped (max_transfer)


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
    low = claim["ci"][0]
    if low is None or low <= baseline:  # a threshold a constant guess could reach says nothing
        claim = capped(claim, NOT_CONFIRMED, "never confirmed where its interval does not clear the constant guess")
    if chosen:
        return claim
    return capped(claim, NOT_CONFIRMED, "never confirmed where no cell reached the threshold on the selection split")


def search(grid: GridCells, *, n_layers: int, threshold: float, selection: float, seed: int) -> Found:
    """The AF1 subgraph, chosen on a selection split of the solved problems and confirmed on the rest.

    Choice: the largest wait, then the smallest transfer, whose selection faithfulness reaches the
    threshold. Never chosen: cells with no compute stage, and cells whose selection interval does not
    clear the constant-guess baseline. Also the frontier: for every wait, the smallest such transfer.
    The claim (`subgraph_claim`) is decided on the confirmation split alone: `found` only where it is confirmed."""
    if not (0 <= threshold <= 1 and 0 < selection < 1):  # search's Options refuse these first, by name
        raise Af1Error(f"threshold {threshold} must be in [0, 1] and selection {selection} in (0, 1)")
    L = n_layers
    targets = list(grid["targets"])
    layouts = grid["kept_layouts"] or [0] * len(targets)  # the baselines guess per layout
    sel, conf = split_indices(len(targets), selection, seed)
    sel_targets, conf_targets = [targets[i] for i in sel], [targets[i] for i in conf]
    sel_layouts, conf_layouts = [layouts[i] for i in sel], [layouts[i] for i in conf]

    def measure(w: int, k: int) -> Cell | None:
        bits = grid["cells"].get(f"{w},{k}")
        if bits is None:
            return None
        correct = unbits(bits)
        s = rate([correct[i] for i in sel], sel_targets, sel_layouts)
        c = rate([correct[i] for i in conf], conf_targets, conf_layouts)
        return Cell(
            wait=w,
            transfer=k,
            faithfulness=c["value"],
            faithfulness_ci=c["ci"],
            faithfulness_selection=s["value"],
            faithfulness_selection_ci=s["ci"],
            eligible=has_compute_stage(w, k, L) and s["ci"][0] > s["baseline"],
        )

    measured = {(w, k): m for w in range(-1, L) for k in range(L - w) if (m := measure(w, k)) is not None}
    passing = {wk: m for wk, m in measured.items() if m["eligible"] and m["faithfulness_selection"] >= threshold}
    frontier = [passing[(w, min(k for ww, k in passing if ww == w))] for w in sorted({w for w, _ in passing})]
    base_sel = rate([True] * len(sel), sel_targets, sel_layouts)
    base_conf = rate([True] * len(conf), conf_targets, conf_layouts)
    result = Found(
        threshold=threshold,
        chosen=bool(passing),
        found=False,
        claim=None,
        selection_fraction=selection,
        split_seed=seed,
        n_selection=len(sel),
        n_confirmation=len(conf),
        faithfulness_baseline_selection=base_sel["baseline"],
        faithfulness_baseline=base_conf["baseline"],
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

    def by_layout(w: int, k: int) -> list[LayoutRate]:
        """The pooled confirmation rate's parts: each token layout's confirmation problems."""
        correct, layout_P = unbits(grid["cells"][f"{w},{k}"]), grid["kept_layouts"] or []
        out = []
        for g in sorted(set(layout_P)):
            rows = [i for i in conf if layout_P[i] == g]
            if not rows:  # the split put none of this layout's problems on the confirmation side
                continue
            r = rate([correct[i] for i in rows], [targets[i] for i in rows])
            out.append(LayoutRate(layout=g, value=r["value"], n=r["n"], ci=r["ci"], baseline=r["baseline"]))
        return out

    eligible = [m for m in measured.values() if m["eligible"]]
    if eligible:
        best = Cell(**max(eligible, key=lambda m: (m["faithfulness_selection"], m["wait"], -m["transfer"])))
        if grid["kept_layouts"] is not None:
            best["faithfulness_by_layout"] = by_layout(best["wait"], best["transfer"])
        result["best"] = best
    chosen: Cell | None = None
    if passing:
        w = max(w for w, _ in passing)
        k = min(kk for ww, kk in passing if ww == w)
        chosen = passing[(w, k)]
        config = AF1Config(**{**grid["config"], "wait": w, "transfer": k})
        result.update(
            wait=w,
            transfer=k,
            faithfulness=chosen["faithfulness"],
            faithfulness_ci=chosen["faithfulness_ci"],
            faithfulness_selection=chosen["faithfulness_selection"],
            faithfulness_selection_ci=chosen["faithfulness_selection_ci"],
            stages=config.stages(L),
        )
        if grid["kept_layouts"] is not None:
            result["faithfulness_by_layout"] = by_layout(w, k)
    judged = chosen if passing else result.get("best")
    computing = [m for (w, k), m in measured.items() if has_compute_stage(w, k, L)]
    if judged is None and computing:  # nothing eligible: the numbers of the best cell still say how far it is
        judged = result["best_measured"] = Cell(
            **max(computing, key=lambda m: (m["faithfulness_selection"], m["wait"], -m["transfer"]))
        )
    if judged is not None:
        correct = unbits(grid["cells"][f"{judged['wait']},{judged['transfer']}"])
        cell = (judged["wait"], judged["transfer"])
        claim = subgraph_claim([correct[i] for i in conf], cell, threshold, bool(passing), base_conf["baseline"])
        result.update(claim=claim, found=claim["outcome"] == CONFIRMED)
    note = baseline_warning("faithfulness (confirmation split)", base_conf["baseline"], len(conf))
    if note:
        result["warnings"].append(note)
    return result
