"""How a configuration is computed: one protocol, an ordered list of executors, the first that supports a case runs it.
All give the same logits within float tolerance, at different costs; faster ones' refusals go in `fallback_reason`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from af1.executors.fast import fast_logits, supports
from af1.executors.reference import reference_logits
from af1.executors.shared_context import Clean, shared_context_logits, supports_shared
from af1.executors.step import StepSetup
from af1.interventions.af1 import AF1Config
from af1.models import ModelAdapter
from af1.tasks.evaluation import ExecutorChoice
from af1.tasks.task import Task


class Executor(Protocol):
    """One way to compute the last-position logits of a step's problems under an AF1 configuration."""

    @property
    def name(self) -> str:
        """What results call it."""
        ...

    def supports(self, adapter: ModelAdapter, task: Task, config: AF1Config) -> str | None:
        """None if this executor computes the case exactly, else why not (one line)."""
        ...

    def logits(self, step: StepSetup, config: AF1Config) -> torch.Tensor:
        """Logits [P, V] of the step's kept problems."""
        ...


@dataclass(frozen=True)
class Fast:
    """The last token only, over token-local keys and values (`af1.executors.fast`)."""

    name: str = "fast"

    def supports(self, adapter: ModelAdapter, task: Task, config: AF1Config) -> str | None:
        return supports(adapter, task, config)

    def logits(self, step: StepSetup, config: AF1Config) -> torch.Tensor:
        return fast_logits(step.adapter, step.kept, config, step.means, kv=step.local_kv(config))


@dataclass(frozen=True)
class SharedContext:
    """The suffix after the constant context, resumed from clean states (`af1.executors.shared_context`)."""

    name: str = "shared-context"

    def supports(self, adapter: ModelAdapter, task: Task, config: AF1Config) -> str | None:
        return supports_shared(adapter, task)

    def logits(self, step: StepSetup, config: AF1Config) -> torch.Tensor:
        return shared_context_logits(
            step.adapter,
            step.kept,
            config,
            step.means,
            donors=step.donors,
            ctx=step.context(),
            clean=Clean(step.clean_all(), step.kept_rows()),
        )


@dataclass(frozen=True)
class Reference:
    """The whole prompt by hooks on the unmodified model (`af1.executors.reference`): runs every case."""

    name: str = "reference"

    def supports(self, adapter: ModelAdapter, task: Task, config: AF1Config) -> str | None:
        return None

    def logits(self, step: StepSetup, config: AF1Config) -> torch.Tensor:
        return reference_logits(step.adapter, step.kept, config, step.means, donors=step.donors)


EXECUTORS: tuple[Executor, ...] = (Fast(), SharedContext(), Reference())  # fastest first; the last runs everything
REFERENCE: Executor = EXECUTORS[-1]


def pick(adapter: ModelAdapter, task: Task, config: AF1Config, reference: bool = False) -> tuple[Executor, str | None]:
    """The first executor of EXECUTORS that supports the case (the reference one when asked), and why the faster
    ones do not (None when the first one runs it). The one door to the executors: the config is checked here."""
    config.check(adapter.n_layers, adapter.n_heads)
    if reference:
        return REFERENCE, "asked for (reference)"
    reasons: list[str] = []
    for executor in EXECUTORS:
        reason = executor.supports(adapter, task, config)
        if reason is None:
            return executor, "; ".join(reasons) or None
        reasons.append(reason)
    raise AssertionError("the reference executor supports every case")


def recorded(picked: Sequence[tuple[Executor, str | None]]) -> ExecutorChoice:
    """What a result records of the executors `pick` chose for its steps: their name ("mixed" where the steps
    differ) and why the faster ones could not run them (None where the fast one ran all)."""
    names = {executor.name for executor, _ in picked}
    reasons = dict.fromkeys(reason for _, reason in picked if reason)
    return ExecutorChoice(
        executor=names.pop() if len(names) == 1 else "mixed", fallback_reason="; ".join(reasons) or None
    )
