"""A study plan (YAML or TOML): models x tasks x styles x experiments, expanded into content-keyed units."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from af1.config_files import read_mapping
from af1.errors import Af1Error, in_one_line
from af1.experiments import REGISTRY, chain
from af1.experiments.base import Options
from af1.experiments.sweep import Options as SweepOptions
from af1.results import VERSION
from af1.tasks.builtin import STYLES
from af1.tasks.spec import TaskSpec

__all__ = ["ModelEntry", "StudyPlan", "SweepOptions", "Unit", "expand", "load_plan"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelEntry(_Strict):
    """One model of the study, how to load it, and what a worker holding it needs."""

    spec: str = Field(description="smollm2, a model directory, a .gguf file or a hub id")
    name: str | None = Field(default=None, description="label in paths and tables (default: from spec)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn: Literal["sdpa", "eager"] | None = None
    device_map: Literal["auto", "balanced", "balanced_low_0", "sequential"] | None = Field(
        default=None, description="auto shards the model over the worker's devices"
    )
    trust_remote_code: bool = False
    gpus: float = Field(default=0, ge=0, description="GPUs per worker (Ray)")
    cpus: float = Field(default=1, gt=0, description="CPUs per worker (Ray)")
    memory_gb: float | None = Field(default=None, gt=0, description="memory a worker reserves (Ray)")

    @model_validator(mode="after")
    def _name(self) -> ModelEntry:
        if self.name is None:
            self.name = model_label(self.spec)
        if not NAME.match(self.name):
            raise ValueError(f"model name {self.name!r}: letters, digits, '.', '_' and '-' only")
        return self

    def load_options(self) -> dict[str, Any]:
        """What changes the model's numbers (resources do not)."""
        return self.model_dump(include={"spec", "dtype", "attn", "device_map", "trust_remote_code"})


def model_label(spec: str) -> str:
    """A model's name in paths and tables when none is given: its spec's last part, in the characters a name allows."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", Path(spec.rstrip("/")).name.removesuffix(".gguf")) or "model"


def _experiments_model() -> type[BaseModel]:
    """The plan's `experiments:` table, one optional entry per registered experiment with its own options."""
    fields: dict[str, Any] = {
        name: (exp.Options | None, Field(default=None, description=exp.help)) for name, exp in REGISTRY.items()
    }
    return create_model("Experiments", __config__=ConfigDict(extra="forbid"), **fields)


Experiments = _experiments_model()


def order() -> tuple[str, ...]:
    """The order a model's units run in: the registry's (what an experiment reads comes before it)."""
    return tuple(REGISTRY)


def rebuild_schema() -> None:
    """The plan schema again after the registry changed (`af1.experiments.register`)."""
    global Experiments
    Experiments = _experiments_model()
    StudyPlan.model_fields["experiments"].annotation = Experiments
    StudyPlan.model_rebuild(force=True)


class StudyPlan(_Strict):
    name: str = "study"
    about: str | None = Field(default=None, description="what the plan runs and why, in words: atop its report")
    models: list[ModelEntry] = Field(min_length=1)
    tasks: list[TaskSpec] = Field(default_factory=lambda: [TaskSpec()])
    styles: list[str] | None = Field(default=None, description="cross every task with these styles")
    experiments: Experiments  # pyright: ignore[reportInvalidTypeForm]

    @model_validator(mode="after")
    def _check(self) -> StudyPlan:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must differ: {names} (set name: for each)")
        if self.styles is not None:
            unknown = sorted(set(self.styles) - set(STYLES))
            if unknown:
                raise ValueError(f"unknown styles {unknown}; choose from {', '.join(STYLES)}")
        if not any(getattr(self.experiments, e, None) is not None for e in order()):
            raise ValueError("experiments: name at least one of " + ", ".join(order()))
        return self

    def task_specs(self) -> list[TaskSpec]:
        specs = self.tasks
        if self.styles is not None:
            specs = [t.model_copy(update={"style": s}) for t in specs for s in self.styles]
        unique: dict[str, TaskSpec] = {}
        for spec in specs:
            unique.setdefault(task_label(spec), spec)
        return list(unique.values())


