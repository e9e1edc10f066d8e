"""The constant context computed once per model: its keys/values as the model's own cache, so that a forward over
a task runs only each problem's varying suffix (hooks see only it: `suffix_start`), as the full one up to rounding."""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from af1.models.adapter import input_device

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
MAX_CONTEXTS = 8  # contexts kept per model (one per task layout in a run; a study has a handful)


@dataclass
class Context:
    """One model's keys and values of one context, per layer ([1, kv_heads, c, head_dim]), and the weights'
    versions they were computed with (fine-tuning or a cast changes the weights: a stale context is recomputed)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    versions: tuple[int, ...]

    def cache(self, model: PreTrainedModel, batch: int) -> DynamicCache:
        """A fresh cache of `batch` rows holding the context (the forward appends the suffix to its own copy)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        for i, (k, v) in enumerate(self.layers):
            cache.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), i)
        return cache


_CONTEXTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], Context]] = weakref.WeakKeyDictionary()


def _versions(model: PreTrainedModel) -> tuple[int, ...]:
    """What a context depends on besides its ids: every weight's in-place version and storage (`model.to(dtype)`
    swaps the storage without a new version)."""
    return tuple(x for p in model.parameters() for x in (p._version, p.data_ptr()))


@contextlib.contextmanager
def unhooked(model: PreTrainedModel) -> Iterator[None]:
    """Run the unmodified model inside someone's hooks and attention plans (e.g. the shared context, computed the
    first time a hooked forward needs it): every module's forward hooks and plan are set aside for the block."""
    saved = []
    for module in model.modules():
        hooks = {name: getattr(module, name) for name in _HOOK_DICTS if getattr(module, name, None)}
        plan = module.__dict__.pop("_af1_plan", None)
        if hooks or plan is not None:
            saved.append((module, hooks, plan))
            for name in hooks:
                setattr(module, name, OrderedDict())
    try:
        yield
    finally:
        for module, hooks, plan in saved:
            for name, value in hooks.items():
                setattr(module, name, value)
            if plan is not None:
                module._af1_plan = plan


def unshared_reason(model: PreTrainedModel, n_positions: int) -> str | None:
    """Why the model's cache cannot carry a context for prompts of n positions (a sliding window shorter than the
    prompt would drop context the full forward reads; an encoder-decoder has no such cache), or None."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    if window and n_positions > window:
        return f"prompts of {n_positions} tokens exceed the sliding window {window}"
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    return None


def cache_keyword(model: PreTrainedModel) -> str:
    """The keyword a model's forward takes its key/value cache by: `cache` from transformers 5.24 on, else
    `past_key_values`. Read once per model class: it is on every forward's path."""
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def suffix_start(model: PreTrainedModel, ids_BT: torch.Tensor, context_len: int) -> int:
    """Where the positions a forward computes begin: the context's length when it is shared, else 0."""
    T = ids_BT.shape[1]
    c = min(context_len, T - 1)
    if c <= 0 or unshared_reason(model, T) is not None:
        return 0
    return c


def context_of(model: PreTrainedModel, ids_T: torch.Tensor) -> Context:
    """The context of these token ids, computed once per model (and recomputed after the weights change)."""
    per_model = _CONTEXTS.setdefault(model, {})
    key = tuple(int(t) for t in ids_T)
    versions = _versions(model)
    found = per_model.get(key)
    if found is not None and found.versions == versions:
        return found
    ids = ids_T[None].to(input_device(model))
    threads = torch.get_num_threads()
    if ids.device.type == "cpu":  # one row of a few tokens: CPU kernels split it by thread count, so use one thread
        torch.set_num_threads(1)  # for the same bits whatever the thread count (the suffix forwards are batched)
    try:
        with torch.no_grad(), unhooked(model):  # the context is the unmodified model's, whatever hooks are active
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
    finally:
        torch.set_num_threads(threads)
    past = out.cache if getattr(out, "cache", None) is not None else out.past_key_values  # renamed in 5.24
    layers = [(layer.keys.detach(), layer.values.detach()) for layer in past.layers]
    if key not in per_model and len(per_model) >= MAX_CONTEXTS:  # a stale one is replaced in place
        per_model.pop(next(iter(per_model)))
    per_model[key] = Context(layers, versions)
    return per_model[key]


def forget_contexts(model: PreTrainedModel) -> None:
    """Drop a model's computed contexts (the next forward computes them again): for timing a cold start."""
    _CONTEXTS.pop(model, None)


def forward_last(model: PreTrainedModel, ids_BT: torch.Tensor, context_len: int = 0) -> torch.Tensor:
    """Next-token logits [B, V] at the last position (fp32, CPU), with explicit mask and position ids; the first
    `context_len` positions (the same in every row) come from the context's cache when the model can share it."""
    return forward_tail(model, ids_BT, context_len, 1)[:, -1]


def forward_tail(model: PreTrainedModel, ids_BT: torch.Tensor, context_len: int = 0, keep: int = 1) -> torch.Tensor:
    """Next-token logits [B, keep, V] at the last `keep` positions (fp32, CPU): `forward_last` for several teacher-
    forced answer steps at once (a causal position never reads later ones)."""
    B, T = ids_BT.shape
    ids = ids_BT.to(input_device(model))
    c = suffix_start(model, ids_BT, context_len)
    if c and not bool((ids_BT[:, :c] == ids_BT[:1, :c]).all()):
        raise ValueError("the rows differ inside the context they are said to share")
    pos = torch.arange(c, T, device=ids.device).expand(B, T - c)
    extra: dict[str, Any] = {"use_cache": False}
    if c:
        extra = {cache_keyword(model): context_of(model, ids_BT[0, :c]).cache(model, B), "use_cache": True}
    # the kept positions are a strided view of the hidden states: the unembedding takes a copy, one matrix product
    # (over a view it multiplies row by row, several times slower for a large vocabulary)
    head = model.get_output_embeddings()
    assert head is not None, "a causal LM has an unembedding"
    hook = head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))
    try:
        out = model(
            input_ids=ids[:, c:], attention_mask=torch.ones_like(ids), position_ids=pos, logits_to_keep=keep, **extra
        )
    finally:
        hook.remove()
    return out.logits[:, -keep:].float().cpu()
