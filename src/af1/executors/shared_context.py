"""AF1 and its variants with the constant context run once: every problem runs only its varying suffix.
No intervention touches the context, so its keys/values are shared; covers what the fast executor does not."""

from __future__ import annotations

from typing import NamedTuple

import torch

from af1.executors.fast import ProblemKV, context_kv
from af1.executors.spill import layer_tables
from af1.interventions.af1 import AF1Config, ablation_start, overwrite_from, plans_for, resample_donors, zeroed_outputs
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.means import PositionMeans
from af1.interventions.residual import edit_residual, zero_attention_outputs
from af1.interventions.sites import record, residual
from af1.models.adapter import LayerInputs, ModelAdapter
from af1.models.forward import unshared_reason
from af1.tasks.evaluation import batches
from af1.tasks.task import Task


def supports_shared(adapter: ModelAdapter, task: Task) -> str | None:
    """None if the context can be shared for this model and task, else why not."""
    if (reason := adapter.no_attention_interface()) is not None:
        return reason
    if task.context_len == 0:
        return "the task has no constant context"
    return unshared_reason(adapter.model, task.n_positions)


def _suffix_inputs(adapter: ModelAdapter, task: Task, ids_BT: torch.Tensor) -> LayerInputs:
    c, n = task.context_len, task.n_positions
    suffix = ids_BT[:, c:].to(adapter.device)
    return adapter.layer_inputs(suffix, torch.arange(c, n, device=adapter.device).expand(len(suffix), n - c))


def _plans(
    adapter: ModelAdapter,
    task: Task,
    ctx: ProblemKV,
    batch: int,
    masks: dict[int, LayerPlan],
    stop: int,
    start: int = 0,
) -> dict[int, LayerPlan]:
    """Layers 0..stop-1: the context's keys/values prepended, the suffix rows of each layer's mask (causal when
    the config leaves the layer alone)."""
    c, n = task.context_len, task.n_positions
    q = torch.arange(c, n)[:, None]
    causal = (torch.arange(n)[None] <= q)[None]  # [1, n-c, n]
    plans = {}
    for layer in range(start, stop):
        k = ctx.keys[layer].expand(batch, -1, -1, -1)
        v = ctx.values[layer].expand(batch, -1, -1, -1)
        given = masks[layer].allowed_BQK if layer in masks else None
        allowed = causal if given is None else given[..., c:, :]  # already causal
        plans[layer] = LayerPlan(allowed_BQK=allowed, prefix_kv=(k, v), replace_mask=True)
    return plans


@torch.no_grad()
def suffix_states(adapter: ModelAdapter, task: Task, ctx: ProblemKV, layer: int, index: torch.Tensor) -> torch.Tensor:
    """h[layer] of the suffix positions of rows `index` of an unmodified run: [B, n-c, D]."""
    ids = task.input_ids_PT[index]
    inputs = _suffix_inputs(adapter, task, ids)
    with attention_plans(adapter, _plans(adapter, task, ctx, len(ids), {}, layer + 1)):
        return adapter.run_layers(inputs.hidden_BTD, inputs, 0, layer + 1)


@torch.no_grad()
def clean_suffix_states(adapter: ModelAdapter, task: Task, ctx: ProblemKV, batch_size: int = 64) -> list[torch.Tensor]:
    """h[l] of every layer at the suffix positions of an unmodified run ([P, n-c, D] per layer): where the configs
    of a task resume, each from the first layer it changes. Past the memory budget (`spill`) they live in files."""
    per_layer_PSD: list[torch.Tensor] = []
    for sl in batches(len(task), batch_size):
        ids = task.input_ids_PT[sl]
        inputs = _suffix_inputs(adapter, task, ids)
        with (
            attention_plans(adapter, _plans(adapter, task, ctx, len(ids), {}, adapter.n_layers)),
            record(adapter, [residual(layer) for layer in range(adapter.n_layers)]) as cache,
        ):
            adapter.run_layers(inputs.hidden_BTD, inputs)
        if not per_layer_PSD:
            h_BSD = cache[residual(0)]
            shape = (len(task), *h_BSD.shape[1:])
            per_layer_PSD, _ = layer_tables(adapter.n_layers, shape, h_BSD.dtype)
        for layer in range(adapter.n_layers):
            per_layer_PSD[layer][sl] = cache[residual(layer)].cpu()
    return per_layer_PSD


def first_changed_layer(config: AF1Config, masks: dict[int, LayerPlan], zero: dict[int, list[int]], L: int) -> int:
    """The first block whose computation a config changes: before it the run is the unmodified one."""
    ablated = [config.wait + 1] if config.wait >= 0 and config.ablation != "none" else []
    return min([*masks, *zero, *ablated], default=L)


class Clean(NamedTuple):
    """The unmodified run's suffix states per block (`clean_suffix_states`) and where the task's problems are in
    them (None: in order; rows where they hold more problems than the task)."""

    states: list[torch.Tensor]
    rows: torch.Tensor | None = None


@torch.no_grad()
def shared_context_logits(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    means: PositionMeans | None,
    batch_size: int = 64,
    donors: Task | None = None,
    ctx: ProblemKV | None = None,
    clean: Clean | None = None,
) -> torch.Tensor:
    """Last-position logits [P, V] under AF1 (any ablation and ABP variant), equal to `reference_logits` up to
    rounding. Resample donors: `donors` (None: the task). `clean`: resume at the first block the config changes."""
    reason = supports_shared(adapter, task)
    if reason is not None:
        raise ValueError(f"shared context unsupported: {reason}")
    c = task.context_len
    ctx = ctx or context_kv(adapter, task)
    masks = plans_for(task, config, adapter)
    zero = {layer: [p - c for p in rows] for layer, rows in zeroed_outputs(task, config, adapter.n_layers).items()}
    ablate = config.wait >= 0 and config.ablation != "none"
    start = ablation_start(config, task) - c  # index into the suffix
    donors = donors if donors is not None else task
    pick = resample_donors(task, donors, config.seed) if ablate and config.ablation == "resample" else None
    first = first_changed_layer(config, masks, zero, adapter.n_layers) if clean is not None else 0
    out = []
    for sl in batches(len(task), batch_size):
        ids = task.input_ids_PT[sl]
        edits = {}
        inputs = _suffix_inputs(adapter, task, ids)
        if first == 0 or clean is None:
            h = inputs.hidden_BTD
        else:
            h = clean.states[first - 1][sl if clean.rows is None else clean.rows[sl]].to(adapter.device)
        if ablate:
            donor = suffix_states(adapter, donors, ctx, config.wait, pick[sl]) if pick is not None else None
            edit = overwrite_from(config, means, ids, donor, start)
            if first == config.wait + 1:  # resuming right after the ablation: apply it to the resumed state
                h = edit(h)
            else:
                edits[config.wait] = edit
        with (
            edit_residual(adapter, edits),
            attention_plans(adapter, _plans(adapter, task, ctx, len(ids), masks, adapter.n_layers, first)),
            zero_attention_outputs(adapter, zero),
        ):
            h = adapter.run_layers(h, inputs, first)
        out.append(adapter.logits(h[:, -1:])[:, -1].float().cpu())
    return torch.cat(out)
