"""The search measures what its rule needs and decides exactly as the rule read off the whole grid (`on_grid`)."""

from __future__ import annotations

import random

import pytest

from af1.experiments.sweep import same_verdict
from af1.interventions.af1 import AF1Config
from af1.methods import allforone
from af1.methods.allforone.search import Found, Rule, decide, on_grid
from af1.methods.allforone.sweep import GridCells, unbits
from af1.methods.setup import prepare
from af1.models import LoadedModel, ModelAdapter
from af1.tasks.spec import TaskSpec

from conftest import TINY_FAMILIES, fitted_tiny_model


class GridMeter:
    """A meter that reads a complete grid's bits, counting the (problem, cell) pairs it was asked for."""

    def __init__(self, grid: GridCells) -> None:
        self.bits = {key: unbits(b) for key, b in grid.cells.items()}
        self.asked = 0

    def right(self, asks: list[tuple[int, int, list[int]]]) -> list[list[bool]]:
        self.asked += sum(len(rows) for _, _, rows in asks)
        return [[self.bits[f"{w},{k}"][r] for r in rows] for w, k, rows in asks]

    def executors(self) -> list:
        return []


def frontier_of(found: Found) -> list[tuple[int, int]]:
    return [(c["wait"], c["transfer"]) for c in found.frontier]


def random_grid(rng: random.Random) -> tuple[GridCells, int]:
    """A grid of random size whose cells have rates drawn around the thresholds, problems of random hardness."""
    L, n = rng.randint(2, 7), rng.randint(8, 60)
    targets = [str(rng.randrange(rng.choice([1, 2, 10]))) for _ in range(n)]
    hard = [rng.random() for _ in range(n)]
    cells = {}
    for w in range(-1, L):
        for k in range(L - w):
            p = rng.choice([0.0, 0.3, 0.6, 0.85, 0.9, 0.95, 1.0, rng.random()])
            cells[f"{w},{k}"] = "".join("1" if rng.random() < p * (0.5 + hard[i]) else "0" for i in range(n))
    return GridCells(cells=cells, targets=targets, kept_layouts=None, config={}), L


def test_the_early_stopped_search_decides_as_the_whole_grid_on_400_random_grids():
    """Random grids (passing cells or none, constant targets, thresholds 0 to 1): the same judged cell with the same
    rates on both splits, the same choice and claim, the same frontier; and it asks for less than the grid."""
    rng = random.Random(0)
    asked = whole = 0
    kinds = {"chosen": 0, "best": 0}
    for trial in range(400):
        grid, L = random_grid(rng)
        threshold, selection, seed = rng.choice([0.0, 0.5, 0.8, 0.9, 1.0]), rng.choice([0.3, 0.5]), rng.randint(0, 5)
        exhaustive = on_grid(grid, n_layers=L, threshold=threshold, selection=selection, seed=seed)
        for frontier in (False, True):
            meter = GridMeter(grid)
            found = decide(Rule(grid.targets, None, L, threshold, selection, seed), meter, AF1Config(), frontier)
            assert same_verdict(exhaustive, found), (trial, frontier)
            whole_frontier = frontier_of(exhaustive)
            assert frontier_of(found) == (whole_frontier if frontier else whole_frontier[:1]), trial
            assert found.problem_cells == meter.asked and not found.exhaustive
        asked += meter.asked
        whole += exhaustive.problem_cells
        kinds["chosen" if exhaustive.chosen else "best"] += 1
    assert min(kinds.values()) > 50, kinds  # both paths (the scan, the branch and bound) are exercised
    assert asked < whole / 2, (asked, whole)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_search_chooses_the_grid_s_cell_on_every_family(tokenizer, family):
    """On a tiny model of each family fitted to answer (an AF1 subgraph at L_wait 0, L_transfer 1): the search,
    fast and hook-based, decides as the rule read off the sweep's grid, frontier included, where a cell reaches the
    threshold (CAMA) and where none does (zero ablation breaks the fit: the branch and bound among near ties)."""
    spec = TaskSpec(operation="a+b", n=40)
    model = fitted_tiny_model(family, [spec], tokenizer)
    lm = LoadedModel(model, tokenizer, ModelAdapter(model), {"spec": f"fitted-{family}"})
    setup = prepare(lm, spec)
    L = lm.adapter.n_layers
    for config, chosen in ((AF1Config(ablation="cama"), True), (AF1Config(ablation="zero"), False)):
        ablation = config.ablation
        exhaustive = on_grid(allforone.sweep.sweep(setup, config), n_layers=L, threshold=0.9, selection=0.5, seed=1)
        assert exhaustive.chosen is chosen
        for reference in (False, True):
            found = allforone.search.search(
                setup, config, threshold=0.9, selection=0.5, seed=1, frontier=True, reference=reference
            )
            assert same_verdict(exhaustive, found), (ablation, reference, exhaustive.cell(), found.cell())
            assert frontier_of(found) == frontier_of(exhaustive)
            assert found.problem_cells <= exhaustive.problem_cells
            assert (found.executor == "reference") == (reference or found.fallback_reason is not None)


def test_the_search_decides_as_the_grid_on_smollm2(smollm2):
    """SmolLM2 on 16 1-digit sums: the search where no cell reaches the threshold (0.9) and where cells do (0.6),
    frontier included, decides as the rule read off the whole grid, measuring a fraction of its (problem, cell)
    pairs (Qwen's side by side: benchmarks/search_work.py)."""
    spec = TaskSpec(operation="a+b", style="calculate", shots=1, n=16, seed=7)
    setup = prepare(smollm2, spec)
    grid = allforone.sweep.sweep(setup, AF1Config())
    L = smollm2.adapter.n_layers
    for threshold, chosen in ((0.9, False), (0.6, True)):
        exhaustive = on_grid(grid, n_layers=L, threshold=threshold, selection=0.5, seed=0)
        assert exhaustive.chosen is chosen
        found = allforone.search.search(setup, AF1Config(), threshold=threshold, selection=0.5, seed=0, frontier=True)
        assert same_verdict(exhaustive, found), (threshold, exhaustive.cell(), found.cell())
        assert frontier_of(found) == frontier_of(exhaustive)
        assert found.problem_cells < exhaustive.problem_cells / 3, threshold
