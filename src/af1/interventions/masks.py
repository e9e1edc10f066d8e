"""Which query may read which key, per layer: ABP (attention-based peeking) and its variants.
Every mask is boolean [1, n, n] (True: may attend), already causal; positions before `context_len` are the context."""

from __future__ import annotations

from typing import Literal

import torch

ABPVariant = Literal["af1", "none", "sink", "all-peek", "zero-output"]
ABP_VARIANTS: tuple[str, ...] = ("af1", "none", "sink", "all-peek", "zero-output")


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def self_and_context(n: int, context_len: int, mask_sink: bool = False) -> torch.Tensor:
    """Context queries keep causal attention; every other query sees the context and itself."""
    allowed = causal(n)
    keys = torch.arange(n)
    for q in range(context_len, n):
        row = (keys < context_len) | (keys == q)
        if mask_sink:
            row &= (keys != 0) | (keys == q)
        allowed[q] = row
    return allowed


def abp_masks(
    n: int,
    context_len: int,
    wait: int,
    peek_layers: list[int],
    n_layers: int,
    variant: ABPVariant = "af1",
    pruned_heads: dict[int, list[int]] | None = None,
    n_heads: int = 1,
) -> dict[int, torch.Tensor]:
    """ABP after block `wait`: the last query peeks in `peek_layers` and sees only context+self elsewhere; pruned
    heads of a peek layer behave as in a compute layer (their masks become per head)."""
    if variant in (
        "none",
        "zero-output",
    ):  # zero-output edits attention outputs instead (`interventions.af1.zeroed_outputs`)
        return {}
    restricted = self_and_context(n, context_len, mask_sink=variant == "sink")
    full = causal(n)
    masks = {}
    for layer in range(wait + 1, n_layers):
        allowed = restricted.clone()
        if layer in peek_layers:
            allowed[n - 1] = full[n - 1]
            if variant == "all-peek":
                allowed[context_len:] = full[context_len:]
            heads = (pruned_heads or {}).get(layer)
            if heads:
                masks[layer] = head_knockout(allowed, n_heads, heads, restricted[n - 1])
                continue
        masks[layer] = allowed[None]
    return masks


def last_token_knockout(n: int, context_len: int, layers: list[int]) -> dict[int, torch.Tensor]:
    """Necessity: in the given layers the last query reads only the context and itself."""
    allowed = causal(n)
    keys = torch.arange(n)
    allowed[n - 1] = (keys < context_len) | (keys == n - 1)
    return {layer: allowed[None] for layer in layers}


def head_knockout(mask_QK: torch.Tensor, n_heads: int, heads: list[int], restricted_row: torch.Tensor) -> torch.Tensor:
    """Per-head masks [1, heads, n, n]: the listed heads' last row replaced by `restricted_row`."""
    per_head = mask_QK.expand(n_heads, *mask_QK.shape[-2:]).clone()
    for h in heads:
        per_head[h, -1] = restricted_row
    return per_head[None]
