"""positional: how well attention logits split into a position term plus a meaning term, per layer and head, against
random-init and shuffled controls, with the perplexity cost of perturbing positions."""

from __future__ import annotations

import html

from pydantic import Field
from rich.table import Table

from af1.experiments import base, costs
from af1.methods import positional
from af1.report import interactive
from af1.report.markup import Tab, claims_html, claims_lines, figure_html
from af1.stats import with_ci

FIT_FLOPS = 2.2e6  # FLOPs per attention logit in the study's fits (all their iterations; its cost)


class Options(base.Options):
    window: int = Field(default=64, ge=8, description="tokens per window of the corpus")
    n_windows: int = Field(
        default=16,
        ge=1,
        description="windows of the corpus (the intervals resample them: fewer than 10 are warned about)",
        json_schema_extra={"flag": "--windows"},
    )
    seed: int = Field(default=0, description="seed of the random-init and shuffled controls")
    corpus: str | None = Field(default=None, description="a text file (default: the shipped public-domain sample)")


class Result(base.Result, positional.study.Positional):
    """The positional study's part (`positional.study.Positional`): a statistic over no finite value is NaN,
    written as null, so every number may be None."""


class Positional(base.Experiment):
    name = "positional"
    Options = Options
    Result = Result
    small = {"window": 32, "n_windows": 2}
    cost = costs.Cost(slowdown=0.99, memory_factor=3.2)
    scope = "model"

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """Corpus windows through the model about 22 times, and its fits over every attention logit."""
        windows, width, L = float(options.n_windows), float(options.window), s.model.layers
        return 22 * windows * width * L, 13 * windows * width, FIT_FLOPS * s.model.heads * L * windows * width**2

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        lm = inputs.resources.lm()
        config = positional.study.PositionalConfig(
            window=options.window, n_windows=options.n_windows, seed=options.seed
        )
        return Result.of(positional.study.study(lm.adapter, lm.tokenizer, config, options.corpus))

    def tables(self, result: Result) -> list[Tab]:
        tabs = [
            Tab(
                ["r per head (in sample: fitted and judged on the same logits)", "mean", "median", "q1", "q3"],
                [
                    [k.replace("_", " "), v["mean"], v["median"], v["q1"], v["q3"]]
                    for k, v in result.distribution.items()
                ],
            )
        ]
        if (held := result.heldout) is not None:
            rows = [
                ["position + token meaning", with_ci(held["r_median"], held["r_median_ci"])],
                ["position alone", with_ci(held["r_position_only_median"], held["r_position_only_median_ci"])],
                ["the same tokens shuffled", with_ci(held["r_shuffled_median"], held["r_shuffled_median_ci"])],
                [
                    f"random weights, {len(held['random_init_seeds'])} seeds (where one such model falls: 95 % "
                    "prediction interval)",
                    with_ci(held["r_random_init_mean"], held["r_random_init_range"]),
                ],
                [
                    "random weights rescaled to the trained norms, the same seeds",
                    with_ci(held["r_norm_matched_mean"], held["r_norm_matched_range"]),
                ],
            ]
            tabs.append(Tab(["held-out r (row-centred)", "median over heads [95 % CI]"], rows))
        swaps = result.perplexity_vs_swap
        tabs.append(
            Tab(
                [result.swap_fraction, "perplexity, tokens swapped", "perplexity, position ids swapped"],
                [
                    [f"{float(f):.0%}", with_ci(swaps[f]), with_ci(result.perplexity_vs_position_swap.get(f))]
                    for f in swaps
                ],
            )
        )
        if result.dummy_distance_r2_median is not None:
            bands = zip(
                result.band_logit_variance_share or [],
                result.band_key_energy_mean or [],
                result.band_key_energy_token or [],
                strict=True,
            )
            tabs += [
                Tab(
                    ["dummy-distance test", "median R² of the (distance, key) additive fit"],
                    [["per head", result.dummy_distance_r2_median]],
                ),
                Tab(
                    [
                        "RoPE band (0 = highest frequency)",
                        "share of logit variance",
                        "key energy: token-independent mean",
                        "key energy: token-dependent",
                    ],
                    [[b, *values] for b, values in enumerate(bands)],
                ),
            ]
        return tabs

    def section(self, result: Result) -> list[str]:
        held = result.heldout
        parts = [
            "<h2>Attention logits: position + meaning</h2>",
            f"<p>Corpus: {html.escape(result.corpus)}; {result.n_windows} windows of {result.window} tokens (the "
            "intervals resample them). Per head, W[i,j] ~ a[i-j] + b[i] + c[j] over the causal triangle "
            "(backfitting); the paper reports r = 0.959 on its own (unpublished) corpus and averaging.</p>",
        ]
        if held is not None:
            parts.append(
                f"<p><b>Out of sample.</b> The free key term c[j] refits whatever the logits are (about 3T numbers per "
                "window), so the in-sample r cannot fail. The held-out test fits W[i,j] ~ a[i-j] + b[i] + "
                f"c[token of j] on {len(held['train_windows'])} windows and measures the row-centred r on the other "
                f"{len(held['test_windows'])}, beside position alone, the same tokens shuffled and random weights (as "
                "initialised, and rescaled to the trained model's norm of every weight tensor).</p>"
            )
        return [
            *parts,
            *(t.html() for t in self.tables(result)),
            claims_html(held["claims"] if held else None),
            figure_html(lambda: interactive.positional_plot(result)),
        ]

    def show(self, result: Result) -> list[Table | str]:
        held = result.heldout
        return [
            *(t.rich() for t in self.tables(result) if t.rows),
            *claims_lines(held["claims"] if held else None, "claims (held-out windows)"),
        ]
