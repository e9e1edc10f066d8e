"""The shape of every experiment: its options, typed result, what it reads, how it runs and its report section; the
CLI, plans, runner, report and API are derived from it."""

from __future__ import annotations

import html
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.table import Table

from af1.errors import Af1Error
from af1.experiments import costs
from af1.experiments.helptext import command_help
from af1.methods.setup import Setup, SetupDescription
from af1.models import LoadedModel
from af1.report.markup import Tab, claims_html, claims_lines, page
from af1.results import Part
from af1.tasks.evaluation import Evaluated, TaskDescription
from af1.tasks.spec import TaskSpec

R = TypeVar("R", bound="Result")
SEARCH = "search"  # the experiment whose result is a configuration (af1.experiments.search): what others run at


class Options(BaseModel):
    """An experiment's options: the only place their defaults live. Unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class Result(Part):
    """An experiment's result: every field declared (an undeclared one is refused) so readers get what they expect;
    its warnings, its own and those of the results it was built from."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    def data(self) -> dict[str, Any]:
        """Every field (each one declared): what the JSON holds."""
        return self.model_dump()

    def _repr_html_(self) -> str:
        """In a notebook: the report section (numbers and offline figures) in a frame of its own, so its styles and
        scripts stay apart; the frame takes its content's height."""
        kind = EXPERIMENT_OF_RESULT.get(type(self))
        if kind is None:
            return f"<pre>{html.escape(self.model_dump_json(indent=1)[:4000])}</pre>"
        experiment = kind()  # made here, when a notebook shows a result, never at import
        section = page(experiment.name, experiment.section(self))
        # the frame takes its content's height, and again when a click opens a cell's problems
        fit = (
            "const f=this,d=f.contentDocument,fit=()=>{f.style.height=(d.documentElement.scrollHeight+20)+'px'};"
            "fit();new ResizeObserver(fit).observe(d.body)"
        )
        return (
            f'<iframe title=\'af1 {html.escape(experiment.name)}\' srcdoc="{html.escape(section)}" onload="{fit}" '
            "style='width:100%;height:480px;border:1px solid #ddd'></iframe>"
        )


class TaskFields(Result, TaskDescription):
    """What a result about one model on one task carries (declared in `af1.tasks.evaluation.TaskDescription`): the
    model and task, and the base accuracy with its interval and constant guess."""


class SetupFields(TaskFields, SetupDescription):
    """What every result measured on a setup carries beyond the task (`methods.setup.SetupDescription`): token layouts,
    whether the answer's end is checked, and where CAMA's means come from."""


EXPERIMENT_OF_RESULT: dict[type[Result], type[Experiment]] = {}


class NotApplicable(Exception):
    """The unit does not apply (for example: analyses asked only where the search found a subgraph)."""


class Resources(Protocol):
    """What a unit's body can ask for: the model, and one evaluation and one setup per task (shared)."""

    def lm(self) -> LoadedModel: ...

    def evaluated(self, spec: TaskSpec) -> Evaluated: ...

    def setup(self, spec: TaskSpec) -> Setup: ...


@dataclass
class Inputs:
    """Everything a unit runs on: resources, its task (None for per-model experiments), the results it reads
    by experiment name (one per model for cross-model experiments), and a directory for resumable state."""

    resources: Resources
    task: TaskSpec | None
    model_name: str
    deps: dict[str, list[Result]] = field(default_factory=dict)
    state_dir: Path | None = None

    @property
    def spec(self) -> TaskSpec:
        if self.task is None:
            raise Af1Error("this experiment needs a task")
        return self.task

    def every(self, kind: type[R]) -> list[R]:
        """The results of the experiment that writes `kind` on every model of the plan (cross-model experiments)."""
        return written_by(self.deps, kind)

    def one(self, kind: type[R]) -> R | None:
        """The result of the experiment that writes `kind` that this unit reads (for a task experiment: on its own
        model and task), or None when there is none."""
        return next(iter(written_by(self.deps, kind)), None)


def written_by(deps: dict[str, list[Any]], kind: type[R]) -> list[R]:
    """The results among `deps` (by experiment name) of the experiment that writes `kind`."""
    return list(deps.get(EXPERIMENT_OF_RESULT[kind].name) or [])


Share = Annotated[float, Field(gt=0, lt=1)]  # a share of the solved problems that chooses (a selection half)


class GatedOptions(Options):
    """Options of an experiment that can be asked only where the model's search found a subgraph."""

    require_found: bool = Field(
        default=False,
        description="run only where the search chose a cell on its selection split (elsewhere: not applicable)",
    )


