"""search: the AF1 subgraph: the largest L_wait, then the smallest L_transfer, keeping faithfulness >= threshold,
chosen on a selection split measuring only what the rule needs, and confirmed on the other."""

from __future__ import annotations

import html
from typing import Any

from pydantic import Field, field_validator
from rich.table import Table

from af1.claims import outcome_text
from af1.errors import Af1Error
from af1.experiments import base, costs
from af1.interventions.af1 import Ablation, AF1Config
from af1.interventions.masks import ABPVariant
from af1.methods import allforone
from af1.methods.setup import ALL_SOLVED, Setup
from af1.report import interactive
from af1.report.markup import Tab, figure_html, layout_tab, layouts_text, stages_tab, table_html
from af1.stats import rate_text, split_indices, with_ci
from af1.tasks.evaluation import ProblemInputs

# the share of the selection split the search measures per cell before the rule decides it (to the best cell's
# misses where none reaches the threshold): 0.44 and 0.39 in the demo's two models (its cost)
SEARCH_SHARE = 0.5


class Options(base.Options):
    threshold: float = Field(default=0.9, description="faithfulness the subgraph must keep")
    selection: base.Share = Field(default=0.5, description="share of solved problems the search chooses on")
    split_seed: int = Field(default=0, description="seed of the selection/confirmation split")
    frontier: bool = Field(
        default=False,
        description="also every lower L_wait's first cell reaching the threshold (the staircase); the choice needs "
        "only the largest",
    )
    ablation: Ablation = Field(default="cama", description="cama, zero, mean, resample or none")
    abp: ABPVariant = Field(default="af1", description="af1, none, sink, all-peek or zero-output")
    reference: bool = Field(default=False, description="the hook-based path instead of the fast executor")

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, v: float) -> float:
        if not 0 <= v <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {v}")
        return v


class Result(base.SetupFields, allforone.search.Found):
    """The search's part (`allforone.search.Found`) on the setup it was measured on: the config every cell shares and
    the exact inputs (sets: solved, selection, confirmation)."""

    config: AF1Config
    inputs: ProblemInputs


