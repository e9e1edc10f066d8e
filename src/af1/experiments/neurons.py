"""neurons: which MLP neurons of the compute layers the last token computes the answer with, under AF1: attributed on
the selection part, the top k mean-ablated exactly on the confirmation part against random neurons of those layers."""

from __future__ import annotations

import html
import math

from pydantic import Field
from rich.table import Table

from af1.experiments import base, costs
from af1.experiments.search import config_of, searched
from af1.methods import allforone, heuristics, neurons
from af1.report import interactive
from af1.report.markup import Tab, figure_html, table_html
from af1.stats import rate_text, split_indices
from af1.tasks.evaluation import ProblemInputs

OWN_SPLIT = "the confirmation part of a seeded split of the solved problems"


class Options(base.ConfigOptions):
    draws: int = Field(default=5, ge=1, description="random sets of k neurons drawn from the same layers, per k")
    largest: int = Field(default=1024, ge=1, description="the largest set knocked out (sizes 1, 2, 4, ... up to it)")
    selection: float = Field(
        default=0.5, gt=0, lt=1, description="share of solved problems the neurons are ranked on (without a search)"
    )
    split_seed: int = Field(default=0, description="seed of that split (without a search; else the search's)")


class Result(base.SetupFields, neurons.Neurons):
    """The neurons' part (`neurons.Neurons`), where it was measured, and the exact inputs of both parts."""

    measured_on: str
    inputs: ProblemInputs | None = None  # sets: solved, selection, confirmation


class Neurons(base.Experiment):
    name = "neurons"
    Options = Options
    Result = Result
    small = {"wait": 0, "transfer": 1, "largest": 2, "draws": 2}
    cost = costs.Cost(slowdown=1.5)
    config_from_search = True

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """A forward and backward on the selection half, then the knock-out sets' faithfulness (and 64 neurons
        one by one)."""
        sets = (1 + options.draws) * (1 + math.log2(max(options.largest, 1))) + 64
        forward = 3 * s.half * s.on.step_tokens() * s.model.layers
        return forward + sets * s.faith + s.clean, sets * s.half * s.on.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        config = config_of(inputs, options, inputs.resources.lm().adapter.n_layers)
        setup = inputs.resources.setup(inputs.spec)
        search = searched(inputs) if options.wait is None else None
        split, where = (options.selection, options.split_seed), OWN_SPLIT
        if search is not None:
            split, where = (search.selection_fraction, search.split_seed), "the search's confirmation split"
        sel, conf = split_indices(len(setup.kept), *split)
        selection, confirmation = setup.on(sel), setup.on(conf)
        found = neurons.study(
            selection, confirmation, config, draws=options.draws, largest=options.largest, measured_on=where
        )
        chosen = [(n["layer"], n["neuron"]) for n in found.top[: heuristics.PATTERNS]]
        found.patterns = heuristics.patterns(setup, config, chosen, seed=inputs.spec.seed)
        return Result.of(
            confirmation.describe(),
            found,
            measured_on=where,
            inputs=allforone.faithfulness.setup_inputs(setup, selection=selection, confirmation=confirmation),
        )

    def tables(self, result: Result) -> list[Tab]:
        rows = []
        for k, top, randoms in zip(result.sizes, result.top_faithfulness, result.random_faithfulness, strict=True):
            rows.append([k, rate_text(top), sum(randoms) / len(randoms), min(randoms), max(randoms)])
        headers = ["k", "faithfulness, top k ablated [95 % CI]", "random sets of k: mean", "lowest", "highest"]
        top = [[n["layer"], n["neuron"], n["attribution"]] for n in result.top[:10]]
        return [
            Tab(headers, rows),
            Tab(["layer", "neuron", "attribution (selection part)"], top, title="The top 10 neurons"),
        ]

    def section(self, result: Result) -> list[str]:
        return [
            "<h2>Neurons of the compute stage</h2>",
            f"<p>Under AF1 at {result.config.cell}, the last token computes alone in "
            f"layers {', '.join(map(str, result.compute_layers))} ({result.neurons_per_layer} neurons each). Ranked "
            f"on {result.n_selection} problems of the selection part by attribution: {html.escape(result.attribution)}"
            f". Knocked out on {result.n_confirmation} problems ({html.escape(result.measured_on)}) with means "
            f"from the selection part, beside random sets of the same size and layers.</p>",
            *(f"<p>{html.escape(line)}</p>" for line in reading(result)),
            figure_html(lambda: interactive.neurons_plot(result)),
            *super().section(result),
            *patterns_html(result),
        ]

    def show(self, result: Result) -> list[Table | str]:
        return [*reading(result), *super().show(result)]


def patterns_html(result: Result) -> list[str]:
    """The top neurons' activation over the operands, and how much of it each grouping explains against chance."""
    if not result.patterns:
        return []
    rows = [
        [
            f"{p['layer']}.{p['neuron']}",
            *(f"{p['explained'][g]:.2f} ({p['explained_by_chance'][g]:.2f})" for g in heuristics.GROUPINGS),
            ", ".join(p["tags"]) or "-",
        ]
        for p in result.patterns
    ]
    return [
        f"<h3>What the top {len(result.patterns)} neurons respond to</h3><p>Each one's activation at the last "
        f"prompt token under AF1 on every solved problem, over the operands. Below, the share of its variance that "
        f"each grouping's means explain (eta squared), beside the 95th percentile of that share with the activations "
        f"shuffled across problems ({heuristics.SHUFFLES:,} shuffles); a neuron is tagged with the groupings above it. "
        "Descriptive and uncorrected: a first sketch of the heuristics, not a claim.</p>",
        interactive.neuron_patterns_plot(result.patterns),
        table_html(["neuron", *(f"{g} (chance)" for g in heuristics.GROUPINGS), "tags"], rows),
    ]


def reading(result: Result) -> list[str]:
    """AF1's faithfulness, and how many neurons it takes to lose half of it: the top ones and random ones."""

    def half(k: int | None) -> str:
        return f"{k}" if k is not None else f"none of the sizes up to {result.sizes[-1]}"

    v = result.verified
    checked = (
        f"The attribution checked on the selection part: its top {neurons.VERIFIED} neurons and "
        f"{v['n_ranked'] - neurons.VERIFIED} random others of the same layers each mean-ablated alone, exactly; "
        f"Spearman's rho between the estimated and the exact change of the answer's log-probability "
        f"{v['spearman']:.3f} [{v['spearman_ci'][0]:.3f}, {v['spearman_ci'][1]:.3f}] over these {v['n_ranked']} "
        f"neurons (n {v['n']}), {v['top_k_shared']:.0%} of the exact top {v['k']} in the estimate's."
    )
    return [
        f"Under AF1 alone: faithfulness {rate_text(result.faithfulness)} on "
        f"{result.n_confirmation} problems (constant guess {result.faithfulness['baseline']:.3f}). By the point "
        "estimate (descriptive, not tested), half of it is lost "
        f"with the top {half(result.half_faithfulness_top)} neurons (by the interval's upper end: "
        f"{half(result.half_faithfulness_top_interval)}); with random neurons of the same layers (the mean over "
        f"{len(result.random_faithfulness[0])} draws): {half(result.half_faithfulness_random)}."
        + (
            f" {result.pieces_without_means} (problem, answer step) pieces had no step of the selection part to "
            "take means from and kept their own activations."
            if result.pieces_without_means
            else ""
        ),
        checked,
    ]
