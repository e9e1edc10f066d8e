"""The Python API: load a model, run any experiment of the registry (with what it needs), run a study plan.

    import af1.api as af1
    held = af1.session(af1.load_model("smollm2"))  # one evaluation and one setup per task, shared by every run
    task = af1.TaskSpec(operation="a+b", style="calculate", shots=3)
    found = af1.run("search", held, task, threshold=0.9, selection=0.3)
    found.claim, found.cell(), found.judged  # the claim (outcome and numbers), the judged cell and its rates

Each result is the experiment's pydantic model (`af1.experiments.<module>.Result`); `.data()` is its JSON. Name the
experiment by that class for a result the type checker knows: `af1.run(search.Result, held, task)`.
The building blocks below it (`af1.methods`, `af1.executors`, `af1.interventions`, `af1.tasks`) are public too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from af1.errors import Af1Error
from af1.experiments import REGISTRY, Inputs, NotApplicable, chain, get, run_on
from af1.experiments.base import EXPERIMENT_OF_RESULT, Options, Result
from af1.experiments.session import Session
from af1.models import LoadedModel, load_model
from af1.results import provenance, write_json
from af1.study import StudyPlan, load_plan, run_study
from af1.tasks.spec import TaskSpec

__all__ = [
    "REGISTRY",
    "Af1Error",
    "LoadedModel",
    "NotApplicable",
    "StudyPlan",
    "TaskSpec",
    "as_loaded",
    "as_written",
    "load_model",
    "load_plan",
    "run",
    "run_study",
    "session",
]


def as_loaded(model: str | LoadedModel, **load_kwargs: Any) -> LoadedModel:
    """The model itself, or the one its spec names loaded with `load_kwargs`."""
    return model if isinstance(model, LoadedModel) else load_model(model, **load_kwargs)


def session(model: str | LoadedModel, means: str | Path | None = None) -> Session:
    """A model held for several runs: each task is evaluated once and its AF1 setup made once."""
    return Session.of(as_loaded(model), Path(means) if means is not None else None)


def as_written(result: Result, lm: LoadedModel, task: TaskSpec | None) -> dict[str, Any]:
    """A result's JSON as the command prints it and `--out` writes it: with the model and task it ran on."""
    return {**result.data(), "provenance": provenance(lm.info, task=task.described() if task is not None else None)}


R = TypeVar("R", bound=Result)


def run(
    name: str | type[R],
    model: str | LoadedModel | Session,
    task: TaskSpec | None = None,
    out_dir: str | Path | None = None,
    means: str | Path | None = None,
    upstream: Mapping[str, Mapping[str, Any] | Options] | None = None,
    options: Options | None = None,
    **given: Any,
) -> R:
    """Run experiment `name` on a model (or `session`) and task after what it reads (`experiments.chain`), its options
    validated once; with out_dir each result's JSON is written there and a sweep resumes from it."""
    from af1.study.plan import model_label

    experiment = get(name if isinstance(name, str) else EXPERIMENT_OF_RESULT[name].name)
    name = experiment.name
    if options is not None and given:
        raise Af1Error(f"{name}: give its options as an Options object or as keywords, not both")
    validated = {
        other: values if isinstance(values, Options) else get(other).Options.model_validate(values)
        for other, values in (upstream or {}).items()
    } | {name: options if options is not None else experiment.Options.model_validate(given)}
    if task is None:
        task = TaskSpec(**experiment.task_defaults)
    held = model if isinstance(model, Session) else session(model, means)
    lm = held.lm()
    label = model_label(str(lm.info.get("spec") or "model"))  # names the model in results, as a plan would
    state_dir = Path(out_dir) if out_dir is not None else None
    results: dict[str, Result] = {}
    for each, (opts, reads) in chain(validated).items():  # each experiment after what it reads
        its_task = None if REGISTRY[each].scope == "model" else task
        read = {d: [results[d]] for d in reads if d in results}
        inputs = Inputs(held, its_task, label, read, state_dir)
        results[each] = result = run_on(inputs, each, opts, (results[d] for d in read))
        if state_dir is not None:
            write_json(state_dir / REGISTRY[each].file, as_written(result, lm, its_task))
        if each == name:
            return cast(R, result)
    raise Af1Error(f"{name} did not run")  # the chain always holds the asked experiment