class Search(base.Experiment):
    name = base.SEARCH
    Options = Options
    Result = Result
    small = {"threshold": 0.5}
    cost = costs.Cost(slowdown=0.36)
    overview_rank = -1  # the verdicts open the report

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """Every cell with a compute stage on some selection problems (SEARCH_SHARE of them before the rule decides
        it), the judged one on all."""
        t, L = s.on, s.model.layers
        pairs = L * (L + 1) / 2 * s.found.solved * options.selection * SEARCH_SHARE + s.found.solved
        return pairs * t.steps * (2 * L + 1) / 3 + s.clean, pairs * t.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        setup = inputs.resources.setup(inputs.spec)
        config = AF1Config(ablation=options.ablation, abp=options.abp, seed=inputs.spec.seed)
        found = allforone.search.search(
            setup,
            config,
            threshold=options.threshold,
            selection=options.selection,
            seed=options.split_seed,
            frontier=options.frontier,
            reference=options.reference,
        )
        sel, conf = split_indices(len(setup.kept), options.selection, options.split_seed)
        halves = {"selection": setup.on(sel), "confirmation": setup.on(conf)}
        described = setup.describe().model_copy(update={"model": inputs.model_name})  # as the plan names it
        return Result.of(described, found, config=config, inputs=allforone.faithfulness.setup_inputs(setup, **halves))

    def overview(self, finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
        return overview_of(finished)

    def section(self, result: Result) -> list[str]:
        plot = lambda: interactive.search_plot(result, result.n_layers)  # noqa: E731
        parts = ["<h2>The AF1 search and its claim</h2>", figure_html(plot)]
        parts.append(f"<p>{html.escape(measured_line(result))}</p>")
        parts.append(f"<p><b>{html.escape(claim_line(result))}</b></p>")
        if result.chosen:
            parts.append(f"<p>{html.escape(chosen_line(result))}</p>")
        return [*parts, *(t.html() for t in self.tables(result))]

    def tables(self, result: Result) -> list[Tab]:
        judged = result.judged
        parts = judged["confirmation"].get("by_layout") if judged else None
        by_layout = layout_tab("Confirmation faithfulness", parts, result.layouts)
        return [stages_tab(result.stages), by_layout] if result.chosen else [by_layout]

    def show(self, result: Result) -> list[Table | str]:
        lines = [claim_line(result), *([chosen_line(result)] if result.chosen else []), measured_line(result)]
        return [*lines, *(t.rich() for t in self.tables(result) if t.rows)]


def measured_line(result: Result) -> str:
    """What the search measured, against the whole grid."""
    cells = len(result.measured)
    stopped = sum(c["measured"] < result.n_selection for c in result.measured)
    every = (
        "every problem of every cell (the whole grid)"
        if result.exhaustive
        else (
            f"{cells} cells on the selection split, {stopped} of them stopped once decided, and the judged cell on the "
            "confirmation split"
        )
    )
    share = result.problem_cells / result.problem_cells_grid if result.problem_cells_grid else float("nan")
    return (
        f"Measured {every}: {result.problem_cells:,} (problem, cell) pairs, {share:.1%} of the whole grid's "
        f"{result.problem_cells_grid:,}; executor {result.executor}."
    )


def chosen_line(result: Result) -> str:
    """The chosen cell: how it was chosen, on how many problems, and its faithfulness on the others."""
    judged = result.judged
    assert judged is not None, "a chosen cell is judged"
    sel, conf = judged["selection"], judged["confirmation"]
    return (
        f"Chosen on {result.n_selection} solved problems (the largest L_wait, then the smallest L_transfer, with "
        f"faithfulness >= {result.threshold}, a compute stage, and an interval above the constant guess; selection "
        f"{with_ci(sel['value'], sel['ci'])}): L_wait = {judged['wait']}, L_transfer = {judged['transfer']}, judged "
        f"on the other {result.n_confirmation}: faithfulness {with_ci(conf['value'], conf['ci'])} (constant guess "
        f"{conf['baseline']:.3f})."
    )


def claim_line(result: Result) -> str:
    """The search's verdict: its claim's outcome with its numbers, or why there is no cell to judge."""
    if result.claim is None or result.judged is None:
        return "no AF1 subgraph to judge: no cell leaves a layer to compute in"
    if result.chosen:
        return f"{outcome_text(result.claim)}; chosen on {result.n_selection} selection problems"
    at = (
        "the best eligible cell"
        if result.judged["eligible"]
        else "the best cell (none is eligible: no selection interval clears the constant guess)"
    )
    return (
        f"{outcome_text(result.claim)}; judged at {at}: none reaches {result.threshold} on the "
        f"{result.n_selection} selection problems"
    )


def overview_of(finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
    """Across models and tasks: one verdict line each, and AF1 per model and task on the confirmation split."""
    verdicts, faith = [], []
    for f in finished:
        result: Result = f.result
        judged = result.judged
        conf = judged["confirmation"] if judged else None
        verdicts.append(f"{f.task}: {verdict(result, f.description)}")  # several tasks: a line each, each says which
        faith.append(
            {
                "model": f.model,
                "task": f.task,
                "n_layers": result.n_layers,
                "base_accuracy": result.base_accuracy,
                "n_solved": result.n_solved,
                "threshold": result.threshold,
                "found": result.found,
                "chosen": result.chosen,
                "outcome": result.claim["outcome"] if result.claim else "no eligible cell",
                "wait": judged["wait"] if judged else None,
                "transfer": judged["transfer"] if judged else None,
                "faithfulness": conf,  # a rate on the confirmation split
                "n_confirmation": result.n_confirmation,
            }
        )
    parts = []
    if verdicts:
        parts.append("<h2>The AF1 claim per model</h2>")
        parts += [f"<p>{html.escape(f'{f.model} on {f.task}: {plain_words(f.result)}')}</p>" for f in finished]
        parts.append("<p>The verdicts with their numbers:</p><ul>")
        parts += [f"<li>{html.escape(line)}</li>" for line in verdicts]
        parts.append("</ul>")
    if faith:
        parts.append(
            "<h2>AF1 per model and task</h2><p>The cell the search chose on a selection part of the solved "
            "problems (largest L_wait, then smallest L_transfer, faithfulness at or above the threshold, a "
            "compute stage, an exact interval above the constant guess); where none reached the threshold, the best "
            "eligible cell, marked <i>best</i>. Faithfulness is measured on the other part (the confirmation "
            "split), with its exact 95 % interval, beside what a constant guess scores there. The claim 'an AF1 "
            "subgraph at the threshold' is <i>confirmed</i> where the one-sided exact binomial test above the "
            "threshold has p below 0.025, <i>rejected</i> where the test below it has, and <i>not confirmed</i> "
            "otherwise; a best cell is never confirmed.</p>"
        )
        header = ["model", "task", "layers", "base accuracy", "solved", "AF1", "wait", "transfer"]
        header += ["faithfulness (confirmation)", "n", "constant guess (same n)", "claim"]
        rows = [
            [
                r["model"],
                r["task"],
                r["n_layers"],
                rate_text(r["base_accuracy"]),
                r["n_solved"],
                "chosen" if r["chosen"] else f"best (< {r['threshold']})",
                r["wait"],
                r["transfer"],
                rate_text(r["faithfulness"]) if r["faithfulness"] else "-",
                r["n_confirmation"],
                r["faithfulness"]["baseline"] if r["faithfulness"] else None,
                r["outcome"],
            ]
            for r in faith
        ]
        if any((r["faithfulness"] or {}).get("by_layout") for r in faith):  # several token layouts: each one's part
            header.append("per token layout")
            for row, r in zip(rows, faith, strict=True):
                row.append(layouts_text((r["faithfulness"] or {}).get("by_layout")) or "one layout")
        parts.append(table_html(header, rows))
    return {"verdicts": verdicts, "faithfulness": faith}, parts


def plain_words(result: Result) -> str:
    """The search's verdict in plain words, from its claim alone: what the judged cell says about the last token
    and whether the held-out problems can tell."""
    claim = result.claim
    cell = result.judged
    if claim is None or cell is None:
        return "no cell of the grid leaves any block for the last token to compute in alone; nothing to judge."
    wait, transfer = cell["wait"], cell["transfer"]
    blocks = f"block{'s' if transfer > 1 else ''} {wait + 1}{f'-{wait + transfer}' if transfer > 1 else ''}"
    story = (
        (f"through block {wait} nothing specific to the problem reaches the last token; " if wait >= 0 else "")
        + (f"it reads the other tokens in {blocks}, " if transfer else "it never reads the other tokens, ")
        + "then computes the answer alone"
    )
    low, high = claim["ci"]

    def pct(v: float | None) -> str:  # more digits where rounding would land on the threshold
        return "nan" if v is None else f"{v:.2%}" if round(v, 2) == result.threshold else f"{v:.0%}"

    kept = (
        f"still answers {claim['estimate']:.0%} of the problems the unmodified model solves, on {claim['n']} "
        f"problems that did not choose it (95 % interval {pct(low)} to {pct(high)}; always giving the most common "
        f"answer would score {pct(claim['baseline'])})"
    )
    pick = "the search's pick (its rule takes the latest wait, then the fewest reading blocks; other cells may do "
    pick += "as well)"
    if claim["outcome"] == "confirmed":
        return f"{pick}: {story}. Cut so, the model {kept}: at least {result.threshold:.0%}, as claimed."
    if claim["outcome"] == "rejected":
        return (
            f"the judged cell ({story}) does not keep {result.threshold:.0%} of the answers: cut so, the model "
            f"{kept}, below {result.threshold:.0%} (other cells are not judged)."
        )
    more = f"; about {claim['n_to_decide']} would" if claim["n_to_decide"] else ""
    return (
        f"{pick}: {story}. Cut so, the model {kept}, so these problems cannot say whether it reaches "
        f"{result.threshold:.0%}{more}."
    )


def stages_text(stages: dict[str, list[int]]) -> str:
    def span(layers: list[int]) -> str:
        return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0]) if layers else "none"

    wait, transfer, compute = (span(stages[k]) for k in ("wait", "transfer", "compute"))
    return f"wait in blocks {wait}, transfer in {transfer}, compute in {compute}"


