"""Head-level interventions: rewrite the concatenated head outputs entering o_proj, and their means over a task."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from af1.context import forward_last, suffix_start
from af1.evaluation import batches
from af1.interventions.hooks import hooks_removed_after
from af1.interventions.sites import head_inputs, record
from af1.models.adapter import ModelAdapter
from af1.tasks import Task

HeadEdit = Callable[[torch.Tensor], torch.Tensor]  # z [B, T, E] -> z [B, T, E]


def replace_heads(adapter: ModelAdapter, per_layer: dict[int, HeadEdit]) -> contextlib.AbstractContextManager[None]:
    """per_layer[l](z [B, T, E]) -> z: rewrite the concatenated head outputs of block l before o_proj."""

    def rewrite(fn: HeadEdit) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
        return lambda _m, args: (fn(args[0]), *args[1:])

    for layer in per_layer:
        adapter.check_layer(layer)
    return hooks_removed_after(
        adapter.o_proj(layer).register_forward_pre_hook(rewrite(fn)) for layer, fn in per_layer.items()
    )


@torch.no_grad()
def head_means(adapter: ModelAdapter, task: Task, batch_size: int = 32) -> dict[int, torch.Tensor]:
    """Mean o_proj input per layer and position over the task: {layer: [T, E]} (fp32, on the CPU). The suffix runs
    on the shared context; the context's positions, the same in every problem, come from one full row."""

    def add(kept_TE: torch.Tensor | None, z_BTE: torch.Tensor) -> torch.Tensor:
        z_TE = z_BTE.float().sum(0).cpu()  # reduced during the forward: memory stays one [T, E] per layer
        return z_TE if kept_TE is None else kept_TE + z_TE

    L = adapter.n_layers
    sites = [head_inputs(layer) for layer in range(L)]
    with record(adapter, sites, reduce=add) as sums:
        for sl in batches(len(task), batch_size):
            forward_last(adapter.model, task.input_ids_PT[sl], task.context_len)
    means = {layer: sums[head_inputs(layer)] / len(task) for layer in range(L)}
    c = suffix_start(adapter.model, task.input_ids_PT, task.context_len)
    if c:
        with record(adapter, sites) as first:
            forward_last(adapter.model, task.input_ids_PT[:1])
        means = {layer: torch.cat([first[head_inputs(layer)][0, :c].float().cpu(), m]) for layer, m in means.items()}
    return means
