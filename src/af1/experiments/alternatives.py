"""alternatives: at one config, CAMA against zero, mean, resample and no ablation, and ABP against its variants,
each paired with the configured intervention on the same problems (exact McNemar)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from af1.experiments import base
from af1.methods import allforone
from af1.report.markup import ci_text, table_html
from af1.tasks.evaluation import ProblemInputs


class Options(base.ConfigOptions):
    pass


class Result(base.SetupFields):
    wait: int
    transfer: int
    configured: allforone.Configured  # the intervention every row is paired against, with its faithfulness
    ablations: dict[str, float]
    abp_variants: dict[str, float]
    ablations_detail: dict[str, allforone.Alternative | allforone.Resampled]
    abp_variants_detail: dict[str, allforone.Alternative]
    measured_on: str = "the solved problems"
    inputs: ProblemInputs | None = None  # sets: solved; confirmation when measured there


def rows(detail: dict[str, Any]) -> list[list[str]]:
    """One row per intervention: faithfulness with its interval (resample: mean ± std over seeds), McNemar p."""
    out = []
    for k, v in detail.items():
        if "per_seed" in v:  # resample: the median seed's p, never the most favourable one
            ps = sorted(s["mcnemar_vs_configured"]["p_value"] for s in v["per_seed"])
            cell = f"{v['faithfulness']:.3f} ± {v['faithfulness_std']:.3f} ({v['seeds']} seeds)"
            out.append([k, cell, f"median over seeds {ps[len(ps) // 2]:.2g} (largest {ps[-1]:.2g})"])
        else:
            out.append(
                [k, ci_text(v["faithfulness"], v["faithfulness_ci"]), f"{v['mcnemar_vs_configured']['p_value']:.2g}"]
            )
    return out


class Alternatives(base.Experiment):
    name = "alternatives"
    help = "At one config: CAMA vs zero, mean, resample and no ablation; ABP vs its variants (McNemar)."
    Options = Options
    Result = Result
    config_from_search = True

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        config = base.config_of(inputs, options, inputs.resources.lm().adapter.n_layers)  # refused before any work
        setup = inputs.resources.setup(inputs.spec)
        on, where = base.measured_on(inputs, options, setup)
        halves = {} if on is setup else {"confirmation": on}
        return Result(
            **on.describe().fields(),  # described as measured: n_solved is the problems every row is paired on
            **allforone.alternatives(on, config),
            measured_on=where,
            inputs=allforone.setup_inputs(setup, **halves),
        )

    def section(self, result: Result, out_dir: Path) -> list[str]:
        header = ["faithfulness [95 % CI]", "McNemar p vs CAMA + ABP"]
        return [
            f"<h2>Alternatives at L_wait = {result.wait}, L_transfer = {result.transfer}</h2>"
            f"<p>On {result.n_solved} problems ({result.measured_on}).</p>",
            table_html(["ablation at L_wait (ABP af1)", *header], rows(result.ablations_detail)),
            table_html(["ABP variant (CAMA)", *header], rows(result.abp_variants_detail)),
        ]

    def show(self, result: Result) -> list[Table | str]:
        table = Table("intervention", "faithfulness [95 % CI]", "McNemar p vs CAMA + ABP af1")
        for kind, detail in (
            ("ablation {} + ABP af1", result.ablations_detail),
            ("CAMA + ABP {}", result.abp_variants_detail),
        ):
            for name, cell, p in rows(detail):
                table.add_row(kind.format(name), cell, p)
        return [table]