def verdict(search: Result, description: str | None = None) -> str:
    """One line per model: the search's claim with its outcome and numbers, where the judged cell would wait,
    transfer and compute, and the base accuracy."""
    name = search.model or "model"
    if description:  # a bundled model: which weights exactly (quantisation included)
        name = f"{name} [{', '.join(description.split(', ')[:2])}]"
    base_text = f"base accuracy {rate_text(search.base_accuracy)} on {search.n} problems ({search.n_solved} solved)"
    parts = search.judged["confirmation"].get("by_layout") if search.judged else None
    pooled = f"; pooled over token layouts ({layouts_text(parts)})" if parts else ""
    where = f"; the judged cell has it {stages_text(search.stages)}" if search.chosen and search.stages else ""
    return f"{name} ({search.n_layers} layers): {claim_line(search)}{where}{pooled}; {base_text}."


# What the experiments that run at the search's config read of it

NO_CELL = "its search found no cell whose interval clears the constant-guess baseline"


def searched(inputs: base.Inputs) -> Result | None:
    """The search result this unit reads (on its own model and task), or None when it reads none."""
    return inputs.one(Result)


def the_search(inputs: base.Inputs) -> Result:
    """The search result a unit at the search's config reads; a one-line error where the plan ran none."""
    search = searched(inputs)
    if search is None:
        raise Af1Error("no configuration to run at: give wait and transfer, or run the search first")
    return search


