"""sweep: faithfulness over the whole (L_wait, L_transfer) grid, with a heatmap; resumable with --out.

Per problem, on the solved problems."""

from __future__ import annotations

import html
from pathlib import Path

from pydantic import Field
from rich.table import Table

from af1.experiments import base
from af1.interventions.af1 import Ablation, AF1Config
from af1.interventions.masks import ABPVariant
from af1.methods import allforone
from af1.report import interactive
from af1.report.markup import figure_html, result_beside
from af1.stats import with_ci


class Options(base.Options):
    max_transfer: int | None = Field(default=None, ge=0, description="largest L_transfer (default: all)")
    ablation: Ablation = Field(default="cama", description="cama, zero, mean, resample or none")
    abp: ABPVariant = Field(default="af1", description="af1, none, sink, all-peek or zero-output")
    reference: bool = Field(default=False, description="the hook-based path instead of the fast executor")


class Result(base.SetupFields, allforone.sweep.Grid):
    """The grid's part (`allforone.sweep.Grid`) on the setup it was measured on."""


class Sweep(base.Experiment):
    name = "sweep"
    Options = Options
    Result = Result
    figure = "sweep.png"

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        setup = inputs.resources.setup(inputs.spec)
        config = AF1Config(ablation=options.ablation, abp=options.abp, seed=inputs.spec.seed)
        state = inputs.state_dir / "sweep.state.json" if inputs.state_dir else None
        grid = allforone.sweep.sweep(setup, config, options.max_transfer, options.reference, state_path=state)
        return Result.of(setup.describe(), grid)

    def draw(self, result: Result, out_dir: Path, inputs: base.Inputs) -> Path:
        from af1.report import figures  # matplotlib: only when drawing

        return figures.sweep_heatmap(result, result, out_dir / "sweep.png")

    def section(self, result: Result, out_dir: Path) -> list[str]:
        return [
            "<h2>The (L_wait, L_transfer) grid</h2>",
            f"<p>{result.model} on <code>{html.escape(result.task)}</code> ({result.style}): {result.n_solved} "
            f"solved problems of {result.n} (base accuracy {with_ci(result.base_accuracy, result.base_accuracy_ci)}, "
            f"{result.scoring} answer scored); {result.n_cells} cells, executor {result.executor}. Faithfulness = "
            "accuracy under AF1 on the solved problems; a constant guess scores "
            f"{result.faithfulness_baseline or float('nan'):.3f} on them. Row L_wait -1 is no ablation, but from "
            "block 0 the mask still keeps the other tokens from reading each other, so even its last column is not "
            "the unmodified model."
            + (
                " The grid is drawn below, with the search's choice marked on it.</p>"
                if result_beside(out_dir, "search") is not None  # its section draws the grid
                else " Red triangles: cells whose whole 95 % interval lies at or above 0.9 (in-sample, uncorrected "
                "across cells: descriptive)."
                + (" Hover a cell for its numbers; click it for its problems." if interactive.enabled() else "")
                + "</p>"
                + figure_html(out_dir, "sweep.png", lambda: interactive.sweep_grid(result, result))
            ),
        ]

    def show(self, result: Result) -> list[Table | str]:
        return [f"{result.n_cells} cells on {result.n_solved} solved problems, executor {result.executor}"]
