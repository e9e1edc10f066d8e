"""styles: base accuracy and AF1 faithfulness at one config for every input style (the paper's Table 4); the task's
own row on the search's confirmation half, the others on all their solved problems."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from af1.errors import Af1Error
from af1.experiments import base, costs
from af1.experiments.search import config_of, measured_on, searched
from af1.methods import allforone
from af1.report.markup import Tab
from af1.stats import rate_text
from af1.tasks.builtin import STYLES


class Options(base.ConfigOptions):
    styles: list[str] = Field(default_factory=lambda: list(STYLES), description="input styles")
    operations: list[str] | None = Field(default=None, description="operations (default: the task's own)")

    @model_validator(mode="after")
    def _check(self) -> Options:
        unknown = sorted(set(self.styles) - set(STYLES))
        if unknown:
            raise ValueError(f"unknown styles {unknown}; choose from {', '.join(STYLES)}")
        if (self.wait is None) != (self.transfer is None):
            raise ValueError("give both wait and transfer, or neither (then the search's config is used)")
        return self


class Result(base.Result, allforone.styles.StylesTable):
    """The styles' part (`allforone.styles.StylesTable`): one row per style, each with its own setup's description."""


class Styles(base.Experiment):
    name = "styles"
    Options = Options
    Result = Result
    small = {"styles": ["original", "verbal"]}
    cost = costs.Cost(slowdown=2.4, memory_factor=2.2)
    config_from_search = True

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t = s.on
        rows = len(options.styles) * len(options.operations or [None])
        one = t.n * (t.suffix + t.steps) * s.model.layers + s.clean + s.faith
        return rows * one, rows * t.n * t.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        spec = inputs.spec
        if spec.file is not None:
            raise base.NotApplicable("input styles are the built-in arithmetic tasks' (a task file has its own form)")
        lm = inputs.resources.lm()
        config = config_of(inputs, options, lm.adapter.n_layers)
        operations = tuple(options.operations or [spec.operation])
        own = None  # the task's own cell reuses the setup the other experiments share
        if spec.style in options.styles and spec.operation in operations:
            try:
                setup = inputs.resources.setup(spec)
            except Af1Error:  # a cell the model solves nothing of is a row with its error
                setup = None
            if setup is not None:  # at the search's config: on its confirmation half, beside its number
                own = (setup, *measured_on(inputs, options, setup))
        search = searched(inputs)
        threshold = search.threshold if search is not None else 0.9
        table = allforone.styles.styles_table(
            lm, config, spec, options.styles, operations, own=own, threshold=threshold
        )
        return Result.of(table)

    def tables(self, result: Result) -> list[Tab]:
        headers = ["style", "operation", "n", "base accuracy [95 % CI]", "solved", "AF1 faithfulness [95 % CI]"]
        headers += ["constant guess", "faithfulness measured on (n)"]
        return [Tab(headers, [row(r) for r in result.rows])]

    def section(self, result: Result) -> list[str]:
        return [
            f"<h2>Input styles (Table 4) at {result.config.cell}</h2>",
            *super().section(result),
        ]


def row(r: allforone.styles.StyleRow) -> list[Any]:
    """One style and operation: its base accuracy (or why it has none) and its faithfulness, with where measured."""
    return [
        r["style"],
        r["operation"],
        r.get("n"),
        rate_text(r["base_accuracy"]) if "base_accuracy" in r else r.get("error", ""),
        r.get("n_solved"),
        rate_text(r["faithfulness"]) if "faithfulness" in r else "-",
        r["faithfulness"]["baseline"] if "faithfulness" in r else None,
        f"{r['measured_on']} ({r['faithfulness']['n']})" if "measured_on" in r and "faithfulness" in r else "",
    ]
