"""attribution: how well attribution patching (one forward and backward) ranks heads against exact activation
patching (path patching by `total`).

On the same solved problems, every head's effect estimated to first order and measured exactly by activation
patching at the last position (path 'total', which the estimate approximates): Spearman's rho with its bootstrap
interval over problems, the top-k overlap, and the time each took."""

from __future__ import annotations

import html

from pydantic import Field

from af1.errors import Af1Error
from af1.experiments import base, costs
from af1.methods import heads
from af1.report import interactive
from af1.report.markup import Tab, figure_html
from af1.stats import with_ci
from af1.tasks.evaluation import ProblemInputs


class Options(base.Options):
    counterfactual: str | None = Field(
        default=None, description="as the heads study's: the operator (default), an operand, or a task file's slot"
    )
    k: int = Field(default=10, ge=1, description="the top k of both rankings compared")


class Result(base.SetupFields, heads.compared.Ranked):
    """The two rankings' part (`heads.compared.Ranked`) on the setup it was measured on."""

    inputs: ProblemInputs | None = None  # sets: solved


class Attribution(base.Experiment):
    name = "attribution"
    Options = Options
    Result = Result
    small = {"k": 2}
    cost = costs.Cost(slowdown=1.33)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """The estimate (clean forward and backward, counterfactual forward), then exact patching by 'total'."""
        t, solved = s.on, s.found.solved
        estimate = 4 * solved * t.step_tokens() * s.model.layers
        return estimate + costs.patching(s.model, t, solved), solved * t.steps * (2 + s.model.heads), 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        lm, spec = inputs.resources.lm(), inputs.spec
        if (reason := lm.adapter.no_attention_interface()) is not None:  # before any work
            exact = heads.compared.EXACT
            raise Af1Error(f"the exact counterpart, path '{exact}', needs transformers' attention interface ({reason})")
        setup = inputs.resources.setup(spec)  # refuses a task the model solves no problem of
        ranked = heads.compared.estimate_against_exact(lm, setup.kept, options.counterfactual, options.k, spec.seed)
        return Result.of(
            setup.describe(),
            ranked,
            inputs=ProblemInputs.of(setup.task, setup.base, solved=setup.kept),
        )

    def tables(self, result: Result) -> list[Tab]:
        a = result.agreement
        rho = with_ci(a["spearman"], a["spearman_ci"])
        return [
            Tab(
                ["heads", "problems", "Spearman's rho [95 % CI]", f"top {a['k']} shared", "estimate (s)", "exact (s)"],
                [[a["n_ranked"], a["n"], rho, a["top_k_shared"], result.estimate_seconds, result.exact_seconds]],
            )
        ]

    def section(self, result: Result) -> list[str]:
        speed = result.exact_seconds / max(result.estimate_seconds, 1e-9)
        return [
            "<h2>Attribution patching against exact activation patching (path patching by `total`)</h2>",
            f"<p>Every head's relative change of the correct logit when its output at the last position takes the "
            f"counterfactual's ({html.escape(result.counterfactual_kind)}: {html.escape(result.counterfactual)}), "
            f"on the same {result.n_patched} solved problems: estimated to first order (one forward and backward) and "
            f"measured exactly (path '{result.exact_path}': everything downstream recomputes). The estimate took "
            f"{result.estimate_seconds:.1f} s, the exact one {result.exact_seconds:.1f} s ({speed:.1f} times as long)."
            " The interval of rho resamples the problems.</p>",
            f"<p>{html.escape(strongest(result))}</p>",
            figure_html(lambda: interactive.attribution_plot(result)),
            *super().section(result),
        ]


def strongest(result: Result, k: int = 3) -> str:
    """The exact ranking's top k heads with their estimates and ranks by the estimate: where a first-order estimate
    misses a strong (saturating) head, it shows here."""
    exact = {
        (layer, h): v for layer, row in enumerate(result.exact_layer_head) for h, v in enumerate(row) if v is not None
    }
    estimate = {
        (layer, h): v
        for layer, row in enumerate(result.estimate_layer_head)
        for h, v in enumerate(row)
        if v is not None
    }
    by_estimate = {head: i + 1 for i, head in enumerate(sorted(estimate, key=lambda head: estimate[head]))}
    parts = [
        f"{layer}.{h} ({exact[layer, h]:+.4f}; estimated {estimate[layer, h]:+.4f}, rank {by_estimate[layer, h]} of "
        f"{len(estimate)} by the estimate)"
        for layer, h in sorted(exact, key=lambda head: exact[head])[:k]
    ]
    return f"The {k} heads with the strongest exact effect: " + ", ".join(parts) + "."
