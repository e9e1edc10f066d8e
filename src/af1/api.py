"""The Python API: load a model, run any experiment of the registry (with what it needs), run a study plan.

    import af1.api as af1
    held = af1.session(af1.load_model("smollm2"))  # one evaluation and one setup per task, shared by every run
    task = af1.TaskSpec(operation="a+b", style="calculate", shots=3)
    found = af1.run("search", held, task, threshold=0.9, upstream={"sweep": {"max_transfer": 4}})
    found.wait, found.transfer, found.faithfulness, found.faithfulness_ci

Each result is the experiment's typed pydantic model (`af1.experiments.<module>.Result`); `.data()` is its JSON.
The building blocks below it (`af1.measures`, `af1.heads`, `af1.positional`, `af1.interventions`) are public too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from af1.errors import Af1Error
from af1.experiments import REGISTRY, Inputs, NotApplicable, get
from af1.experiments.base import Result
from af1.experiments.session import Session
from af1.models import LoadedModel, load_model
from af1.results import provenance, write_json
from af1.study import StudyPlan, load_plan, run_study
from af1.tasks import TaskSpec

__all__ = [
    "REGISTRY",
    "Af1Error",
    "LoadedModel",
    "NotApplicable",
    "StudyPlan",
    "TaskSpec",
    "as_loaded",
    "chain",
    "load_model",
    "load_plan",
    "run",
    "run_study",
    "session",
]


def as_loaded(model: str | LoadedModel, **load_kwargs: Any) -> LoadedModel:
    return model if isinstance(model, LoadedModel) else load_model(model, **load_kwargs)


def session(model: str | LoadedModel, means: str | Path | None = None) -> Session:
    """A model held for several runs: each task is evaluated once and its AF1 setup made once."""
    return Session.of(as_loaded(model), Path(means) if means is not None else None)


def chain(name: str, options: Any, upstream: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, Any]]:
    """The experiments to run for `name`, in order: what it needs first (their options from `upstream`, else the
    defaults), then itself."""
    order: list[tuple[str, Any]] = []

    def add(n: str, opts: Any) -> None:
        for need in get(n).needs(opts):
            if need not in [o for o, _ in order]:
                add(need, get(need).Options.model_validate((upstream or {}).get(need, {})))
        order.append((n, opts))

    add(name, options)
    return order


def run(
    name: str,
    model: str | LoadedModel | Session,
    task: TaskSpec | None = None,
    out_dir: str | Path | None = None,
    means: str | Path | None = None,
    upstream: dict[str, dict[str, Any]] | None = None,
    **options: Any,
) -> Any:
    """Run experiment `name` on a model (or a `session`) and task, and before it what it needs (options from
    `upstream`, else defaults); with out_dir, each one's JSON (with provenance) and figure are written there,
    and a sweep resumes from there. Returns the experiment's typed result."""
    experiment = get(name)
    opts = experiment.Options.model_validate(options)
    if experiment.scope != "model" and task is None:
        task = TaskSpec()
    held = model if isinstance(model, Session) else session(model, means)
    lm = held.lm()
    out = Path(out_dir) if out_dir is not None else None
    results: dict[str, Result] = {}
    label = lm.info.get("spec") or "model"
    for step, step_options in chain(name, opts, upstream):
        exp = REGISTRY[step]
        reads = [n for n in (*exp.needs(step_options), *exp.uses()) if n in results]
        inputs = Inputs(
            held,
            None if exp.scope == "model" else task,
            str(label),
            deps={n: [results[n]] for n in reads},
            state_dir=out,
        )
        results[step] = exp.run(inputs, step_options)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            task_info = inputs.task.model_dump() if inputs.task is not None else None
            write_json(out / exp.file, {**results[step].data(), "provenance": provenance(lm.info, task=task_info)})
            exp.draw(results[step], out, inputs)
    return results[name]
