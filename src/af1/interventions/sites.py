"""Named sites of a model's forward pass, and the one way to record them: a context manager that yields a cache.

    with record(adapter, [residual(3), head_inputs(3), FINAL], last_only=True) as cache:
        adapter.model(ids)
    cache[residual(3)]  # [B, D]: the output of block 3 at the last position

Sites: `residual(l)` block l's output h[l] [B, T, D]; `head_inputs(l)` the heads entering o_proj [B, T, E]; `neurons(l)`
[B, T, I]; `mlp_output(l)` [B, T, D]; `FINAL` the final norm's input [B, T, D]."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from af1.interventions.hooks import hooks_removed_after
from af1.models.adapter import ModelAdapter


@dataclass(frozen=True)
class Site:
    kind: str  # one of KINDS
    layer: int | None = None


def residual(layer: int) -> Site:
    return Site("residual", layer)


def head_inputs(layer: int) -> Site:
    return Site("head_inputs", layer)


def neurons(layer: int) -> Site:
    """The MLP's neurons: the input of its output projection (after the activation, and the gate where it has one)."""
    return Site("neurons", layer)


def mlp_output(layer: int) -> Site:
    return Site("mlp_output", layer)


def attention_output(layer: int) -> Site:
    """The attention module's output (after o_proj, before any post-attention norm)."""
    return Site("attention_output", layer)


FINAL = Site("final")


def output_hidden(output: Any) -> torch.Tensor:
    """The hidden states of a module's output (decoder layers of some families return a tuple)."""
    return output[0] if isinstance(output, tuple) else output


KINDS = ("residual", "head_inputs", "neurons", "attention_output", "mlp_output", "final")
INPUTS = {"head_inputs", "neurons"}  # sites read before their module runs (a pre-hook): the others are outputs


def _check(adapter: ModelAdapter, site: Site) -> None:
    if site.kind not in KINDS:
        raise ValueError(f"unknown site {site.kind}; one of {', '.join(KINDS)}")
    if site.kind != "final":
        if site.layer is None:
            raise ValueError(f"the site {site.kind} needs a layer")
        adapter.check_layer(site.layer)


def _register(adapter: ModelAdapter, site: Site, put: Callable[[torch.Tensor], None]) -> Any:
    def before(_m: nn.Module, args: tuple[Any, ...]) -> None:
        put(args[0])

    def after(_m: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        put(output_hidden(output))

    if site.kind == "final":
        return adapter.final_norm.register_forward_pre_hook(before)
    assert site.layer is not None
    if site.kind == "residual":
        return adapter.layers[site.layer].register_forward_hook(after)
    if site.kind in INPUTS:
        return _module(adapter, site).register_forward_pre_hook(before)
    return _module(adapter, site).register_forward_hook(after)


def _module(adapter: ModelAdapter, site: Site) -> nn.Module:
    """The module whose input (head_inputs, neurons) or output (attention_output, mlp_output) the site is."""
    assert site.layer is not None
    parts = {
        "head_inputs": adapter.o_proj,
        "neurons": adapter.down_proj,
        "attention_output": adapter.attention,
        "mlp_output": adapter.mlp,
    }
    if site.kind not in parts:
        raise ValueError(f"the site {site.kind} is not a module's input or output")
    return parts[site.kind](site.layer)


Reduce = Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor]  # (kept so far or None, new value) -> kept


@contextlib.contextmanager
def record(
    adapter: ModelAdapter, sites: Iterable[Site], last_only: bool = False, reduce: Reduce | None = None
) -> Iterator[dict[Site, torch.Tensor]]:
    """Record each site during the block into the yielded cache: the last forward's value, or with `reduce` a running
    reduction over every forward; `last_only` keeps the last position, detached and copied ([B, ...])."""
    sites = list(sites)
    for site in sites:  # every site checked before any hook is registered: a bad one leaves none behind
        _check(adapter, site)
    cache: dict[Site, torch.Tensor] = {}

    def putter(site: Site) -> Callable[[torch.Tensor], None]:
        def put(x: torch.Tensor) -> None:
            x = x[:, -1].detach().clone() if last_only else x
            cache[site] = reduce(cache.get(site), x) if reduce is not None else x

        return put

    with hooks_removed_after([_register(adapter, site, putter(site)) for site in sites]):
        yield cache


Edit = Callable[[torch.Tensor], torch.Tensor]  # a site's value [B, T, ...] -> its replacement


def edit_sites(adapter: ModelAdapter, edits: dict[Site, Edit]) -> contextlib.AbstractContextManager[None]:
    """Rewrite sites during the block: a module's input (head_inputs, neurons) before it runs, or its output
    (attention_output, mlp_output; the rest of a tuple output passes through)."""

    def before(fn: Edit) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
        return lambda _m, args: (fn(args[0]), *args[1:])

    def after(fn: Edit) -> Callable[[nn.Module, tuple[Any, ...], Any], Any]:
        return lambda _m, _args, output: (fn(output[0]), *output[1:]) if isinstance(output, tuple) else fn(output)

    for site in edits:
        _check(adapter, site)
        _module(adapter, site)  # residual and final are recorded, never edited here
    return hooks_removed_after(
        _module(adapter, site).register_forward_pre_hook(before(fn))
        if site.kind in INPUTS
        else _module(adapter, site).register_forward_hook(after(fn))
        for site, fn in edits.items()
    )


@contextlib.contextmanager
def fixed_attention(adapter: ModelAdapter, outputs: dict[int, torch.Tensor]) -> Iterator[None]:
    """During the block, each given layer's attention module is not run but returns the given output ([B, T, D], no
    weights), e.g. heads frozen in path patching; a forward hook on it still sees the value."""
    for layer in outputs:
        adapter.check_layer(layer)
    modules = {layer: adapter.attention(layer) for layer in outputs}
    own = {layer: m.__dict__.get("forward") for layer, m in modules.items()}  # accelerate's device hooks live here
    try:
        for layer, module in modules.items():
            value = outputs[layer]
            module.forward = lambda *_a, value=value, **_k: (value, None)  # pyright: ignore
        yield
    finally:
        for layer, module in modules.items():
            with contextlib.suppress(AttributeError):
                del module.forward
            if own[layer] is not None:
                module.forward = own[layer]  # pyright: ignore
