"""necessity: faithfulness when the last token cannot read the problem's tokens, layer by layer and in windows; and
inside the search's chosen cell the transfer window moved later, on its confirmation split."""

from __future__ import annotations

import html

from pydantic import Field, field_validator
from rich.table import Table

from af1.claims import Claim
from af1.experiments import base, costs
from af1.experiments.search import NO_CELL, config_of, searched, searched_config
from af1.interventions.af1 import AF1Config
from af1.methods import allforone
from af1.report import interactive
from af1.report.markup import Tab, claims_html, claims_lines, figure_html
from af1.stats import rate_text
from af1.tasks.evaluation import ProblemInputs


class Options(base.ConfigOptions):
    windows: list[int] = Field(default_factory=lambda: [1, 2, 4], description="widths of the blocked windows")

    @field_validator("windows")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or min(v) < 1:
            raise ValueError("windows must be a non-empty list of widths >= 1")
        return v


class Result(base.SetupFields, allforone.necessity.Necessity):
    """Necessity's part (`allforone.necessity.Necessity`) on the setup it was measured on."""

    no_config: str | None = None
    inputs: ProblemInputs | None = None  # sets: solved (windows); confirmation (the moved transfer window), if any


class Necessity(base.Experiment):
    name = "necessity"
    Options = Options
    Result = Result
    small = {"windows": [1]}
    cost = costs.Cost(slowdown=1.4)

    def uses(self) -> tuple[str, ...]:
        return (base.SEARCH,)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t, L, found = s.on, s.model.layers, s.found
        widths = [w for w in options.windows if w <= L]
        sets = sum(L - w + 1 for w in widths)  # each window from its first layer to the top, one row each
        passes = sum(L * (L + 1) / 2 - w * (w - 1) / 2 for w in widths)
        moved = (L - found.transfer - max(found.wait, 0)) * s.faith if found.transfer else 0
        capture = found.solved * t.step_tokens() * L
        return capture + found.solved * t.steps * passes + moved, found.solved * t.steps * sets, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        n_layers = inputs.resources.lm().adapter.n_layers
        fixed = config_of(inputs, options, n_layers) if options.wait is not None else None  # before any work
        setup = inputs.resources.setup(inputs.spec)
        search = searched(inputs)
        found: AF1Config | None = None
        found_on = None
        note = None
        if fixed is not None:
            found = fixed
        elif search is not None:
            found = searched_config(search)
            if found is None:  # the unmodified model's windows still say where the last token reads
                note = f"the transfer window is not moved: {NO_CELL}"
            else:
                found_on = allforone.search.confirmation(setup, search.selection_fraction, search.split_seed)
        threshold = search.threshold if search is not None else 0.9
        result = allforone.necessity.necessity(
            setup, windows=options.windows, found=found, found_on=found_on, threshold=threshold
        )
        halves = {} if found_on is None else {"confirmation": found_on}
        return Result.of(
            setup.describe(),
            result,
            no_config=note,
            inputs=allforone.faithfulness.setup_inputs(setup, **halves),
        )

    def tables(self, result: Result) -> list[Tab]:
        lowest = []
        for w, rates in result.windows.items():
            at = min(range(len(rates)), key=lambda i: rates[i]["value"])
            lowest.append([w, rate_text(rates[at]), at])
        per_layer = [
            [i, *(v[i]["value"] if i < len(v) else "" for v in result.windows.values())] for i in range(result.n_layers)
        ]
        return [
            Tab(["window", "lowest faithfulness [95 % CI]", "at first layer"], lowest),
            Tab(
                ["first blocked layer", *(f"window {w}" for w in result.windows)],
                per_layer,
                title="Faithfulness per first blocked layer",
            ),
        ]

    def section(self, result: Result) -> list[str]:
        shown, sentence = necessary(result.claims)
        return [
            "<h2>Necessity</h2><p>In the unmodified model the last token is kept from reading every non-context "
            "position in one layer or a window of layers; right: inside the search's chosen cell the transfer "
            "window is moved later.</p>",
            figure_html(lambda: interactive.necessity_plot(result, result.n_solved)),
            *(t.html() for t in self.tables(result)),
            f"<p>{html.escape(sentence)}</p>" if sentence else "",
            claims_html(shown),
            others_html([c for c in result.claims if c not in shown]),
        ]

    def show(self, result: Result) -> list[Table | str]:
        shown, sentence = necessary(result.claims)
        return [*(t.rich() for t in self.tables(result)), *([sentence] if sentence else []), *claims_lines(shown)]


def others_html(claims: list[Claim]) -> str:
    """The windows' claims that were not confirmed, folded: every claim is in the report with its outcome."""
    if not claims:
        return ""
    summary = f"The other {len(claims)} windows' claims (rejected or not confirmed)"
    return f"<details class='claims'><summary><b>{summary}</b></summary>{claims_html(claims)}</details>"


def necessary(claims: list[Claim]) -> tuple[list[Claim], str]:
    """The windows whose blocking is confirmed to break the answer, and a sentence that counts every outcome in the
    family they were tested in ("" where nothing was tested)."""
    if not claims:
        return [], ""
    shown = [c for c in claims if c["outcome"] == "confirmed"]
    rejected = sum(c["outcome"] == "rejected" for c in claims)
    return shown, (
        f"Each window tested: 'blocking it leaves faithfulness below the threshold' ({claims[0]['family']}). "
        f"{len(shown)} of {len(claims)} confirmed, {rejected} rejected (faithfulness stays above the threshold), "
        f"{len(claims) - len(shown) - rejected} not confirmed"
        + (
            ": blocking a confirmed window leaves faithfulness below the threshold."
            if shown
            else "; no window is shown to lower faithfulness below the threshold."
        )
    )
