"""Attention interventions: per-layer plans applied inside one registered attention function.
Layers without a plan run the model's own kernel, so an empty plan changes no bit; GPT-J gets plans by a pre-hook."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from af1.errors import Af1Error
from af1.models.adapter import ModelAdapter

PREFIX = "af1_"
BASE_KERNELS = ("sdpa", "eager")


@dataclass
class LayerPlan:
    """What one layer's attention does differently: `allowed_BQK` (True: may attend; may be per head), `prefix_kv`
    ([B or 1, kv_heads, m, d], post-RoPE, before its own), `replace_mask` (the model's), `capture(module, q, k, v)`."""

    allowed_BQK: torch.Tensor | None = None
    prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    replace_mask: bool = False
    capture: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None


def combine_mask(
    model_mask: torch.Tensor | None, plan: LayerPlan, like: torch.Tensor, kernel: str
) -> torch.Tensor | None:
    """The model's mask (bool or additive float, [B,1,q,k], or None for causal) AND the plan's."""
    if plan.allowed_BQK is None:
        return None if plan.replace_mask else model_mask
    allowed = plan.allowed_BQK if plan.allowed_BQK.ndim == 4 else plan.allowed_BQK[:, None]
    allowed = allowed.to(like.device)
    if model_mask is not None and not plan.replace_mask:
        if model_mask.dtype == torch.bool:
            return model_mask[..., : allowed.shape[-1]] & allowed
        floor = torch.finfo(model_mask.dtype).min
        return torch.where(allowed, model_mask[..., : allowed.shape[-1]], floor)
    if kernel == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=like.dtype, device=like.device).masked_fill(
        ~allowed, torch.finfo(like.dtype).min
    )


def _eager_kernel(module: Any) -> Callable[..., Any]:
    return sys.modules[type(module).__module__].eager_attention_forward


