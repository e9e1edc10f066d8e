"""The Python API behind the CLI: each function takes names and specs, returns a JSON-ready dict."""

from __future__ import annotations

from typing import Any

from af1.errors import Af1Error
from af1.evaluation import evaluate
from af1.models import LoadedModel, load_model
from af1.results import provenance

__all__ = ["as_loaded", "base_accuracy", "problem_rows", "provenance", "require_solved"]
from af1.tasks import Task, TaskSpec, build_task


def as_loaded(model: str | LoadedModel, **load_kwargs: Any) -> LoadedModel:
    return model if isinstance(model, LoadedModel) else load_model(model, **load_kwargs)


def problem_rows(task: Task, correct_full: Any, correct_intervened: Any = None) -> list[dict[str, Any]]:
    """One row per problem: prompt, answer token, right in the full model (and under an intervention,
    None where the full model is wrong and the intervention was not measured)."""
    rows = []
    for i, p in enumerate(task.problems):
        row = {
            "prompt": p.prompt,
            "answer": p.answer,
            "answer_token": int(task.answer_ids_P[i]),
            "solved": bool(correct_full[i]),
        }
        if correct_intervened is not None:
            value = correct_intervened[i]
            row["right_under_intervention"] = None if value is None else bool(value)
        rows.append(row)
    return rows


def base_accuracy(model: str | LoadedModel, spec: TaskSpec, **load_kwargs: Any) -> dict[str, Any]:
    """Base accuracy of a model on a task, with per-problem rows and provenance."""
    lm = as_loaded(model, **load_kwargs)
    task = build_task(spec, lm.tokenizer)
    scores = evaluate(lm.model, task)
    n_solved = int(scores.correct_P.sum())
    return {
        "model": lm.info.get("spec"),
        "task": spec.operation,
        "style": spec.style,
        "shots": spec.shots,
        "digits": spec.digits,
        "n": len(task),
        "n_solved": n_solved,
        "base_accuracy": scores.accuracy,
        "mean_p_correct": scores.mean_p_correct,
        "task_layout": task.describe(),
        "problems": problem_rows(task, scores.correct_P),
        "provenance": provenance(lm.info, seed=spec.seed),
    }


def require_solved(n_solved: int, spec: TaskSpec) -> None:
    if n_solved == 0:
        raise Af1Error(f"the model solves none of the {spec.operation} problems ({spec.style}, {spec.shots} shots)")
