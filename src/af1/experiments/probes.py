"""probes: after which block the operands, the answer and its digits can be read off the last token (linear and
Fourier probes), unmodified and under AF1, against AF1's stages.

Cross-validated ridge probes of the last prompt token's state after every block, each problem predicted by the fold
that did not train on it, against the constant guess and the same probe trained on shuffled labels. Under the
search's config they are measured on its confirmation split."""

from __future__ import annotations

import html
from pathlib import Path

from pydantic import Field
from rich.table import Table

from af1.experiments import base
from af1.experiments.search import NO_CELL, config_of, searched, searched_config
from af1.interventions.af1 import AF1Config
from af1.methods import allforone, probes
from af1.report import interactive
from af1.report.markup import Tab, figure_html
from af1.stats import with_ci
from af1.tasks.evaluation import ProblemInputs


class Options(base.ConfigOptions):
    folds: int = Field(default=5, ge=2, description="cross-validation folds: each problem predicted by the other ones")
    fold_seed: int = Field(default=0, description="seed of the folds and of the shuffled-label control")


class Result(base.SetupFields, probes.Probes):
    """The probes' part (`probes.Probes`) on the problems it was measured on."""

    measured_on: str = "the solved problems"
    no_config: str | None = None  # why there is no AF1 configuration to probe under
    inputs: ProblemInputs | None = None  # sets: solved; confirmation when measured there


class Probes(base.Experiment):
    name = "probes"
    Options = Options
    Result = Result

    def uses(self) -> tuple[str, ...]:
        return (base.SEARCH,)

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        n_layers = inputs.resources.lm().adapter.n_layers
        config: AF1Config | None = config_of(inputs, options, n_layers) if options.wait is not None else None
        setup = inputs.resources.setup(inputs.spec)
        on, where, note = setup, "the solved problems", None
        search = searched(inputs)
        if config is None and search is None:
            note = "no AF1 configuration: give wait and transfer, or run the search first"
        elif config is None and search is not None:
            config = searched_config(search)
            if config is None:
                note = f"no AF1 configuration: {NO_CELL}"
            else:
                on = allforone.search.confirmation(setup, search.selection_fraction, search.split_seed)
                where = "the search's confirmation split"
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
        rows = []
        for c in result.unmodified:
            af1 = under.get((c["target"], c["kind"]))
            rows.append(
                [
                    c["target"],
                    c["kind"],
                    probes.first_above_chance(c),
                    probes.first_above_chance(af1, (result.wait or 0) + 1) if af1 else None,
                    with_ci(c["accuracy"][-1], c["accuracy_ci"][-1]),
                    with_ci(af1["accuracy"][-1], af1["accuracy_ci"][-1]) if af1 else None,
                    c["majority"],
                ]
            )
        after = f"under AF1, after block {result.wait}" if result.wait is not None else "under AF1"
        headers = ["target", "probe", "first block read above chance", after, "accuracy after the last block"]
        return [Tab([*headers, "under AF1", "most common label"], rows)]

    def section(self, result: Result, out_dir: Path) -> list[str]:
        config = f"L_wait {result.wait}, L_transfer {result.transfer}" if result.wait is not None else None
        return [
            "<h2>What the last token holds, block by block</h2>",
            f"<p>Ridge probes of the last prompt token's state after every block, on {result.n_probed} problems "
            f"({html.escape(result.measured_on)}), {result.folds}-fold cross-validated: every problem is predicted by "
            f"a probe that did not train on it. The Fourier probe reads each value on circles of periods "
            f"{', '.join(map(str, result.periods))}; the linear one reads the value itself. The curves are "
            "descriptive (a block is read <i>above chance</i> where its accuracy's 95 % interval lies above both "
            "the most common label's share and the same probe trained on shuffled labels); the claims below test "
            f"their blocks against {result.permutations} label permutations, each probed alike"
            + (f", under AF1 at {config}" if config else f"; {html.escape(result.no_config or '')}")
            + ".</p>",
            figure_html(out_dir, "probes.png", lambda: interactive.probes_plot(result.data())),
            *(f"<p>{html.escape(line)}</p>" for line in reading(result)),
            *super().section(result, out_dir),
        ]

    def show(self, result: Result) -> list[Table | str]:
        return [*super().show(result), *reading(result)]


def reading(result: Result) -> list[str]:
    """Where under AF1 each operand and the computed target (`probes.computed_target`) are first read above chance
    (by either probe) after the CAMA block, said against AF1's stages; and what a probe reads at the CAMA block."""
    if result.wait is None or result.transfer is None:
        return []
    wait, last_transfer = result.wait, result.wait + result.transfer
    computed = probes.computed_target(result.targets)
    first: dict[str, int | None] = {}
    at_cama: set[str] = set()
    for c in result.under_af1:
        if len(c["target"]) == 1 or c["target"] == computed:
            at, known = probes.first_above_chance(c, wait + 1), first.get(c["target"])
            first[c["target"]] = at if known is None else known if at is None else min(at, known)
            if 0 <= wait < len(c["above_chance"]) and c["above_chance"][wait]:
                at_cama.add(probes.spoken(c["target"]))
    lines = []
    for target, block in first.items():
        what, operand = probes.spoken(target), len(target) == 1
        if block is None:
            lines.append(f"Under AF1 {what} is never read above chance after block {wait}.")
        elif block <= last_transfer:
            verdict = "as AF1's stages say" if operand else "before the compute stage begins"
            lines.append(
                f"Under AF1 {what} is first read above chance after block {block}, a transfer block: {verdict}."
            )
        else:
            verdict = "only after the transfer layers" if operand else "in the compute stage, as AF1 says"
            lines.append(f"Under AF1 {what} is first read above chance after block {block}, {verdict}.")
    if at_cama:
        lines.append(
            f"At the CAMA block ({wait}) itself the probes read {', '.join(sorted(at_cama))}: each problem's mean "
            "leaves its own state out, so 1/(n - 1) of that state stays in it, a trace a standardizing probe reads."
        )
    return lines
