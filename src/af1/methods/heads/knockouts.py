"""Knock-outs: heads mean-ablated at the last position, alone or as a set, scored over every answer step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from af1.interventions.heads import HeadSums, head_sums, replace_heads
from af1.interventions.sites import Site, head_inputs, record
from af1.models.adapter import ModelAdapter
from af1.models.forward import forward_last, suffix_start
from af1.tasks.evaluation import Scores, batches
from af1.tasks.task import Task

if TYPE_CHECKING:
    pass


@torch.no_grad()
def knocked_step(
    adapter: ModelAdapter,
    step: Task,
    head_sets: list[list[tuple[int, int]]],
    sums: HeadSums,
    batch_size: int = 32,
) -> list[Scores]:
    """One answer step's next-token scores with each set of heads mean-ablated at every position, a `Scores` per set.
    The mean leaves the problem's own state out where the problem is inside it (`HeadSums.loo`: its clean,
    unablated head input, recorded in one clean forward per batch for the knocked layers only). Several sets share
    a forward (rows set x problem). At the shared context's positions a head's mean is its own output (the same in
    every problem): only the suffix is rewritten, and it runs on the context's cache."""
    c = suffix_start(adapter.model, step.input_ids_PT, step.context_len)
    layers = sorted({layer for heads in head_sets for layer, _ in heads})
    member_P = sums.member_B(step.input_ids_PT)
    parts: list[list[Scores]] = [[] for _ in head_sets]
    for sl in batches(len(step), batch_size):
        ids = step.input_ids_PT[sl]
        B = len(ids)
        own: dict[Site, torch.Tensor] = {}
        if layers:
            with record(adapter, [head_inputs(layer) for layer in layers]) as own:
                forward_last(adapter.model, ids, step.context_len)
        loo = {layer: sums.loo(layer, c, own[head_inputs(layer)], member_P[sl]) for layer in layers}
        for chunk in batches(len(head_sets), max(1, batch_size // B)):
            sets = head_sets[chunk]

            edits = {layer: _ablation(adapter, layer, sets, loo[layer]) for layer in layers}
            knocked = {layer for heads in sets for layer, _ in heads}
            with replace_heads(adapter, {layer: edit for layer, edit in edits.items() if layer in knocked}):
                logits = forward_last(adapter.model, ids.repeat(len(sets), 1), step.context_len)
            for s in range(len(sets)):
                parts[chunk.start + s].append(Scores.from_logits(logits[s * B : (s + 1) * B], step.answer_ids_P[sl]))
    return [Scores.concat(p) for p in parts]


def _ablation(adapter: ModelAdapter, layer: int, sets: list[list[tuple[int, int]]], mean_BTE: torch.Tensor):
    """The edit of a layer's head inputs for rows set x problem (row s*B + b: set s, problem b): each set's heads
    of this layer take the problem's mean."""
    d, B = adapter.head_dim, len(mean_BTE)
    mask_SE = torch.zeros(len(sets), adapter.n_heads * d, dtype=torch.bool)
    for s, heads in enumerate(sets):
        for hl, h in heads:
            if hl == layer:
                mask_SE[s, h * d : (h + 1) * d] = True
    mask_R1E = mask_SE.repeat_interleave(B, 0)[:, None]
    mean_RTE = mean_BTE.repeat(len(sets), 1, 1)

    def fn(z: torch.Tensor) -> torch.Tensor:
        return torch.where(mask_R1E.to(z.device), mean_RTE.to(z.device, z.dtype), z)

    return fn


def head_sums_by_step(adapter: ModelAdapter, task: Task) -> dict[Any, HeadSums]:
    """Head sums per token layout and answer step (teacher forced) over all the task's problems, by `part_key`:
    what knockout ablates to (leave-one-out for the problems among them)."""
    return {step.part_key: head_sums(adapter, step) for step in task.steps()}


def knockouts(
    adapter: ModelAdapter, kept: Task, head_sets: list[list[tuple[int, int]]], means: dict[Any, HeadSums]
) -> list[Scores]:
    """Every answer step of the solved problems with each set of heads mean-ablated (leave-one-out means), a
    `Scores` per set; the sets share forwards."""
    per_step = [knocked_step(adapter, step, head_sets, means[step.part_key]) for step in kept.steps()]
    return [Scores.combine(kept, [scores[i] for scores in per_step]) for i in range(len(head_sets))]


def knockout_scores(
    adapter: ModelAdapter, kept: Task, heads: list[tuple[int, int]], means: dict[Any, HeadSums]
) -> Scores:
    """Every answer step of the solved problems with the listed heads mean-ablated (leave-one-out means)."""
    return knockouts(adapter, kept, [heads], means)[0]


def loo_fallbacks(kept: Task, means: dict[Any, HeadSums]) -> int:
    """(problem, answer step) pieces whose mean has no other problem (a sum of one): they keep their own state."""
    return sum(
        int(sums.member_B(step.input_ids_PT).sum()) for step in kept.steps() if (sums := means[step.part_key]).n == 1
    )
