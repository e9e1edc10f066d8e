"""A model held for a run: loaded at first need, one evaluation and one AF1 setup per task, shared by every
experiment that reads them (a study's worker and the command line both run experiments through one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from af1.errors import Af1Error
from af1.interventions.attention import check_maskable
from af1.methods.setup import prepare
from af1.models import LoadedModel
from af1.tasks.evaluation import Evaluated, evaluated, recorded

if TYPE_CHECKING:
    from af1.tasks.spec import TaskSpec


def one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, Af1Error) else f"{type(exc).__name__}: {first}"


class Session:
    """One model and what has been measured on it; tasks come one at a time, so one task's caches are held."""

    def __init__(self, load: Callable[[], LoadedModel], means: Path | None = None) -> None:
        self._load = load
        self.means = means
        self._lm: LoadedModel | None = None
        self._load_error: str | None = None
        self._evaluated: dict[str, Evaluated] = {}
        self._recorded: dict[str, Sequence[Mapping[str, Any]]] = {}  # as stored: perhaps by an older version
        self._setups: dict[str, Any] = {}
        self.loads = 0

    @classmethod
    def of(cls, lm: LoadedModel, means: Path | None = None) -> Session:
        """A session on a model already loaded."""
        session = cls(lambda: lm, means)
        session._lm = lm
        return session

    @property
    def loaded(self) -> LoadedModel | None:
        return self._lm

    def lm(self) -> LoadedModel:
        """The model, loaded once; a failed load is remembered, not retried per unit."""
        if self._load_error is not None:
            raise Af1Error(self._load_error)
        if self._lm is None:
            self.loads += 1
            try:
                self._lm = self._load()
            except Exception as exc:
                self._load_error = one_line(exc)
                raise
        return self._lm

    def evaluated(self, spec: TaskSpec) -> Evaluated:
        """The task and the model's base scores on it: one evaluation per task, shared by every experiment."""
        key = spec.model_dump_json()
        if key not in self._evaluated:  # evaluations are small: every task's is kept (setups, with means, are not)
            lm = self.lm()
            rows = self._recorded.get(key)
            found = recorded(lm.model, lm.tokenizer, spec, rows) if rows is not None else None
            self._evaluated[key] = found or evaluated(lm.model, lm.tokenizer, spec)
        return self._evaluated[key]

    def remember(self, spec: TaskSpec, problems: Sequence[Mapping[str, Any]]) -> None:
        """The problem rows of an evaluation this run already made of this model and task (the eval experiment's
        result): read back when the task comes up again, instead of evaluating it a second time."""
        self._recorded[spec.model_dump_json()] = problems

    def setup(self, spec: TaskSpec) -> Any:
        """The AF1 setup of a task (solved problems, CAMA means per answer step, fast-path caches)."""

        key = spec.model_dump_json()
        if key not in self._setups:
            self._setups.clear()  # one task's setup (means, caches) at a time
            check_maskable(self.lm().adapter)  # refused before any evaluation is spent
            self._setups[key] = prepare(self.lm(), spec, self.means, done=self.evaluated(spec))
        return self._setups[key]
