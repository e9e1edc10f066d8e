"""Fast AF1: after block `wait` a non-last position is a function of its position and token, so its keys/values are
computed once and only the last token runs per problem; `supports` says why it refuses a case (`pick` reroutes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from af1.errors import Af1Error
from af1.executors.greedy import greedy_tokens
from af1.executors.reference import reference_logits
from af1.interventions.af1 import AF1Config, ablated_states
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.masks import last_token_knockout
from af1.interventions.means import PositionMeans, row_hashes, slot_table
from af1.interventions.sites import record, residual
from af1.models.adapter import LayerInputs, ModelAdapter
from af1.models.forward import context_of, forward_last, unshared_reason
from af1.progress import progress
from af1.tasks.evaluation import batches
from af1.tasks.task import Task


def supports(adapter: ModelAdapter, task: Task, config: AF1Config) -> str | None:
    """None if the fast executor covers this case, else the reason it does not."""
    if (reason := adapter.no_attention_interface()) is not None:
        return reason
    if config.abp != "af1":
        return f"the fast executor computes ABP variant af1 only, not '{config.abp}'"
    if config.wait >= 0 and config.ablation not in ("cama", "mean", "zero"):
        return f"ablation '{config.ablation}' does not make positions token-local"
    return unshared_reason(adapter.model, task.n_positions)


@dataclass
class ProblemKV:
    """Keys/values [B, kv_heads, n-1, head_dim] of positions 0..n-2 of real prompts, per layer."""

    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    context_len: int
    states: dict[int, torch.Tensor] = field(default_factory=dict)  # h[l] [B, T, D], when asked for

    def prefix(self, layer: int, rows: torch.Tensor, peek: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """All earlier positions of each prompt, or only the context (`rows` is unused: one batch)."""
        k, v = self.keys[layer], self.values[layer]
        if peek:
            return k, v
        return k[:, :, : self.context_len], v[:, :, : self.context_len]


@dataclass
class TokenLocalKV:
    """Keys/values of the suffix positions c..n-2 in blocks after `wait`, per column (a slot of the means' table, or a
    leave-one-out problem's own), and the last token's start."""

    wait: int
    keys: dict[int, torch.Tensor]  # layer -> [suffix position, column, kv_heads, head_dim]
    values: dict[int, torch.Tensor]
    start_TSD: torch.Tensor | None  # h[wait] per (position, column), None for wait = -1
    slot_tokens_TS: torch.Tensor  # [position, column]: a token slot's token id, -1 where unused or a problem's own
    context: ProblemKV
    own_columns: dict[bytes, int] = field(default_factory=dict)  # a prompt's ids -> its own column
    members: torch.Tensor | None = None  # `row_hashes` of the means' problems, where a member needs its own column

    @property
    def context_len(self) -> int:
        return self.context.context_len

    def slots(self, ids_BT: torch.Tensor) -> torch.Tensor:
        """The column of each (position, token): a problem's own column at every position when it has one, else
        its token's slot; a token the table has not seen at its position is an error."""
        ids_BT = ids_BT.cpu()
        hit_BTS = self.slot_tokens_TS[None] == ids_BT[..., None]
        own = [self.own_columns.get(row.numpy().tobytes()) for row in ids_BT]
        mine = torch.tensor([o is not None for o in own], dtype=torch.bool)
        if not bool(hit_BTS[~mine].any(-1).all()):
            raise Af1Error("a token at some position has no slot in the token-local table (means of another task?)")
        if self.members is not None and bool(torch.isin(row_hashes(ids_BT[~mine]), self.members).any()):
            raise Af1Error("a problem inside the means has no column of its own: the table is another problem set's")
        slots = hit_BTS.float().argmax(-1)
        for b, col in enumerate(own):
            if col is not None:
                slots[b] = col
        return slots

    def prefix(self, layer: int, slots_BT: torch.Tensor, peek: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, kv_heads, m, head_dim] keys/values the last query reads: all earlier positions, or the context (one
        copy for every row: a batch-1 prefix, `one_query_attention`)."""
        ctx_k, ctx_v = self.context.keys[layer], self.context.values[layer]  # [1, kv_heads, c, head_dim]
        if not peek:
            return ctx_k, ctx_v
        B, T = slots_BT.shape
        c = self.context_len
        pos = torch.arange(T - 1 - c)[None]
        cols = slots_BT[:, c : T - 1]
        k = self.keys[layer][pos, cols].transpose(1, 2)
        v = self.values[layer][pos, cols].transpose(1, 2)
        return torch.cat([ctx_k.expand(B, -1, -1, -1), k], 2), torch.cat([ctx_v.expand(B, -1, -1, -1), v], 2)


def context_kv(adapter: ModelAdapter, task: Task) -> ProblemKV:
    """Keys/values of the context positions in every layer: the same for every problem and every config, so
    computed once per model and context (`af1.models.forward`)."""
    c = task.context_len
    layers = context_of(adapter.model, task.input_ids_PT[0, :c]).layers
    return ProblemKV({i: k for i, (k, _) in enumerate(layers)}, {i: v for i, (_, v) in enumerate(layers)}, c)


def _ablated_TSD(config: AF1Config, means: PositionMeans | None, table_TS: torch.Tensor) -> torch.Tensor:
    """What the ablation writes into h[wait] for each (position, slot) of the table: [T, S, D]."""
    if config.ablation == "cama":
        if means is None:
            raise ValueError("CAMA needs position means")
        return means.cond_TSD(config.wait)
    ids = table_TS.clamp(min=0).T  # S rows; every slot's token at every position (padding as token 0, unused)
    return ablated_states(config, means, ids).transpose(0, 1)


def _run_rows(
    adapter: ModelAdapter,
    ctx: ProblemKV,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    start: int,
    hidden: torch.Tensor | None,
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One-token rows, each at its own position, attending to the context and itself through blocks start..L-1 (from
    the embedding, or from `hidden`): their keys/values [R, kv_heads, 1, d] in those blocks."""
    R, c = len(tokens), ctx.context_len
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def capture(layer: int):
        def fn(_module, _q, k, v):
            captured[layer] = k[:, :, c:], v[:, :, c:]

        return fn

    inputs = adapter.layer_inputs(tokens[:, None].to(adapter.device), positions[:, None].to(adapter.device))
    plans = {
        layer: LayerPlan(
            prefix_kv=(ctx.keys[layer].expand(R, -1, -1, -1), ctx.values[layer].expand(R, -1, -1, -1)),
            replace_mask=True,
            capture=capture(layer),
        )
        for layer in range(start, adapter.n_layers)
    }
    dtype = next(adapter.model.parameters()).dtype
    h = inputs.hidden_BTD if hidden is None else hidden[:, None].to(adapter.device, dtype)
    with attention_plans(adapter, plans):
        adapter.run_layers(h, inputs, start)
    return captured


@torch.no_grad()
def own_states(adapter: ModelAdapter, task: Task, layers: list[int], batch_size: int = 64) -> dict[int, torch.Tensor]:
    """The unmodified h[layer] of every problem at its suffix positions c..n-1, per layer: [P, n-c, D] (fp32, CPU)."""
    s = task.n_positions - task.context_len
    out: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    for sl in batches(len(task), batch_size):
        with record(adapter, [residual(layer) for layer in layers]) as cache:
            forward_last(adapter.model, task.input_ids_PT[sl], task.context_len)
        for layer in layers:
            out[layer].append(cache[residual(layer)][:, -s:].float().cpu())
    return {layer: torch.cat(parts) for layer, parts in out.items()}


def _own_columns(
    adapter: ModelAdapter, config: AF1Config, means: PositionMeans | None, task: Task, own_PUD: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Problems whose ablated states are not a function of (position, token) (leave-one-out, or a token the means never
    saw): (their rows in `task`, the ablated suffix states [R, n-c, D]); None when there are none."""
    if config.wait < 0 or means is None:
        return None
    ids = task.input_ids_PT
    rows_P = means.unseen(ids)  # a token the means never saw at a position has no slot
    if config.leaves_one_out:
        rows_P |= means.inside(ids)
    rows = rows_P.nonzero().flatten()
    if not len(rows):
        return None
    own = own_PUD[rows] if own_PUD is not None else own_states(adapter, task.subset(rows), [config.wait])[config.wait]
    start = ablated_states(config, means, task.input_ids_PT[rows], own).float()
    if config.ablation == "cama":  # CAMA leaves the first varying position alone: its own state
        start[:, 0] = own[:, 0].float()
    return rows, start


@torch.no_grad()
def token_local_kv(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    means: PositionMeans | None,
    ctx: ProblemKV | None = None,
    own_PUD: torch.Tensor | None = None,
    like: TokenLocalKV | None = None,
) -> TokenLocalKV:
    """Keys/values after `wait` per (position, token), and the last token's state entering block wait+1. `own_PUD`: the
    unablated h[wait] [P, n-c, D] of leave-one-out rows (computed when None); `like`: another step's tables to reuse."""
    if config.wait >= 0 and config.ablation not in ("cama", "mean", "zero"):
        raise ValueError(f"the {config.ablation} ablation does not make positions token-local")
    table = means.slot_tokens_TS if means is not None and config.wait >= 0 else slot_table(task.input_ids_PT)
    T, S = table.shape
    c, w = task.context_len, config.wait
    ctx = ctx or context_kv(adapter, task)
    start_TSD = _ablated_TSD(config, means, table).float() if w >= 0 else None
    row_pos, row_col = (table[c : T - 1] >= 0).nonzero(as_tuple=True)
    row_pos = row_pos + c
    tokens = table[row_pos, row_col]
    own_columns: dict[bytes, int] = {}
    own = _own_columns(adapter, config, means, task, own_PUD) if w >= 0 else None
    if own is not None and start_TSD is not None:
        rows, own_start_PUD = own
        R = len(rows)
        ids_RT = task.input_ids_PT[rows]
        own_columns = {row.numpy().tobytes(): S + i for i, row in enumerate(ids_RT)}
        table = torch.cat([table, torch.full((T, R), -1, dtype=table.dtype)], 1)
        own_TRD = torch.zeros(T, R, start_TSD.shape[-1])
        own_TRD[c:] = own_start_PUD.transpose(0, 1)
        start_TSD = torch.cat([start_TSD, own_TRD], 1)
        own_pos = torch.arange(c, T - 1).repeat_interleave(R)
        own_col = torch.arange(R).repeat(T - 1 - c)
        row_pos, row_col = torch.cat([row_pos, own_pos]), torch.cat([row_col, S + own_col])
        tokens = torch.cat([tokens, ids_RT[own_col, own_pos]])
    shared, width = _shared_positions(like, w, c, table, start_TSD, ctx) if like is not None else ([], 0)
    if shared:  # their slot rows are taken from `like`; a problem's own column still runs here
        run = ~torch.isin(row_pos, torch.tensor(shared)) | (row_col >= width)
        row_pos, row_col, tokens = row_pos[run], row_col[run], tokens[run]
    hidden = start_TSD[row_pos, row_col] if start_TSD is not None else None
    captured = _run_rows(adapter, ctx, tokens, row_pos, w + 1, hidden) if len(row_pos) else {}
    keys: dict[int, torch.Tensor] = {}
    values: dict[int, torch.Tensor] = {}
    columns = table.shape[1]
    for layer in range(w + 1, adapter.n_layers):
        for out, context, kv in ((keys, ctx.keys, 0), (values, ctx.values, 1)):
            ref = context[layer]  # [1, kv heads, c, d]
            suffix = torch.zeros(T - 1 - c, columns, ref.shape[1], ref.shape[3], dtype=ref.dtype, device=ref.device)
            if layer in captured:
                suffix[row_pos - c, row_col] = captured[layer][kv][:, :, 0]
            if shared and like is not None:
                at = torch.tensor(shared) - c
                suffix[at, :width] = (like.keys if kv == 0 else like.values)[layer][at, :width]
            out[layer] = suffix
    members = means.member_hashes if means is not None and config.leaves_one_out else None
    return TokenLocalKV(w, keys, values, start_TSD, table, ctx, own_columns, members)


def _shared_positions(
    like: TokenLocalKV, wait: int, c: int, table: torch.Tensor, start_TSD: torch.Tensor | None, ctx: ProblemKV
) -> tuple[list[int], int]:
    """The positions whose slot rows `like` (another answer step's tables) already holds, and how many slot columns
    it has: the same wait and context, the same tokens in the same slots and the same start states."""
    width = min(like.own_columns.values(), default=like.slot_tokens_TS.shape[1])  # its problems' own columns follow
    if (
        like.wait != wait
        or like.context_len != c
        or any(not torch.equal(k, like.context.keys[i]) for i, k in ctx.keys.items())
    ):
        return [], width
    out = []
    for p in range(c, min(table.shape[0], like.slot_tokens_TS.shape[0]) - 1):
        same = torch.equal(table[p, :width], like.slot_tokens_TS[p, :width]) and bool((table[p, width:] < 0).all())
        if same and start_TSD is not None and like.start_TSD is not None:
            same = torch.equal(start_TSD[p, :width], like.start_TSD[p, :width])
        if same:
            out.append(p)
    return out, width


def _plan(
    adapter: ModelAdapter,
    kv: TokenLocalKV | ProblemKV,
    layer: int,
    rows: torch.Tensor,
    peek: bool,
    pruned: list[int] | None = None,
) -> LayerPlan:
    prefix = kv.prefix(layer, rows, peek)
    if not pruned:
        return LayerPlan(prefix_kv=prefix, replace_mask=True)
    T = prefix[0].shape[2] + 1
    keys = torch.arange(T)
    allowed = torch.ones(1, adapter.n_heads, 1, T, dtype=torch.bool)
    allowed[0, pruned, 0] = (keys < kv.context_len) | (keys == T - 1)
    return LayerPlan(allowed_BQK=allowed, prefix_kv=prefix, replace_mask=True)


def run_last(
    adapter: ModelAdapter,
    kv: TokenLocalKV | ProblemKV,
    h_B1D: torch.Tensor,
    inputs: LayerInputs,
    slots_BT: torch.Tensor,
    start: int,
    stop: int,
    peek: bool,
) -> torch.Tensor:
    """The last token's states [B, 1, D] through blocks start..stop-1, reading every earlier position (`peek`) or
    the context alone."""
    plans = {layer: _plan(adapter, kv, layer, slots_BT, peek) for layer in range(start, stop)}
    with attention_plans(adapter, plans):
        return adapter.run_layers(h_B1D, inputs, start, stop)


def last_token_inputs(adapter: ModelAdapter, ids_BT: torch.Tensor) -> LayerInputs:
    B, T = ids_BT.shape
    return adapter.layer_inputs(ids_BT[:, -1:].to(adapter.device), torch.full((B, 1), T - 1, device=adapter.device))


def start_state(
    adapter: ModelAdapter, kv: TokenLocalKV, ids_BT: torch.Tensor, slots_BT: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The last token's state entering block wait+1: its ablated h[wait], or its embedding for wait = -1."""
    if kv.start_TSD is None:  # the last token may vary (a later answer step): embed every row
        return last_token_inputs(adapter, ids_BT).hidden_BTD
    T = slots_BT.shape[1]
    return kv.start_TSD[T - 1, slots_BT[:, -1]][:, None].to(adapter.device, dtype)


@torch.no_grad()
def fast_logits(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    means: PositionMeans | None,
    batch_size: int = 256,
    kv: TokenLocalKV | None = None,
) -> torch.Tensor:
    """Last-position logits [P, V] under AF1, equal to `reference_logits` up to float rounding."""
    if (reason := supports(adapter, task, config)) is not None:
        raise ValueError(f"fast executor unsupported: {reason}")
    kv = kv or token_local_kv(adapter, task, config, means)
    peek, pruned = set(config.peek_layers()), config.pruned_by_layer()
    layers = range(config.wait + 1, adapter.n_layers)
    out = []
    dtype = next(adapter.model.parameters()).dtype
    for sl in batches(len(task), batch_size):
        ids = task.input_ids_PT[sl]
        slots = kv.slots(ids)
        inputs = last_token_inputs(adapter, ids[:1])  # one row: every row has the same position (kwargs only)
        plans = {layer: _plan(adapter, kv, layer, slots, layer in peek, pruned.get(layer)) for layer in layers}
        with attention_plans(adapter, plans):
            h = adapter.run_layers(start_state(adapter, kv, ids, slots, dtype), inputs, config.wait + 1)
        out.append(adapter.logits(h)[:, -1].float().cpu())
    return torch.cat(out)


@torch.no_grad()
def fast_sweep_wait(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    means: PositionMeans | None,
    transfers: list[int],
    batch_size: int = 128,
    greedy: bool = False,
    kv: TokenLocalKV | None = None,
) -> dict[int, torch.Tensor]:
    """Logits [P, V] (with `greedy` the greedy tokens [P], `af1.executors.greedy`) per transfer length at one wait.
    The shared peeking prefix runs once and the compute tails as one wavefront: one call per layer for all lengths."""
    wanted = sorted(transfers)
    if (reason := supports(adapter, task, config)) is not None:
        raise ValueError(f"fast executor unsupported: {reason}")
    kv = kv or token_local_kv(adapter, task, config, means)
    L, w = adapter.n_layers, config.wait
    result: dict[int, list[torch.Tensor]] = {k: [] for k in wanted}
    dtype = next(adapter.model.parameters()).dtype
    for sl in batches(len(task), batch_size):
        ids = task.input_ids_PT[sl]
        B = ids.shape[0]
        slots = kv.slots(ids)
        inputs = last_token_inputs(adapter, ids[:1])  # one row: every row has the same position (kwargs only)
        h = start_state(adapter, kv, ids, slots, dtype)
        branch_at: dict[int, torch.Tensor] = {}  # first compute layer -> state entering it
        done = 0
        for k in wanted:
            h = run_last(adapter, kv, h, inputs, slots, w + 1 + done, w + 1 + k, peek=True)
            done = k
            branch_at[w + 1 + k] = h
        wave = torch.empty(0, 1, h.shape[-1], dtype=h.dtype, device=h.device)
        for layer in range(w + 1, L):
            if layer in branch_at:
                wave = torch.cat([wave, branch_at[layer]])
            if not len(wave):
                continue
            rows = torch.zeros(wave.shape[0], 1, dtype=torch.long)
            with attention_plans(adapter, {layer: _plan(adapter, kv, layer, rows, peek=False)}):
                wave = adapter.run_layers(wave, inputs, layer, layer + 1)
        if L in branch_at:  # transfer through the last layer: nothing left to compute
            wave = torch.cat([wave, branch_at[L]])
        order = [k for k in wanted if w + 1 + k < L] + [k for k in wanted if w + 1 + k == L]
        if greedy:
            tokens = greedy_tokens(adapter, wave[:, -1])
            for i, k in enumerate(order):
                result[k].append(tokens[i * B : (i + 1) * B])
            continue
        for i, k in enumerate(order):
            result[k].append(adapter.logits(wave[i * B : (i + 1) * B])[:, -1].float().cpu())
    return {k: torch.cat(v) for k, v in result.items()}


@torch.no_grad()
def fast_pruned_logits(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    kv: TokenLocalKV,
    head_sets: list[list[tuple[int, int]]],
    max_rows: int = 1024,
) -> list[torch.Tensor]:
    """Logits [P, V] for each set of transfer heads kept from peeking (on top of config's own), all sets in one
    batch: the path up to the first peek layer is shared, and each row carries its own per-head mask."""
    peek = config.peek_layers()
    first = peek[0] if peek else adapter.n_layers
    own = config.pruned_by_layer()
    dtype = next(adapter.model.parameters()).dtype
    out: list[list[torch.Tensor]] = [[] for _ in head_sets]
    for sl in batches(len(task), max(1, max_rows)):
        ids = task.input_ids_PT[sl]
        B = ids.shape[0]
        slots = kv.slots(ids)
        inputs = last_token_inputs(adapter, ids[:1])
        h0 = run_last(
            adapter, kv, start_state(adapter, kv, ids, slots, dtype), inputs, slots, config.wait + 1, first, False
        )
        per_chunk = max(1, max_rows // B)
        for c0 in range(0, len(head_sets), per_chunk):
            sets = head_sets[c0 : c0 + per_chunk]
            S = len(sets)
            rows = slots.repeat(S, 1)
            plans = {}
            for layer in range(first, adapter.n_layers):
                prefix = kv.prefix(layer, rows, layer in peek)
                if layer not in peek:
                    plans[layer] = LayerPlan(prefix_kv=prefix, replace_mask=True)
                    continue
                T = prefix[0].shape[2] + 1
                keys = torch.arange(T)
                allowed = torch.ones(S, adapter.n_heads, 1, T, dtype=torch.bool)
                for i, hs in enumerate(sets):
                    heads = own.get(layer, []) + [h for lay, h in hs if lay == layer]
                    allowed[i, heads, 0] = (keys < kv.context_len) | (keys == T - 1)
                plans[layer] = LayerPlan(
                    allowed_BQK=allowed.repeat_interleave(B, 0), prefix_kv=prefix, replace_mask=True
                )
            with attention_plans(adapter, plans):
                h = adapter.run_layers(h0.repeat(S, 1, 1), inputs, first)
            logits = adapter.logits(h)[:, -1].float().cpu()
            for i in range(S):
                out[c0 + i].append(logits[i * B : (i + 1) * B])
    return [torch.cat(o) for o in out]


def grid(n_layers: int, max_transfer: int | None = None) -> list[tuple[int, int]]:
    """Every (wait, transfer) cell: wait in -1..L-1, transfer in 0..min(max, L-1-wait)."""
    most = n_layers if max_transfer is None else max_transfer
    return [(w, k) for w in range(-1, n_layers) for k in range(min(n_layers - 1 - w, most) + 1)]


@torch.no_grad()
def capture_problem_kv(
    adapter: ModelAdapter, ids_BT: torch.Tensor, context_len: int, with_states: bool = False
) -> ProblemKV:
    """One plain forward that keeps every layer's keys/values of positions 0..n-2 (and, `with_states`, every
    block's output h[l] of the positions it computed: the suffix when the context is shared)."""
    keys: dict[int, torch.Tensor] = {}
    values: dict[int, torch.Tensor] = {}

    def capture(layer: int):
        def fn(_module, _q, k, v):
            keys[layer], values[layer] = k[:, :, :-1], v[:, :, :-1]

        return fn

    plans = {layer: LayerPlan(capture=capture(layer)) for layer in range(adapter.n_layers)}
    recorded = range(adapter.n_layers) if with_states else range(0)
    with attention_plans(adapter, plans), record(adapter, [residual(layer) for layer in recorded]) as cache:
        forward_last(adapter.model, ids_BT, context_len)  # the captured keys include the shared context's
    states = {layer: cache[residual(layer)] for layer in recorded}
    return ProblemKV(keys, values, context_len, states)


@torch.no_grad()
def knockout_logits(
    adapter: ModelAdapter, task: Task, blocked: list[list[int]], batch_size: int = 128, greedy: bool = False
) -> list[torch.Tensor]:
    """Last-position logits [P, V] (with `greedy` the greedy tokens [P]) per layer set of the unmodified model, except
    that in those layers the last token reads only context and itself."""
    if adapter.no_attention_interface() is not None:
        out = [
            reference_logits(
                adapter,
                task,
                AF1Config(abp="none"),
                None,
                extra_masks=last_token_knockout(task.n_positions, task.context_len, layers),
            )
            for layers in blocked
        ]
        return [o.argmax(-1) for o in out] if greedy else out
    parts: list[list[torch.Tensor]] = [[] for _ in blocked]
    L = adapter.n_layers
    for sl in progress(list(batches(len(task), batch_size)), desc=f"knock-outs ({len(blocked)} layer sets)"):
        ids = task.input_ids_PT[sl]
        kv = capture_problem_kv(adapter, ids, task.context_len, with_states=True)
        inputs = last_token_inputs(adapter, ids)
        rows = torch.arange(ids.shape[0])
        for i, layers in enumerate(blocked):
            first = min(layers, default=L)  # below it the last token runs as in the plain forward: start there
            h = inputs.hidden_BTD if first == 0 else kv.states[first - 1][:, -1:]
            plans = {layer: _plan(adapter, kv, layer, rows, peek=layer not in layers) for layer in range(first, L)}
            with attention_plans(adapter, plans):
                h = adapter.run_layers(h, inputs, first)
            parts[i].append(greedy_tokens(adapter, h[:, -1]) if greedy else adapter.logits(h)[:, -1].float().cpu())
    return [torch.cat(o) for o in parts]
