"""prune: stop the transfer heads peeking one by one (greedy, selection split): faithfulness vs heads removed; the last
set above 95 % of unpruned checked on confirmation (with --wait, pass the search's --selection and --split-seed)."""

from __future__ import annotations

import html

from pydantic import Field
from rich.table import Table

from af1.errors import Af1Error
from af1.experiments import base, costs
from af1.experiments.search import config_of, searched
from af1.methods import allforone
from af1.report import interactive
from af1.report.markup import Tab, figure_html
from af1.stats import rate_text


class Options(base.ConfigOptions):
    selection: base.Share = Field(
        default=0.5, description="share of solved problems pruning ranks on (with --wait; else the search's)"
    )
    split_seed: int = Field(default=0, description="seed of the split (with --wait; else the search's)")
    whole_curve: bool = Field(
        default=False,
        description="rank every head, past the first drop (each round scores every remaining head: quadratic)",
    )


class Result(base.SetupFields, allforone.prune.Pruning):
    """Head pruning's part (`allforone.prune.Pruning`) on the setup it was measured on."""


class Prune(base.Experiment):
    name = "prune"
    Options = Options
    Result = Result
    small = {"wait": 0, "transfer": 1}
    cost = costs.Cost(slowdown=1.5, memory_factor=2.0)
    config_from_search = True

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """Greedy rounds over the transfer heads; the whole curve where it never drops."""
        heads = s.found.transfer * s.model.heads
        sets = heads * (heads + 1) / 2
        return (sets + 3) * s.faith + s.clean, sets * s.half * s.on.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        config = config_of(inputs, options, inputs.resources.lm().adapter.n_layers)  # refused before any work
        setup = inputs.resources.setup(inputs.spec)
        selection, seed = options.selection, options.split_seed
        if options.wait is None:  # the search's split, so its confirmation half stays unseen
            if config.transfer == 0:
                raise base.NotApplicable("the search's config has no transfer layers, so no heads to prune")
            search = searched(inputs)
            if search is None:  # config_of found the search's config, so this cannot happen: never a silent split
                raise Af1Error("the search's split is not available")
            selection, seed = search.selection_fraction, search.split_seed
        pruning = allforone.prune.prune_heads(
            setup, config, selection=selection, seed=seed, whole_curve=options.whole_curve
        )
        return Result.of(setup.describe(), pruning)

    def tables(self, result: Result) -> list[Tab]:
        removed = ["none", *(f"{layer}.{head}" for layer, head in result.prune_order)]
        rows = [
            [i, h, rate_text(r)] for i, (h, r) in enumerate(zip(removed, result.faithfulness_vs_pruned, strict=True))
        ]
        scored = f"faithfulness on {result.n_selection} selection problems [95 % CI]"
        return [Tab(["heads removed", "last removed (layer.head)", scored], rows)]

    def section(self, result: Result) -> list[str]:
        return [
            f"<h2>Head pruning in the transfer layers</h2><p>{html.escape(reading(result))}</p>",
            figure_html(lambda: interactive.pruning_plot(result)),
            *super().section(result),
        ]

    def show(self, result: Result) -> list[Table | str]:
        return [reading(result), *super().show(result)]


def reading(result: Result) -> str:
    """How the heads were pruned, where the curve first drops, and the pruned set against the unpruned on the
    confirmation problems (the verdict is the claim's, shown beside it)."""
    c = result.confirmation
    return (
        f"{result.n_transfer_heads} heads; ranked greedily by {result.measure}: {result.n_pruned_before_first_drop} "
        f"of them stop peeking before faithfulness first falls below {result.keep * 100:.0f} % of the unpruned "
        f"{result.faithfulness_vs_pruned[0]['value']:.3f} on {result.n_selection} selection problems (curve: "
        f"{result.curve}). On the other {result.n_confirmation} (confirmation): pruned "
        f"{rate_text(c['pruned']['faithfulness'])} vs unpruned {rate_text(c['unpruned']['faithfulness'])}; whether "
        "they need not peek is the claim's to say."
    )
