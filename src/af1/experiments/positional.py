"""positional: how well attention logits split into a position term plus a meaning term, per layer and head.

Against a random-init and a shuffled control, with the perplexity cost of perturbing positions."""

from __future__ import annotations

import html
from pathlib import Path

from pydantic import Field
from rich.table import Table

from af1.experiments import base
from af1.methods import positional
from af1.report.markup import claims_html, claims_lines, image_html, table_html
from af1.stats import with_ci


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


SHOWN = (
    "r_mean",
    "r_median",
    "r_median_row_centred",
    "r_median_no_sink",
    "r_median_random_init",
    "r_median_random_init_row_centred",
    "r_median_norm_matched",
    "r_median_norm_matched_row_centred",
    "r_median_shuffled",
    "r_median_shuffled_row_centred",
    "dummy_distance_r2_median",
)


class Positional(base.Experiment):
    name = "positional"
    Options = Options
    Result = Result
    scope = "model"
    figure = "positional.png"

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        lm = inputs.resources.lm()
        config = positional.study.PositionalConfig(
            window=options.window, n_windows=options.n_windows, seed=options.seed
        )
        return Result.of(positional.study.study(lm.adapter, lm.tokenizer, config, options.corpus))

    def draw(self, result: Result, out_dir: Path, inputs: base.Inputs) -> Path:
        from af1.report import figures  # matplotlib: only when drawing

        return figures.positional_figures(result, out_dir / "positional.png")

    def section(self, result: Result, out_dir: Path) -> list[str]:
        held = result.heldout
        parts = [
            "<h2>Attention logits: position + meaning</h2>",
            f"<p>Corpus: {html.escape(result.corpus)}; {result.n_windows} windows of {result.window} tokens (the "
            "intervals resample them). Per "
            "head, W[i,j] ~ a[i-j] + b[i] + c[j] over the causal triangle (backfitting); the paper reports r = 0.959 "
            "on its own (unpublished) corpus and averaging.</p>",
            table_html(
                ["r per head (in sample: fitted and judged on the same logits)", "mean", "median", "q1", "q3"],
                [
                    [k.replace("_", " "), v["mean"], v["median"], v["q1"], v["q3"]]
                    for k, v in result.distribution.items()
                ],
            ),
        ]
        if held is not None:
            parts += [
                f"<p><b>Out of sample.</b> The free key term c[j] refits whatever the logits are (about 3T numbers per "
                "window), so the in-sample r above cannot fail. The held-out test fits W[i,j] ~ a[i-j] + b[i] + "
                f"c[token of j] on {len(held['train_windows'])} windows and measures the row-centred r on the other "
                f"{len(held['test_windows'])}: median over heads {with_ci(held['r_median'], held['r_median_ci'])}; "
                f"position alone {with_ci(held['r_position_only_median'], held['r_position_only_median_ci'])}; the "
                f"same tokens shuffled {with_ci(held['r_shuffled_median'], held['r_shuffled_median_ci'])}; random "
                f"weights over {len(held['random_init_seeds'])} seeds "
                f"{with_ci(held['r_random_init_mean'], held['r_random_init_range'])} (where one such model falls: a "
                "95 % prediction interval).</p>",
                claims_html(held["claims"]),
            ]
        if result.dummy_distance_r2_median is not None:
            parts.append(
                "<p>Dummy-distance test: median R&sup2; of the (distance, key) additive fit "
                f"{result.dummy_distance_r2_median:.3f}.</p>"
            )
            parts.append(
                table_html(
                    [
                        "RoPE band (0 = highest frequency)",
                        "share of logit variance",
                        "key energy: token-independent mean",
                        "key energy: token-dependent",
                    ],
                    [
                        [b, s, m, t]
                        for b, (s, m, t) in enumerate(
                            zip(
                                result.band_logit_variance_share or [],
                                result.band_key_energy_mean or [],
                                result.band_key_energy_token or [],
                                strict=True,
                            )
                        )
                    ],
                )
            )
        parts.append(image_html(out_dir, "positional.png"))
        return parts

    def show(self, result: Result) -> list[Table | str]:
        table = Table("measure", "value")
        for key in SHOWN:
            value = getattr(result, key)
            table.add_row(key, "skipped" if value is None else f"{value:.3f}")
        for fraction, ppl in result.perplexity_vs_swap.items():
            table.add_row(
                f"perplexity, {float(fraction):.0%} adjacent tokens swapped", "-" if ppl is None else f"{ppl:.2f}"
            )
        held = result.heldout
        if held is None:
            return [table]
        table.add_row("held-out r (position + token meaning), median", with_ci(held["r_median"], held["r_median_ci"]))
        table.add_row(
            f"held-out r, random weights ({len(held['random_init_seeds'])} seeds; where one falls)",
            with_ci(held["r_random_init_mean"], held["r_random_init_range"]),
        )
        return [table, *claims_lines(held["claims"], "claims (held-out windows)")]
