"""run: faithfulness of one AF1(wait, transfer) configuration on the problems the model solves, every problem
listed."""

from __future__ import annotations

from pydantic import Field

from af1.experiments import base, costs
from af1.experiments.search import config_of, measured_on
from af1.interventions.af1 import Ablation
from af1.interventions.masks import ABPVariant
from af1.methods import allforone
from af1.methods.setup import ALL_SOLVED
from af1.report.markup import Tab, layout_tab, stages_tab
from af1.stats import rate_text


class Options(base.ConfigOptions):
    ablation: Ablation = Field(default="cama", description="cama, zero, mean, resample or none")
    abp: ABPVariant = Field(default="af1", description="af1, none, sink, all-peek or zero-output")
    reference: bool = Field(default=False, description="the hook-based path instead of the fast executor")


class Result(base.SetupFields, allforone.faithfulness.AtConfig):
    """One configuration's part (`allforone.faithfulness.AtConfig`) on the problems it was measured on."""

    measured_on: str = ALL_SOLVED


class Run(base.Experiment):
    name = "run"
    Options = Options
    Result = Result
    small = {"wait": 0, "transfer": 1}
    cost = costs.Cost(slowdown=1.2)
    config_from_search = True

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        return s.faith + s.clean, s.half * s.on.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        config = config_of(inputs, options, inputs.resources.lm().adapter.n_layers)  # refused before any work
        setup = inputs.resources.setup(inputs.spec)
        config = config.model_copy(update={"ablation": options.ablation, "abp": options.abp})
        on, where = measured_on(inputs, options, setup)
        # described as measured: on the search's confirmation split, n_solved is that split's n
        return Result.of(
            on.describe(),
            allforone.faithfulness.run_result(on, config, options.reference),
            measured_on=where,
        )

    def tables(self, result: Result) -> list[Tab]:
        r = result
        executor = r.executor + (f" ({r.fallback_reason})" if r.fallback_reason else "")
        return [
            Tab(
                [
                    "wait",
                    "transfer",
                    "ablation",
                    "ABP",
                    "solved",
                    "faithfulness [95 % CI]",
                    "constant guess",
                    "executor",
                ],
                [
                    [
                        r.config.wait,
                        r.config.transfer,
                        r.config.ablation,
                        r.config.abp,
                        r.n_solved,
                        rate_text(r.faithfulness),
                        r.faithfulness["baseline"],
                        executor,
                    ]
                ],
            ),
            layout_tab("Faithfulness", r.faithfulness.get("by_layout"), r.layouts),
            stages_tab(r.stages),
        ]

    def section(self, result: Result) -> list[str]:
        return [
            f"<h2>AF1 at {result.config.cell}</h2><p>On {result.n_solved} problems ({result.measured_on}).</p>",
            *super().section(result),
        ]
