"""sweep: faithfulness over the whole (L_wait, L_transfer) grid on the solved problems, per problem, with a heatmap;
resumable with --out."""

from __future__ import annotations

import html

from pydantic import Field
from rich.table import Table

from af1.experiments import base, costs
from af1.interventions.af1 import Ablation, AF1Config
from af1.interventions.masks import ABPVariant
from af1.methods import allforone
from af1.report import interactive
from af1.report.markup import figure_html
from af1.stats import rate_text


class Options(base.Options):
    max_transfer: int | None = Field(default=None, ge=0, description="largest L_transfer (default: all)")
    ablation: Ablation = Field(default="cama", description="cama, zero, mean, resample or none")
    abp: ABPVariant = Field(default="af1", description="af1, none, sink, all-peek or zero-output")
    reference: bool = Field(default=False, description="the hook-based path instead of the fast executor")


class Result(base.SetupFields, allforone.sweep.Grid):
    """The grid on the setup it was measured on; with a search in the plan, the search's rule read off this grid
    (`allforone.search.on_grid`), which must choose as the search did."""

    rule_on_grid: allforone.search.Found | None = None
    agrees_with_search: bool | None = None


class Sweep(base.Experiment):
    name = "sweep"
    Options = Options
    Result = Result
    small = {}
    cost = costs.Cost(slowdown=1.1)

    def uses(self) -> tuple[str, ...]:
        return (base.SEARCH,)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t, L, solved = s.on, s.model.layers, s.found.solved
        passes, cells = costs.sweep_passes(L, options.max_transfer)
        kv = solved * t.suffix * L * (L - 1) / 2  # token-local keys and values, rebuilt for each wait
        return solved * t.steps * passes + s.clean + kv, solved * t.steps * cells, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        from af1.experiments.search import Result as Searched

        setup = inputs.resources.setup(inputs.spec)
        config = AF1Config(ablation=options.ablation, abp=options.abp, seed=inputs.spec.seed)
        state = inputs.state_dir / "sweep.state.json" if inputs.state_dir else None
        grid = allforone.sweep.sweep(setup, config, options.max_transfer, options.reference, state_path=state)
        search, on_grid, agrees = inputs.one(Searched), None, None
        if search is not None and options.max_transfer is None and search.config == config:
            on_grid = allforone.search.on_grid(
                grid,
                n_layers=setup.adapter.n_layers,
                threshold=search.threshold,
                selection=search.selection_fraction,
                seed=search.split_seed,
            )
            agrees = same_verdict(on_grid, search)
            if not agrees:
                grid.warnings.append(
                    f"the search's rule read off this grid does not choose as the search did: {on_grid.judged}"
                )
        return Result.of(setup.describe(), grid, rule_on_grid=on_grid, agrees_with_search=agrees)

    def section(self, result: Result) -> list[str]:
        found = result.rule_on_grid
        rule = (
            ""
            if found is None or found.judged is None
            else (
                f" The search's rule read off this whole grid judges L_wait {found.judged['wait']}, L_transfer "
                f"{found.judged['transfer']} ({'chosen' if found.chosen else 'best'}), outlined in red, with its "
                "frontier"
                + (
                    "; the search, measuring only what the rule needs, decided the same."
                    if result.agrees_with_search
                    else "; the search decided otherwise (a fault: see the warnings)."
                )
            )
        )
        return [
            "<h2>The (L_wait, L_transfer) grid</h2>",
            f"<p>{result.model} on <code>{html.escape(result.task)}</code> ({result.style}): {result.n_solved} "
            f"solved problems of {result.n} (base accuracy {rate_text(result.base_accuracy)}, "
            f"{result.scoring} answer scored); {result.n_cells} cells, executor {result.executor}. Faithfulness = "
            "accuracy under AF1 on the solved problems; a constant guess scores "
            f"{result.faithfulness_baseline or float('nan'):.3f} on them. Row L_wait -1 is no ablation, but from "
            "block 0 the mask still keeps the other tokens from reading each other, so even its last column is not "
            "the unmodified model. An exploration map: no claim is made of it."
            + rule
            + " Red triangles: cells whose whole 95 % interval lies at or above the threshold (in-sample, uncorrected "
            "across cells: descriptive)."
            + " Hover a cell for its numbers; click it for its problems."
            + "</p>"
            + figure_html(lambda: interactive.sweep_grid(result, result, found)),
        ]

    def show(self, result: Result) -> list[Table | str]:
        return [f"{result.n_cells} cells on {result.n_solved} solved problems, executor {result.executor}"]


def same_verdict(on_grid: allforone.search.Found, search: allforone.search.Found) -> bool:
    """Whether two readings of the search's rule decide alike: the same judged cell with the same rates, whether it
    was chosen, and the same claim."""
    return (on_grid.judged, on_grid.chosen, on_grid.claim) == (search.judged, search.chosen, search.claim)
