"""Fast AF1: compute only what the subgraph computes.

Under AF1 every non-last position is, after block `wait`, a function of its own token and
position (its ablated state, then attention to context and itself). So its keys and values
in every later layer are computed once per (position, token) from a few covering prompts,
and the only input-dependent work left is the last token's path through blocks
`wait+1..L-1`: one query per problem that reads the precomputed keys/values of every
position in transfer blocks and of the context in compute blocks. The HF layers do that
work themselves: the prefix keys/values enter through the attention plan.

Supported: ablations cama, mean, zero (and none with wait = -1), ABP variant af1 with any
transfer window and pruned transfer heads, families
that route attention through transformers' interface. Others use the reference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from af1.allforone import AF1Config, ablation_edit, plans_for, reference_logits
from af1.evaluation import batches
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.means import PositionMeans, slot_table
from af1.interventions.residual import edit_residual, record_residual
from af1.models.adapter import LayerInputs, ModelAdapter
from af1.tasks import Task


def supports(adapter: ModelAdapter, task: Task, config: AF1Config) -> str | None:
    """None if the fast executor covers this case, else the reason it does not."""
    if not adapter.family.uses_attention_interface:
        return f"the {adapter.family.name} family does not use transformers' attention interface"
    if config.abp != "af1":
        return f"ABP variant '{config.abp}' lets non-last tokens peek"
    if config.wait >= 0 and config.ablation not in ("cama", "mean", "zero"):
        return f"ablation '{config.ablation}' does not make positions token-local"
    window = getattr(adapter.config, "sliding_window", None)
    if window and task.n_positions > window:
        return f"prompts of {task.n_positions} tokens exceed the sliding window {window}"
    return None


@dataclass
class TokenLocalKV:
    """Keys/values of positions 0..n-2 in blocks after `wait`, per token slot; and the last token's start."""

    wait: int
    keys: dict[int, torch.Tensor]  # layer -> [position, slot, kv_heads, head_dim]
    values: dict[int, torch.Tensor]
    start_TSD: torch.Tensor | None  # h[wait] per (position, slot), None for wait = -1
    slot_tokens_TS: torch.Tensor
    context_len: int

    def slots(self, ids_BT: torch.Tensor) -> torch.Tensor:
        return (self.slot_tokens_TS[None] == ids_BT[..., None].cpu()).float().argmax(-1)

    def prefix(self, layer: int, slots_BT: torch.Tensor, peek: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, kv_heads, m, head_dim] keys/values the last query reads: all earlier positions, or the context."""
        T = slots_BT.shape[1]
        if peek:
            pos = torch.arange(T - 1)[None]
            k, v = self.keys[layer][pos, slots_BT[:, : T - 1]], self.values[layer][pos, slots_BT[:, : T - 1]]
        else:
            c = self.context_len
            k = self.keys[layer][:c, 0][None].expand(slots_BT.shape[0], -1, -1, -1)
            v = self.values[layer][:c, 0][None].expand(slots_BT.shape[0], -1, -1, -1)
        return k.transpose(1, 2), v.transpose(1, 2)


def covering_prompts(slot_tokens_TS: torch.Tensor) -> torch.Tensor:
    """S prompts such that every (position, token) of the slot table occurs in one: prompt i uses slot i."""
    counts = (slot_tokens_TS >= 0).sum(1)
    S = int(counts.max())
    slot_idx = torch.minimum(torch.arange(S)[:, None], counts[None] - 1)  # [S, T]
    return slot_tokens_TS.gather(1, slot_idx.T).T


@torch.no_grad()
def token_local_kv(
    adapter: ModelAdapter, task: Task, config: AF1Config, means: PositionMeans | None
) -> TokenLocalKV:
    """One reference run over the covering prompts, capturing keys/values after `wait`."""
    table = means.slot_tokens_TS if means is not None else slot_table(task.input_ids_PT)
    cover = covering_prompts(table)
    cover_task = Task(task.spec, [task.problems[0]] * len(cover), cover, task.answer_ids_P[:1].expand(len(cover)),
                      task.context_len, task.layout)
    local = config.model_copy(update={"transfer": 0, "transfer_start": None, "pruned_heads": []})
    keys: dict[int, torch.Tensor] = {}
    values: dict[int, torch.Tensor] = {}
    layers = list(range(config.wait + 1, adapter.n_layers))

    def capture(layer: int):
        def fn(_module, _q, k, v):
            keys[layer], values[layer] = k[:, :, :-1].permute(2, 0, 1, 3), v[:, :, :-1].permute(2, 0, 1, 3)

        return fn

    plans = plans_for(cover_task, local, adapter)  # every query sees only context and itself
    for layer in layers:
        plans[layer].capture = capture(layer)
    store: dict[int, torch.Tensor] = {}
    ids = cover.to(adapter.device)
    edit = ablation_edit(local, means, cover_task, ids, None)
    recorded = [config.wait] if config.wait >= 0 else []
    with (
        edit_residual(adapter, {config.wait: edit} if edit else {}),
        record_residual(adapter, recorded, store),
        attention_plans(adapter, plans),
    ):
        adapter.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, logits_to_keep=1)
    start = store[config.wait].transpose(0, 1).float() if config.wait >= 0 else None  # [T, S, D]
    return TokenLocalKV(config.wait, keys, values, start, table, task.context_len)


def _plan(
    adapter: ModelAdapter, kv: TokenLocalKV, layer: int, slots_BT: torch.Tensor, peek: bool,
    pruned: list[int] | None = None,
) -> LayerPlan:
    prefix = kv.prefix(layer, slots_BT, peek)
    if not pruned:
        return LayerPlan(prefix_kv=prefix, replace_mask=True)
    T = slots_BT.shape[1]
    keys = torch.arange(T)
    allowed = torch.ones(1, adapter.n_heads, 1, T, dtype=torch.bool)
    allowed[0, pruned, 0] = (keys < kv.context_len) | (keys == T - 1)
    return LayerPlan(allowed_BQK=allowed, prefix_kv=prefix, replace_mask=True)


def _run(
    adapter: ModelAdapter, kv: TokenLocalKV, h_B1D: torch.Tensor, inputs: LayerInputs, slots_BT: torch.Tensor,
    start: int, stop: int, peek: bool,
) -> torch.Tensor:
    plans = {layer: _plan(adapter, kv, layer, slots_BT, peek) for layer in range(start, stop)}
    with attention_plans(adapter, plans):
        return adapter.run_layers(h_B1D, inputs, start, stop)


def _last_token_inputs(adapter: ModelAdapter, ids_BT: torch.Tensor) -> LayerInputs:
    B, T = ids_BT.shape
    return adapter.layer_inputs(ids_BT[:, -1:].to(adapter.device), torch.full((B, 1), T - 1, device=adapter.device))


def _start_state(kv: TokenLocalKV, slots_BT: torch.Tensor, inputs: LayerInputs, dtype: torch.dtype) -> torch.Tensor:
    if kv.start_TSD is None:
        return inputs.hidden_BTD
    T = slots_BT.shape[1]
    return kv.start_TSD[T - 1, slots_BT[:, -1]][:, None].to(inputs.hidden_BTD.device, dtype)


@torch.no_grad()
def fast_logits(
    adapter: ModelAdapter, task: Task, config: AF1Config, means: PositionMeans | None, batch_size: int = 256,
    kv: TokenLocalKV | None = None,
) -> torch.Tensor:
    """Last-position logits [P, V] under AF1, equal to `reference_logits` up to float rounding."""
    config.check(adapter.n_layers, adapter.n_heads)
    if supports(adapter, task, config) is not None:
        return reference_logits(adapter, task, config, means)
    kv = kv or token_local_kv(adapter, task, config, means)
    peek, pruned = set(config.peek_layers()), config.pruned_by_layer()
    layers = range(config.wait + 1, adapter.n_layers)
    out = []
    dtype = next(adapter.model.parameters()).dtype
    for sl in batches(len(task), batch_size):
        ids = task.input_ids_PT[sl]
        slots = kv.slots(ids)
        inputs = _last_token_inputs(adapter, ids)
        plans = {layer: _plan(adapter, kv, layer, slots, layer in peek, pruned.get(layer)) for layer in layers}
        with attention_plans(adapter, plans):
            h = adapter.run_layers(_start_state(kv, slots, inputs, dtype), inputs, config.wait + 1)
        out.append(adapter.logits(h)[:, -1].float().cpu())
    return torch.cat(out)


@torch.no_grad()
def fast_sweep_wait(
    adapter: ModelAdapter, task: Task, config: AF1Config, means: PositionMeans | None, transfers: list[int],
    batch_size: int = 256,
) -> dict[int, torch.Tensor]:
    """Logits for every transfer length at one `wait`, sharing the peeking prefix across lengths."""
    kv = token_local_kv(adapter, task, config, means)
    L, w = adapter.n_layers, config.wait
    wanted = sorted(transfers)
    result: dict[int, list[torch.Tensor]] = {k: [] for k in wanted}
    dtype = next(adapter.model.parameters()).dtype
    for sl in batches(len(task), batch_size):
        ids = task.input_ids_PT[sl]
        slots = kv.slots(ids)
        inputs = _last_token_inputs(adapter, ids)
        h = _start_state(kv, slots, inputs, dtype)
        done = 0
        for k in wanted:
            h = _run(adapter, kv, h, inputs, slots, w + 1 + done, w + 1 + k, peek=True)
            done = k
            tail = _run(adapter, kv, h, inputs, slots, w + 1 + k, L, peek=False)
            result[k].append(adapter.logits(tail)[:, -1].float().cpu())
    return {k: torch.cat(v) for k, v in result.items()}


def grid(n_layers: int, max_transfer: int | None = None) -> list[tuple[int, int]]:
    """Every (wait, transfer) cell: wait in -1..L-1, transfer in 0..min(max, L-1-wait)."""
    cells = []
    for w in range(-1, n_layers):
        top = n_layers - 1 - w
        if max_transfer is not None:
            top = min(top, max_transfer)
        cells.extend((w, k) for k in range(top + 1))
    return cells