def task_label(spec: TaskSpec) -> str:
    """A readable name for paths and tables; tasks that differ in any field get different labels."""
    if spec.file is not None:  # a task file: its name and its content's hash
        name = re.sub(r"[^A-Za-z0-9+._-]+", "-", spec.name).strip("-") or "task"
        parts = [name, f"{spec.shots}shot", (spec.file_sha256 or "")[:8]]
    else:
        parts = [spec.operation.replace("*", "x"), spec.style, f"{spec.digits}d", f"{spec.shots}shot"]
    optional = {
        "n": f"n{spec.n}",
        "n_max": f"max{spec.n_max}",
        "seed": f"s{spec.seed}",
        "answer_digits": f"{spec.answer_digits}digits",
        "scoring": f"{spec.scoring}token" if spec.scoring == "first" else "fullanswer",
        "check_end": "endunchecked",
        "allow_negative": "neg",
        "largest_layout": "largest",
    }
    defaults = TaskSpec()
    parts += [text for name, text in optional.items() if getattr(spec, name) != getattr(defaults, name)]
    return ".".join(parts)


@dataclass(frozen=True)
class Unit:
    """One model x one task (None for per-model experiments) x one experiment, keyed by its inputs."""

    model: ModelEntry
    task: TaskSpec | None
    experiment: str
    options: Options  # the experiment's, validated once where the plan was read; the key holds their values
    deps: tuple[str, ...]
    key: str
    id: str = field(init=False)

    def __post_init__(self) -> None:
        label = task_label(self.task) if self.task is not None else "model"
        object.__setattr__(self, "id", f"{self.model.name}/{label}/{self.experiment}")

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model.name,
            "task": task_label(self.task) if self.task is not None else None,
            "experiment": self.experiment,
        }


def _task_key(task: TaskSpec | None) -> dict[str, Any] | None:
    """A task as a unit's key sees it: a task file by its content's hash, not where it lies (a moved study resumes)."""
    if task is None:
        return None
    return task.model_dump(exclude={"file"} if task.file is not None else set())


def content_key(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def result_schema(experiment: str) -> str:
    """A digest of the experiment's result schema: in a unit's key, so that a unit stored under another schema is
    stale (run again), never read as this one."""
    return content_key(REGISTRY[experiment].Result.model_json_schema())


def expand(plan: StudyPlan) -> list[Unit]:
    """The plan's units, each after what it reads (`experiments.chain`): task units model by model and task by task,
    per-model ones after a model's tasks, cross-model ones last (the last model first: it is still loaded)."""
    exps = chain({e: opts for e in order() if (opts := getattr(plan.experiments, e, None)) is not None})
    units: dict[str, Unit] = {}

    def add(model: ModelEntry, task: TaskSpec | None, experiment: str, deps: list[str]) -> None:
        options = exps[experiment][0]
        key = content_key(
            {
                "af1": VERSION,
                "model": model.load_options(),
                "task": _task_key(task),
                "experiment": experiment,
                "schema": result_schema(experiment),
                "options": options.model_dump(),
                "deps": [units[d].key for d in deps],
            }
        )
        unit = Unit(model, task, experiment, options, tuple(deps), key)
        units[unit.id] = unit

    specs = plan.task_specs()
    scope = {name: REGISTRY[name].scope for name in exps}
    for model in plan.models:
        for spec in specs:  # task by task, so a worker holds one task's setup at a time
            label = f"{model.name}/{task_label(spec)}"
            for exp in (e for e in exps if scope[e] == "task"):
                add(model, spec, exp, [f"{label}/{d}" for d in exps[exp][1]])
        for exp in (e for e in exps if scope[e] == "model"):
            add(model, None, exp, [])
    for exp in (e for e in exps if scope[e] == "models"):
        for model in reversed(plan.models):
            for spec in specs:
                label = task_label(spec)
                add(model, spec, exp, [f"{m.name}/{label}/{d}" for d in exps[exp][1] for m in plan.models])
    return list(units.values())


def load_plan(path: str | Path) -> StudyPlan:
    """Read and validate a .yaml/.yml/.toml plan; errors name the file and the field."""
    path = Path(path)
    data = read_mapping(path, "plan")
    for task in data.get("tasks") or []:  # a task file is found beside the plan
        if isinstance(task, dict) and isinstance(task.get("file"), str) and not Path(task["file"]).is_absolute():
            task["file"] = str(path.parent / task["file"])
    try:
        return StudyPlan.model_validate(data)
    except ValidationError as exc:
        raise Af1Error(f"plan {path}: {in_one_line(exc)}") from exc