class ConfigOptions(GatedOptions):
    """Options of an experiment that runs at one AF1 configuration: fixed, or the model's search's."""

    wait: int | None = Field(
        default=None, ge=-1, description="CAMA at the output of this block (default: the search's)"
    )
    transfer: int | None = Field(
        default=None, ge=0, description="layers in which the last token peeks (with --wait; default 0)"
    )

    @model_validator(mode="after")
    def _wait_first(self) -> ConfigOptions:
        if self.wait is None and self.transfer is not None:
            raise ValueError("transfer is given without wait (without both, the search's config is used)")
        return self


@dataclass
class Finished:
    """A finished unit as a study's report sees it: where it ran, its result and the results it read."""

    model: str
    task: str  # the task's label ("model" for per-model experiments)
    result: Any
    deps: dict[str, list[Any]]
    description: str | None = None  # a bundled model's exact weights

    def one(self, kind: type[R]) -> R | None:
        return next(iter(written_by(self.deps, kind)), None)


AnyOptions = Options
AnyResult = Result


class Experiment:
    """One experiment. A module defines a subclass and registers an instance in `af1.experiments.REGISTRY`."""

    name: ClassVar[str]
    help: ClassVar[str]
    Options: ClassVar[type[AnyOptions]] = AnyOptions
    Result: ClassVar[type[AnyResult]] = AnyResult
    # task: one unit per model and task; model: per model alone; models: per task, reading every model's results
    scope: ClassVar[Literal["task", "model", "models"]] = "task"
    task_defaults: ClassVar[dict[str, Any]] = {}  # task options that differ from TaskSpec's on the command line
    overview_rank: ClassVar[int] = 0  # where its cross-model part stands in a study report (lower: earlier)
    config_from_search: ClassVar[bool] = False  # runs at the search's config unless its options give a wait
    cost: ClassVar[costs.Cost] = costs.Cost()  # how its FLOPs run and its memory, beside `work`
    small: ClassVar[dict[str, Any]] = {}  # options of a small run on a tiny model: the tests run it so

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Its help is its module's docstring unless it says otherwise. Remember which experiment writes each Result
        class, so that a result renders itself in a notebook without importing the registry."""
        super().__init_subclass__(**kwargs)
        if "help" not in cls.__dict__ and "name" in cls.__dict__:
            cls.help = command_help(sys.modules[cls.__module__].__doc__, cls.name)
        if "Result" in cls.__dict__:  # the class that declares a Result writes it; a subclass of it does not
            EXPERIMENT_OF_RESULT.setdefault(cls.Result, cls)

    def needs(self, options: Any) -> tuple[str, ...]:
        """Experiments this one reads and that a plan gets implicitly (with default options): the search, when
        it runs at the search's config or only where the search found a subgraph (`require_found`)."""
        wants_config = self.config_from_search and getattr(options, "wait", None) is None
        return (SEARCH,) if wants_config or getattr(options, "require_found", False) else ()

    def uses(self) -> tuple[str, ...]:
        """Experiments this one reads when the plan has them."""
        return ()

    def evaluation_rows(self, result: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The problem rows of the model's evaluation of the task that this result holds (its JSON), for a session
        to read back instead of evaluating the task again; None when it holds none."""
        return None

    def run(self, inputs: Inputs, options: Any) -> Result:
        raise NotImplementedError

    def work(self, options: Any, s: costs.Shapes) -> costs.Work | None:
        """What a unit of it computes, counted from the plan before it runs (`study.cost` makes seconds of it);
        None: no cost model (an experiment registered from outside)."""
        return None

    def tables(self, result: Any) -> list[Tab]:
        """Its tables, declared once: `section` shows them in the report, `show` on the terminal, each followed
        by the result's claims."""
        return []

    def section(self, result: Any) -> list[str]:
        """Its part of the HTML report: headings, paragraphs and figures around its tables."""
        return [*(t.html() for t in self.tables(result)), claims_html(getattr(result, "claims", None))]

    def show(self, result: Any) -> list[Table | str]:
        """What the command line prints: its tables and claims, and lines."""
        return [*(t.rich() for t in self.tables(result) if t.rows), *claims_lines(getattr(result, "claims", None))]

    def overview(self, finished: list[Finished]) -> tuple[dict[str, Any], list[str]]:
        """Across a study's finished units of this experiment (every model and task): data for report.json and
        the HTML of the study report's cross-model part."""
        return {}, []

    @property
    def file(self) -> str:
        return f"{self.name}.json"