def _planned_attention(kernel: str) -> Callable[..., Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        base = sdpa_attention_forward if kernel == "sdpa" else _eager_kernel(module)
        plan: LayerPlan | None = getattr(module, "_af1_plan", None)
        if plan is None:
            return base(module, query, key, value, attention_mask, **kwargs)
        one_query = kernel == "sdpa" and query.shape[2] == 1 and plan.allowed_BQK is None and plan.replace_mask
        one_query = one_query and plan.capture is None
        if one_query and plan.prefix_kv is not None and plan.prefix_kv[0].shape[0] in (1, query.shape[0]):
            return one_query_attention(query, key, value, plan.prefix_kv, kwargs.get("scaling"), kwargs.get("softcap"))
        if plan.prefix_kv is not None:
            prefix_k, prefix_v = (p.expand(key.shape[0], -1, -1, -1) for p in plan.prefix_kv)  # batch 1: shared
            key = torch.cat([prefix_k, key], dim=2)
            value = torch.cat([prefix_v, value], dim=2)
        if plan.capture is not None:
            plan.capture(module, query, key, value)
        return base(module, query, key, value, combine_mask(attention_mask, plan, query, kernel), **kwargs)

    return attention


def one_query_attention(
    query_BH1d: torch.Tensor,
    key_BJ1d: torch.Tensor,
    value_BJ1d: torch.Tensor,
    prefix: tuple[torch.Tensor, torch.Tensor],
    scaling: float | None,
    softcap: float | None,
) -> tuple[torch.Tensor, None]:
    """One query per row attending to a prefix ([B or 1, kv_heads, c, d]; batch 1: shared, read once) and its own key,
    without concatenating them or repeating key-value heads. Returns [B, 1, H, d] as the kernels do."""
    B, H, _, d = query_BH1d.shape
    J = key_BJ1d.shape[1]  # key-value heads; each serves G = H // J query heads
    dtype = query_BH1d.dtype  # scores and sums in float32 as the kernels do (bf16 scores would round ~0.1)
    q_BJGd = query_BH1d.float().reshape(B, J, H // J, d)
    key_BJ1d, value_BJ1d = key_BJ1d.float(), value_BJ1d.float()
    k_pre, v_pre = (p.float() for p in prefix)
    shared = k_pre.shape[0] == 1 < B
    pattern = "kcd" if shared else "bkcd"
    k_pre, v_pre = (k_pre[0], v_pre[0]) if shared else (k_pre, v_pre)
    scores = torch.cat(
        [
            torch.einsum(f"bkgd,{pattern}->bkgc", q_BJGd, k_pre),
            (q_BJGd * key_BJ1d[:, :, 0, None]).sum(-1, keepdim=True),
        ],
        -1,
    ) * (scaling if scaling is not None else d**-0.5)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    p = torch.softmax(scores, -1)
    out = torch.einsum(f"bkgc,{pattern}->bkgd", p[..., :-1], v_pre) + p[..., -1:] * value_BJ1d[:, :, 0, None]
    return out.reshape(B, 1, H, d).to(dtype), None


@functools.cache
def _register_kernels() -> None:
    """Registers af1's planned kernels with transformers once, on the first plan (importing transformers' attention
    machinery costs about 2 s, which `af1 <command> --help` need not pay)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

    for kernel in BASE_KERNELS:
        AttentionInterface.register(PREFIX + kernel, _planned_attention(kernel))
        ALL_MASK_ATTENTION_FUNCTIONS.register(PREFIX + kernel, sdpa_mask if kernel == "sdpa" else eager_mask)


class _PrefixCache:
    """Duck-typed cache for GPT-J: `update` prepends the plan's keys and values."""

    def __init__(self, prefix_kv: tuple[torch.Tensor, torch.Tensor]):
        self.prefix_kv = prefix_kv

    def update(self, key, value, layer_idx):
        return torch.cat([self.prefix_kv[0], key], dim=2), torch.cat([self.prefix_kv[1], value], dim=2)


def _gptj_pre_hook(module, args, kwargs):
    plan: LayerPlan | None = getattr(module, "_af1_plan", None)
    if plan is None:
        return None
    if plan.capture is not None:
        raise Af1Error("capturing attention logits is not supported for GPT-J")
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if plan.prefix_kv is not None:
        kwargs["layer_past"] = _PrefixCache(plan.prefix_kv)
    kwargs["attention_mask"] = combine_mask(kwargs.get("attention_mask"), plan, hidden.float(), "eager")
    return args, kwargs


def check_maskable(adapter: ModelAdapter) -> str:
    """The base kernel (sdpa or eager) that plans delegate to; flash and others are refused."""
    impl = adapter.attn_implementation.removeprefix(PREFIX)
    if impl not in BASE_KERNELS:
        raise Af1Error(
            f"attention implementation '{impl}' cannot take arbitrary masks: load the model with sdpa or eager"
        )
    return impl


@contextlib.contextmanager
def attention_plans(adapter: ModelAdapter, plans: dict[int, LayerPlan]) -> Iterator[None]:
    """Apply per-layer plans for the duration of the block; restore the model afterwards. Nested blocks
    compose: an inner plan replaces an outer one on the same layer, and the outer one is back on exit."""
    kernel = check_maskable(adapter)
    _register_kernels()
    for layer in plans:
        adapter.check_layer(layer)
    model = adapter.model
    previous = model.config._attn_implementation
    outer: dict[int, LayerPlan | None] = {
        layer: getattr(adapter.attention(layer), "_af1_plan", None) for layer in plans
    }
    handles = []
    try:
        if adapter.no_attention_interface() is None:
            model.config._attn_implementation = PREFIX + kernel
        else:  # one pre-hook per module: an outer block's hook already reads the module's current plan
            handles = [
                adapter.attention(i).register_forward_pre_hook(_gptj_pre_hook, with_kwargs=True)
                for i in plans
                if outer[i] is None
            ]
        for layer, plan in plans.items():
            # our mark on the module, read by the registered attention function (torch types it Tensor | Module)
            adapter.attention(layer)._af1_plan = plan  # pyright: ignore
        yield
    finally:
        for layer, plan in outer.items():
            if plan is not None:
                adapter.attention(layer)._af1_plan = plan  # pyright: ignore
            else:
                with contextlib.suppress(AttributeError):
                    del adapter.attention(layer)._af1_plan
        for h in handles:
            h.remove()
        model.config._attn_implementation = previous
