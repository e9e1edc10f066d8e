"""alternatives: at one config: CAMA vs zero, mean, resample and no ablation; ABP vs its variants, each paired with
the configured intervention on the same problems (exact McNemar)."""

from __future__ import annotations

import html
from typing import Any

from af1.claims import Claim
from af1.experiments import base, costs
from af1.experiments.search import config_of, measured_on
from af1.methods import allforone
from af1.methods.setup import ALL_SOLVED
from af1.report.markup import Tab, claims_html
from af1.stats import rate_text
from af1.tasks.evaluation import ProblemInputs


class Options(base.ConfigOptions):
    pass


class Result(base.SetupFields, allforone.alternatives.Alternatives):
    """The alternatives' part (`allforone.alternatives.Alternatives`) on the setup it was measured on."""

    measured_on: str = ALL_SOLVED
    inputs: ProblemInputs | None = None  # sets: solved; confirmation when measured there


def rows(detail: dict[str, Any], kind: str, claims: list[Claim]) -> list[list[str]]:
    """One row per intervention: faithfulness with its interval (resample: mean ± std over seeds), and its claim
    against the configured one (outcome, raw and adjusted p); the configured row has none."""
    by_subject = {c["subject"]: c for c in claims}
    out = []
    for name, v in detail.items():
        cell = rate_text(v["faithfulness"]) + (" seeds" if "per_seed" in v else "")
        claim = by_subject.get(f"{kind} {name}")
        if claim is None:
            out.append([name, cell, "configured", "", ""])
        else:
            out.append([name, cell, claim["outcome"], f"{claim['p_value']:.2g}", f"{claim['p_adjusted']:.2g}"])
    return out


HEADER = ["faithfulness [95 % CI]", "differs from the configured one?", "p", "p adjusted (Holm)"]


class Alternatives(base.Experiment):
    name = "alternatives"
    Options = Options
    Result = Result
    small = {}
    cost = costs.Cost(slowdown=1.2)
    config_from_search = True

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t, after = s.on, s.model.layers - 1 - max(s.found.wait, 0)
        shared = 10 * s.half * t.step_tokens() * after + 5 * s.half * t.step_tokens() * (s.found.wait + 1)
        return shared + 4 * s.faith + s.clean, 14 * s.half * t.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        config = config_of(inputs, options, inputs.resources.lm().adapter.n_layers)  # refused before any work
        setup = inputs.resources.setup(inputs.spec)
        on, where = measured_on(inputs, options, setup)
        halves = {} if on is setup else {"confirmation": on}
        return Result.of(
            on.describe(),  # described as measured: n_solved is the problems every row is paired on
            allforone.alternatives.alternatives(on, config, measured_on=where),
            measured_on=where,
            inputs=allforone.faithfulness.setup_inputs(setup, **halves),
        )

    def tables(self, result: Result) -> list[Tab]:
        return [
            Tab(["ablation at L_wait (ABP af1)", *HEADER], rows(result.ablations, "ablation", result.claims)),
            Tab(["ABP variant (CAMA)", *HEADER], rows(result.abp_variants, "ABP", result.claims)),
        ]

    def section(self, result: Result) -> list[str]:
        family = result.claims[0]["family"] if result.claims else ""
        return [
            f"<h2>Alternatives at {result.config.cell}</h2>"
            f"<p>On {result.n_solved} problems ({result.measured_on}); each alternative is paired against the "
            f"configured intervention on the same problems, the tests adjusted together ({html.escape(str(family))})."
            "</p>",
            *(t.html() for t in self.tables(result)),  # each row holds its claim's outcome
            claims_html(result.claims),  # and each claim its numbers: the difference, its interval, n to decide
        ]
