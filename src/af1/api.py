"""The Python API behind the CLI: each function takes names and specs, returns a JSON-ready dict."""

from __future__ import annotations

from typing import Any

from af1.errors import Af1Error
from af1.evaluation import Evaluated, Scores, evaluated
from af1.models import LoadedModel, load_model
from af1.results import provenance
from af1.stats import baseline_warning

__all__ = ["as_loaded", "base_accuracy", "problem_rows", "provenance", "require_solved"]
from af1.tasks import Task, TaskSpec


def as_loaded(model: str | LoadedModel, **load_kwargs: Any) -> LoadedModel:
    return model if isinstance(model, LoadedModel) else load_model(model, **load_kwargs)


def problem_rows(task: Task, scores: Scores) -> list[dict[str, Any]]:
    """One row per problem as fed to the model (text and ids), with its greedy answer tokens and whether it is right."""
    rows = task.rows()
    for row, predicted, right in zip(rows, scores.predicted_PA, scores.correct_P.tolist(), strict=True):
        row.update(predicted_tokens=predicted, solved=bool(right))
    return rows


def base_accuracy(
    model: str | LoadedModel, spec: TaskSpec, done: Evaluated | None = None, **load_kwargs: Any
) -> dict[str, Any]:
    """Base accuracy of a model on a task (n, 95 % interval, constant-guess baseline), with per-problem rows;
    `done` is an evaluation of the same spec already made (never evaluated twice)."""
    lm = as_loaded(model, **load_kwargs)
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    task, scores = done.task, done.base
    r = scores.rate(task)
    note = baseline_warning(f"base accuracy ({spec.scoring} scoring)", r["baseline"], r["n"])
    return {
        "model": lm.info.get("spec"),
        "task": spec.operation,
        "style": spec.style,
        "shots": spec.shots,
        "digits": spec.digits,
        "scoring": spec.scoring,
        "n": len(task),
        "n_solved": r["k"],
        "base_accuracy": r["value"],
        "base_accuracy_ci": r["ci"],
        "base_accuracy_baseline": r["baseline"],
        "mean_p_correct": scores.mean_p_correct,
        "warnings": [w for w in (task.sampling_note, note) if w],
        "task_layout": task.describe(),
        "problems": problem_rows(task, scores),
        "provenance": provenance(lm.info, seed=spec.seed),
    }


def require_solved(n_solved: int, spec: TaskSpec) -> None:
    if n_solved == 0:
        raise Af1Error(f"the model solves none of the {spec.operation} problems ({spec.style}, {spec.shots} shots)")
