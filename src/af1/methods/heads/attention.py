"""Where heads look: the last query's attention over the prompt's tokens, per answer step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.interventions.attention import LayerPlan, attention_plans
from af1.methods.counterfactuals import NOT_OPERANDS
from af1.methods.heads.capture import per_layout, pooled, scored_steps
from af1.models.adapter import ModelAdapter
from af1.models.forward import forward_last
from af1.tasks.task import Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@torch.no_grad()
def last_query_attention(
    adapter: ModelAdapter, task: Task, heads: list[tuple[int, int]], scoring: str | None = None
) -> dict[str, dict[str, float]]:
    """Share of each head's attention from the last position to operands, the token after each (operator, '='), context,
    earlier answer tokens, itself and the rest, averaged over scored steps, then problems."""
    if task.groups:
        return pooled([(w, last_query_attention(adapter, group, heads, scoring)) for w, group in per_layout(task)])
    scored, steps = scored_steps(task, scoring)
    out: dict[str, dict[str, float]] = {}
    for step, weight in steps:
        for head, shares in _step_attention(adapter, step, heads, task.n_positions, scored == "full").items():
            into = out.setdefault(head, {})
            for g, share_P in shares.items():
                into[g] = into.get(g, 0.0) + float((share_P * weight).sum()) / len(task)
    return out


def _step_attention(
    adapter: ModelAdapter, step: Task, heads: list[tuple[int, int]], n_prompt: int, answer_group: bool
) -> dict[str, dict[str, torch.Tensor]]:
    """At one answer step: per head and position group, each problem's share of the last query's attention [P]."""
    probs = last_query_probs(adapter, step.input_ids_PT.to(adapter.device), heads, step.context_len)
    roles = list(step.layout)
    n = len(roles)
    prompt = range(n_prompt - 1)  # the prompt's positions but its last (the query at step 0; "other" after it)
    file = step.spec.file is not None  # a task file has slots, and the token after one, not operands and operators
    groups = {
        # the last position is its own group even when it spells a slot (induction)
        "slots" if file else "operands": [t for t in prompt if roles[t] not in NOT_OPERANDS],
        "after a slot" if file else "after an operand": [
            t for t in prompt if roles[t] == "const" and t > 0 and roles[t - 1] not in NOT_OPERANDS
        ],
        "context": [t for t in prompt if roles[t] == "context"],
    }
    if answer_group:
        groups["earlier answer tokens"] = list(range(n_prompt, n - 1))
    groups["last"] = [n - 1]
    named = {t for g in groups.values() for t in g}
    groups["other"] = [t for t in range(n) if t not in named]
    out = {}
    for layer, h in heads:
        p = probs[layer][:, h].cpu()  # [P, T]
        out[f"{layer}.{h}"] = {g: p[:, idx].sum(-1) for g, idx in groups.items()}
    return out


def last_query_probs(
    adapter: ModelAdapter, ids_PT: torch.Tensor, heads: list[tuple[int, int]], context_len: int = 0
) -> dict[int, torch.Tensor]:
    """Per layer of `heads`, the last position's attention over every position [P, head, T], in float32 from the
    queries and keys the attention interface receives (`context_len`: a shared prefix computed once)."""
    probs: dict[int, torch.Tensor] = {}
    group = adapter.n_heads // adapter.n_kv_heads

    def capture(layer: int):
        def fn(module, q, k, _v):
            k = k.repeat_interleave(group, dim=1) if k.shape[1] != q.shape[1] else k
            scale = getattr(module, "scaling", None) or q.shape[-1] ** -0.5
            probs[layer] = torch.softmax((q[:, :, -1:].float() @ k.float().transpose(-1, -2))[:, :, 0] * scale, -1)

        return fn

    layers = sorted({layer for layer, _ in heads})
    with attention_plans(adapter, {layer: LayerPlan(capture=capture(layer)) for layer in layers}):
        forward_last(adapter.model, ids_PT, context_len)
    return probs


@with_config(ConfigDict(extra="forbid"))
class TokenAttention(TypedDict):
    """One problem's tokens with each head's attention from the last position over them (`token_attention`)."""

    problem: int  # its row in the problems it was taken from
    prompt: str
    answer_step: int
    tokens: list[str]
    roles: list[str]
    heads: dict[str, list[float]]  # "layer.head" -> a weight per token


@torch.no_grad()
def token_attention(
    adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase, task: Task, heads: list[tuple[int, int]]
) -> TokenAttention | None:
    """Each head's attention from the last position over every token of one problem (the first of `task`, at its
    first answer step): the per-token picture behind `last_query_attention`'s shares, for the report to draw."""
    if not len(task) or not heads:
        return None
    step = task.steps()[0]
    row = int(step.rows_in_parent[0])  # the problem's row in `task`
    ids = step.input_ids_PT[:1].to(adapter.device)
    probs = last_query_probs(adapter, ids, heads)  # the whole input, context included: a weight for every token
    return TokenAttention(
        problem=row,
        prompt=task.problems[row].prompt,
        answer_step=0,
        tokens=[str(tokenizer.decode([t])) for t in ids[0].tolist()],
        roles=list(step.layout),
        heads={f"{layer}.{h}": [round(float(x), 5) for x in probs[layer][0, h].cpu()] for layer, h in heads},
    )