def searched_config(search: Result) -> AF1Config | None:
    """The AF1 config a search settled on: the cell it chose, else its best eligible cell; None when no cell
    is eligible (a finding: the units that read it say so)."""
    return search.config_at(search.config)


def check_found(inputs: base.Inputs, options: base.Options) -> None:
    """The unit does not apply when it is asked only where the search chose a cell on its selection split, and it
    chose none. The gate reads the selection half alone: what the confirmation half says never decides what runs."""
    if getattr(options, "require_found", False):
        search = searched(inputs)
        if search is None or search.chosen:
            return
        raise base.NotApplicable(
            f"no cell reaches faithfulness {search.threshold} on the selection split; asked only where the search "
            "chose a cell (require_found)"
        )


def config_of(inputs: base.Inputs, options: base.ConfigOptions, n_layers: int) -> AF1Config:
    """The configuration an experiment runs at: the options' fixed one, else the search's."""
    if options.wait is not None:
        config = AF1Config(wait=options.wait, transfer=options.transfer or 0, seed=inputs.spec.seed)
    else:
        config = searched_config(the_search(inputs))
        if config is None:  # a finding of the search, not a mistake of the caller
            raise base.NotApplicable(f"no configuration to run at: {NO_CELL} (or give wait and transfer)")
    config.check(n_layers)
    return config


def measured_on(inputs: base.Inputs, options: base.ConfigOptions, setup: Setup) -> tuple[Setup, str]:
    """Where a config is measured: all solved problems for a fixed config, the search's confirmation split for the
    search's own config (never the problems that chose it)."""
    if options.wait is not None:
        return setup, ALL_SOLVED
    search = the_search(inputs)
    on = allforone.search.confirmation(setup, search.selection_fraction, search.split_seed)
    return on, "the search's confirmation split"
