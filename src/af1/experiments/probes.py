"""probes: after which block the last token holds the operands, the answer and its digits (cross-validated linear and
Fourier probes against shuffled labels), unmodified and under AF1 (on the search's confirmation split)."""

from __future__ import annotations

import html

from pydantic import Field
from rich.table import Table

from af1.experiments import base, costs
from af1.experiments.search import NO_CELL, config_of, measured_on, searched, searched_config
from af1.interventions.af1 import AF1Config
from af1.methods import allforone, probes
from af1.methods.setup import ALL_SOLVED
from af1.report import interactive
from af1.report.markup import Tab, figure_html
from af1.stats import with_ci
from af1.tasks.evaluation import ProblemInputs


class Options(base.ConfigOptions):
    folds: int = Field(default=5, ge=2, description="cross-validation folds: each problem predicted by the other ones")
    fold_seed: int = Field(default=0, description="seed of the folds and of the shuffled-label control")


class Result(base.SetupFields, probes.Probes):
    """The probes' part (`probes.Probes`) on the problems it was measured on."""

    measured_on: str = ALL_SOLVED
    no_config: str | None = None  # why there is no AF1 configuration to probe under
    inputs: ProblemInputs | None = None  # sets: solved; confirmation when measured there


class Probes(base.Experiment):
    name = "probes"
    Options = Options
    Result = Result
    small = {"folds": 3}
    cost = costs.Cost(slowdown=1.5)

    def uses(self) -> tuple[str, ...]:
        return (base.SEARCH,)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """The last token's states after every block, unmodified and under AF1 (its ridge fits left out)."""
        return 2 * s.half * s.on.step_tokens() * s.model.layers + s.clean, 2 * s.half, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        n_layers = inputs.resources.lm().adapter.n_layers
        config: AF1Config | None = config_of(inputs, options, n_layers) if options.wait is not None else None
        setup = inputs.resources.setup(inputs.spec)
        search, note = searched(inputs), None
        if config is None and search is None:
            note = "no AF1 configuration: give wait and transfer, or run the search first"
        elif config is None and search is not None:
            config = searched_config(search)
            note = None if config is not None else f"no AF1 configuration: {NO_CELL}"
        on, where = measured_on(inputs, options, setup) if config is not None else (setup, ALL_SOLVED)
        found = probes.probes(on, config, folds=options.folds, seed=options.fold_seed, measured_on=where)
        halves = {} if on is setup else {"confirmation": on}
        return Result.of(
            on.describe(),
            found,
            measured_on=where,
            no_config=note,
            inputs=allforone.faithfulness.setup_inputs(setup, **halves),
        )

    def tables(self, result: Result) -> list[Tab]:
        under = {(c["target"], c["kind"]): c for c in result.under_af1}
        alone = {(c["target"], c["kind"]): c for c in result.no_transfer}

        def at(curve: probes.Curve | None, block: int) -> str | None:
            return with_ci(curve["accuracy"][block], curve["accuracy_ci"][block]) if curve else None

        rows = []
        for c in result.unmodified:
            key, last = (c["target"], c["kind"]), len(c["accuracy"]) - 1
            read = [at(c, last), at(under.get(key), last), at(alone.get(key), last)]
            rows.append([*key, probes.first_above_chance(c), *read, c["majority"]])
        headers = ["target", "probe", "first block read above chance", "after the last block"]
        return [Tab([*headers, "under AF1", "with no transfer layers (control)", "most common label"], rows)]

    def section(self, result: Result) -> list[str]:
        config = result.config.cell if result.config is not None else None
        return [
            "<h2>What the last token holds, block by block</h2>",
            f"<p>Ridge probes of the last prompt token's state after every block, on {result.n_probed} problems "
            f"({html.escape(result.measured_on)}), {result.folds}-fold cross-validated: every problem is predicted by "
            f"a probe that did not train on it. The Fourier probe reads each value on circles of periods "
            f"{', '.join(map(str, result.periods))}; the linear one reads the value itself. The curves are "
            "descriptive (a block is read <i>above chance</i> where its accuracy's 95 % interval lies above both "
            "the most common label's share and the same probe trained on shuffled labels). "
            + (
                f"Under AF1 at {config} the claims compare, problem by problem, with the matched control: the same "
                "CAMA and no transfer layers."
                + (
                    " The configuration was given, so every solved problem is measured: where these problems "
                    "chose it (a search's cell given by hand), the claims are in-sample."
                    if result.measured_on == ALL_SOLVED
                    else ""
                )
                if config
                else html.escape(result.no_config or "")
            )
            + "</p>",
            figure_html(lambda: interactive.probes_plot(result)),
            *(f"<p>{html.escape(line)}</p>" for line in reading(result)),
            *super().section(result),
        ]

    def show(self, result: Result) -> list[Table | str]:
        return [*super().show(result), *reading(result)]


def reading(result: Result) -> list[str]:
    """Each operand after the last transfer block and the computed target after the last, under AF1 beside its
    no-transfer control (Fourier probe), and what the CAMA block holds; numbers only: the claims decide."""
    if result.config is None:
        return []
    last = len(result.unmodified[0]["accuracy"]) - 1 if result.unmodified else 0
    after = min(result.config.wait + result.config.transfer, last)
    computed = probes.computed_target(result.targets)
    fourier = probes.KINDS[0]
    under = {c["target"]: c for c in result.under_af1 if c["kind"] == fourier}
    alone = {c["target"]: c for c in result.no_transfer if c["kind"] == fourier}

    def at(curve: probes.Curve | None, block: int) -> str:
        return with_ci(curve["accuracy"][block], curve["accuracy_ci"][block]) if curve else "-"

    lines = []
    for target in [*(t for t in result.targets if len(t) == 1), *([computed] if computed else [])]:
        block = after if len(target) == 1 else last
        line = (
            f"{probes.spoken(target).capitalize()} after block {block} (Fourier probe): {at(under.get(target), block)}"
        )
        line += f" under AF1, {at(alone.get(target), block)} with no transfer layers"
        if target == computed and after < last:
            line += f"; under AF1 after block {after}, the last transfer block: {at(under.get(target), after)}"
        lines.append(line + ".")
    if result.means_from["leave_one_out"].startswith("each"):  # the probed problems are inside the means
        n = result.means_from["n_problems"]
        lines.append(
            f"At the CAMA block ({result.config.wait}) each probed problem's state is the mean of the other {n - 1} "
            f"problems' there, (sum - own) / {n - 1}: an affine function of its own, so a standardizing probe reads "
            "what the unmodified block holds. That trace stays in the residual stream; the control keeps it and drops "
            "the transfer layers."
        )
    return lines
