"""Input styles: one configuration (the search's or a fixed one) on the task's other phrasings (words, symbols,
spacing)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, rate_above
from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.faithfulness import faith_fields, faithfulness, setup_inputs
from af1.methods.setup import ALL_SOLVED, Setup, prepare
from af1.models import LoadedModel
from af1.progress import progress
from af1.results import Part
from af1.stats import Rate, constant_baseline
from af1.tasks.spec import TaskSpec


@with_config(ConfigDict(extra="forbid"))
class StyleRow(TypedDict):
    """One (input style, operation) of the styles table: its base accuracy and its faithfulness at the config, with
    the problems measured on and their inputs; or why the style could not be measured (`error`)."""

    style: str
    operation: str
    error: NotRequired[str]
    n: NotRequired[int]
    n_solved: NotRequired[int]
    base_accuracy: NotRequired[Rate]
    measured_on: NotRequired[str]
    faithfulness: NotRequired[Rate]
    executor: NotRequired[str]
    fallback_reason: NotRequired[str | None]
    inputs: NotRequired[dict[str, Any]]  # ProblemInputs, dumped


class StylesTable(Part):
    """The Table-4 analogue (`styles_table`): one row per style and operation at one config."""

    config: AF1Config
    scoring: str
    rows: list[StyleRow]
    threshold: float
    claims: list[Claim]  # the config keeps the threshold on each measured row: one family (Holm)


def styles_table(
    lm: LoadedModel,
    config: AF1Config,
    base_spec: TaskSpec,
    styles: list[str],
    operations: tuple[str, ...] = ("a+b", "a-b"),
    own: tuple[Setup, Setup, str] | None = None,
    threshold: float = 0.9,
) -> StylesTable:
    """The Table-4 analogue: per style and operation, base accuracy and faithfulness at one config, each row claiming it
    keeps `threshold` (adjusted); `own`: the task's own cell, whose row on the search's half its claim decides."""
    rows = []
    claims = []
    chose: set[tuple] = set()  # the operands of the problems that chose the config (none: a fixed config)
    judged_by_search = None  # the spec whose row the search's own claim decides (none: a fixed config)
    if own is not None and own[1] is not own[0]:
        judged_by_search = own[0].spec
        chose = {p.operands for p in own[0].kept.problems} - {p.operands for p in own[1].kept.problems}
    for style in progress(styles, desc="styles"):
        for op in operations:
            spec = base_spec.model_copy(update={"operation": op, "style": style})
            try:
                if own is not None and own[0].spec == spec:
                    setup, on, where = own
                else:
                    setup = prepare(lm, spec)
                    on, where = unseen(setup, chose)
            except Af1Error as exc:
                rows.append(StyleRow(style=style, operation=op, error=str(exc)))
                continue
            described = setup.describe()
            halves = {} if on is setup else {"confirmation": on}
            scores = faithfulness(on, config)
            if spec != judged_by_search:
                claims.append(
                    rate_above(
                        About(
                            "style_keeps",
                            f"at {config.cell} the last token still answers at least {threshold} of {style} {op}",
                            f"{where} ({len(on.kept)})",
                            f"{style} {op}",
                            constant_baseline(on.kept.targets(), on.kept.layout_P.tolist()),
                        ),
                        scores.correct_P.tolist(),
                        threshold,
                    )
                )
            rows.append(
                StyleRow(
                    style=style,
                    operation=op,
                    n=described.n,
                    n_solved=described.n_solved,
                    base_accuracy=described.base_accuracy,
                    measured_on=where,
                    **faith_fields(on, scores),
                    inputs=setup_inputs(setup, **halves).model_dump(),
                )
            )
    return StylesTable(
        config=config,
        scoring=base_spec.scoring,
        rows=rows,
        threshold=threshold,
        claims=adjust(claims, f"styles at {config.cell}"),
    )


def unseen(setup: Setup, chose: set[tuple]) -> tuple[Setup, str]:
    """The solved problems whose operands did not choose the config (the same sums in another phrasing are not
    out of sample), and what they are."""
    if not chose:
        return setup, ALL_SOLVED
    index = [i for i, p in enumerate(setup.kept.problems) if p.operands not in chose]
    if not index:
        raise Af1Error("every solved problem has the operands of a problem that chose the config")
    return setup.on(index), "the solved problems whose operands did not choose the config"
