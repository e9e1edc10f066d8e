"""Faithfulness: the solved problems' scores under one AF1 configuration, each with its exact input."""

from __future__ import annotations

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.executors.protocol import Executor, recorded
from af1.interventions.af1 import AF1Config
from af1.methods.setup import Setup, executors
from af1.results import Part
from af1.stats import Rate
from af1.tasks.evaluation import ProblemInputs, Scores, decoder
from af1.tasks.task import ProblemRow


def faithfulness(setup: Setup, config: AF1Config, reference: bool = False) -> Scores:
    """Scores of the solved problems under AF1, every answer step under the same intervention."""
    return scored(setup, config, executors(setup, config, reference))


def scored(setup: Setup, config: AF1Config, chosen: list[tuple[Executor, str | None]]) -> Scores:
    """Scores under AF1 by the executors already picked for the setup's steps (`executors`)."""
    logits = [executor.logits(step, config) for step, (executor, _) in zip(setup.steps, chosen, strict=True)]
    scores = Scores.from_steps(setup.kept, logits)
    scores.executor = recorded(chosen)
    return scores


@with_config(ConfigDict(extra="forbid"))
class Faithfulness(TypedDict):
    """Faithfulness on the solved problems as one rate (its interval, constant guess and n; each layout's part, for a
    task of several), and the executor that measured it (absent where several configs ran in one batched pass)."""

    faithfulness: Rate
    executor: NotRequired[str]
    fallback_reason: NotRequired[str | None]


def faith_fields(setup: Setup, scores: Scores) -> Faithfulness:
    """Faithfulness on the solved problems (a rate), with the executor that ran it."""
    fields = Faithfulness(faithfulness=scores.rate(setup.kept))
    if scores.executor is not None:
        fields["executor"], fields["fallback_reason"] = scores.executor["executor"], scores.executor["fallback_reason"]
    return fields


def problem_rows(setup: Setup, intervened: Scores | None = None) -> list[ProblemRow]:
    """Every problem as fed (text and ids), whether the full model solved it, and how it fared under AF1."""
    rows = setup.task.rows()
    under = {}
    if intervened is not None:
        under = {
            id(p): (bool(c), pred)
            for p, c, pred in zip(setup.kept.problems, intervened.correct_P, intervened.predicted_PA, strict=True)
        }
    decode = decoder(setup.lm.tokenizer)
    for i, row in enumerate(rows):
        row["solved"] = bool(setup.base.correct_P[i])
        row["predicted_tokens"] = setup.base.predicted_PA[i]
        row["predicted_text"] = decode(row["predicted_tokens"])
        if intervened is not None:
            hit = under.get(id(setup.task.problems[i]))
            row["right_under_intervention"] = None if hit is None else hit[0]
            row["predicted_tokens_under_intervention"] = None if hit is None else hit[1]
            row["predicted_text_under_intervention"] = None if hit is None else decode(hit[1])
    return rows


def setup_inputs(setup: Setup, **halves: Setup) -> ProblemInputs:
    """The inputs of a result measured on a setup: every evaluated problem, the solved ones, and each further set
    its numbers were measured on (a split's half, `Setup.on`), by name."""
    return ProblemInputs.of(setup.task, setup.base, solved=setup.kept, **{k: h.kept for k, h in halves.items()})


class AtConfig(Part):
    """One AF1 configuration measured (`run_result`): layers and stages, faithfulness (`Faithfulness`'s fields) with its
    executor, the mean probability of the correct answer, and every problem's prediction under AF1."""

    config: AF1Config
    stages: dict[str, list[int]]
    faithfulness: Rate
    executor: str
    fallback_reason: str | None = None
    mean_p_correct: float
    problems: list[ProblemRow]


def run_result(setup: Setup, config: AF1Config, reference: bool = False) -> AtConfig:
    """One AF1 evaluation with every problem listed."""
    scores = faithfulness(setup, config, reference)
    return AtConfig(
        config=config,
        stages=config.stages(setup.adapter.n_layers),
        **faith_fields(setup, scores),  # with the executor that ran it
        mean_p_correct=scores.mean_p_correct,
        problems=problem_rows(setup, scores),
    )
