"""What a unit costs as each experiment declares it: the shapes its work is counted from, and its work in one-token
layer passes, unembedding rows and other FLOPs; `study.cost` turns work into seconds and memory."""

from __future__ import annotations

from dataclasses import dataclass

Work = tuple[float, float, float]  # (layer passes of one token, unembedding rows, other FLOPs)


@dataclass(frozen=True)
class Cost:
    """An experiment's FLOPs' slowdown against the measured matrix-product rate (fitted by benchmarks/estimate.py on a
    2-core CPU; `avx2` where bfloat16 does not pay and the fit differs) and its peak memory in weights."""

    slowdown: float = 1.0
    slowdown_without_bf16: float | None = None
    memory_factor: float = 1.8


@dataclass(frozen=True)
class ModelShape:
    """What a model's cost depends on, read from its config without its weights."""

    layers: int
    heads: int
    layer_flops: float  # one token through one layer's matrices (2 x multiply-adds)
    unembed_flops: float  # one unembedding row: 2 x D x V
    weight_gb: float  # in the dtype the plan loads it in


@dataclass(frozen=True)
class TaskShape:
    """What a task's cost depends on: its problems, the tokens each runs past the shared context, its steps."""

    n: int
    suffix: float  # mean prompt tokens after the shared context
    steps: float  # mean scored steps per problem (answer tokens, and the end where it is checked)
    answer_steps: float  # mean answer tokens
    max_steps: int  # scored steps of the longest answer: the grid runs once per wait and step

    def step_tokens(self) -> float:
        """Tokens of one problem run once per scored step (each step's prompt is one token longer)."""
        return self.steps * self.suffix + self.steps * (self.steps - 1) / 2


@dataclass(frozen=True)
class Found:
    """What a unit reads from the units before it, or what is assumed before they ran."""

    solved: int
    wait: int
    transfer: int
    measured: bool  # read from finished units, not assumed


@dataclass(frozen=True)
class Shapes:
    """Everything a unit's work is counted from; `task` None for an experiment of the model alone."""

    model: ModelShape
    task: TaskShape | None
    found: Found
    others: tuple[TaskShape, ...] = ()  # the tasks it compares with
    from_file: bool = False  # its task is a task file

    @property
    def on(self) -> TaskShape:
        """The task (an experiment of a task asks only where there is one)."""
        assert self.task is not None
        return self.task

    @property
    def half(self) -> float:
        return self.found.solved / 2

    @property
    def clean(self) -> float:
        """Every solved problem's clean states, once per setup."""
        return self.found.solved * self.on.step_tokens() * self.model.layers

    @property
    def faith(self) -> float:
        """One faithfulness run on the confirmation half."""
        return self.half * self.on.steps * (self.model.layers - 1 - max(self.found.wait, 0))


def sweep_passes(layers: int, max_transfer: int | None) -> tuple[int, int]:
    """Last-token layer passes and cells of the (L_wait, L_transfer) grid, per problem step."""
    passes = cells = 0
    for wait in range(-1, layers):
        top = min(layers - 1 - wait, layers if max_transfer is None else max_transfer)
        passes += top + sum(layers - 1 - wait - j for j in range(top + 1))
        cells += top + 1
    return passes, cells


def patching(model: ModelShape, task: TaskShape, problems: float) -> float:
    """Wang's path patching of every head on `problems`: a clean and a counterfactual run, then each layer's heads
    (and the two residual paths) patched through the layers above, per answer step."""
    L, H = model.layers, model.heads
    per_step = 2 * (task.suffix + task.answer_steps / 2) * L + (H + 2) * L * (L + 1) / 2
    return problems * task.answer_steps * per_step
