"""Residual-stream interventions: overwrite the output of a decoder layer (recording is `sites.record`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from af1.interventions.hooks import hooks_removed_after
from af1.interventions.sites import output_hidden
from af1.models.adapter import ModelAdapter

Edit = Callable[[torch.Tensor], torch.Tensor]  # [B, T, D] -> [B, T, D]


def _set_hidden(output, hidden: torch.Tensor):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def edit_residual(adapter: ModelAdapter, edits: dict[int, Edit]) -> contextlib.AbstractContextManager[None]:
    """Replace the output of block l by edits[l](output) (h[l] in docs/methods.md's notation)."""
    for layer in edits:
        adapter.check_layer(layer)
    return hooks_removed_after(
        adapter.layers[layer].register_forward_hook(
            lambda _m, _a, output, edit=edit: _set_hidden(output, edit(output_hidden(output)))
        )
        for layer, edit in edits.items()
    )


def replace_positions(hidden_BTD: torch.Tensor, new_BTD: torch.Tensor, start: int) -> torch.Tensor:
    """Positions start.. taken from `new` (moved to the layer's device and dtype), earlier ones kept."""
    out = hidden_BTD.clone()
    out[:, start:] = new_BTD[:, start:].to(hidden_BTD.device, hidden_BTD.dtype)
    return out


def zero_attention_outputs(
    adapter: ModelAdapter, positions: dict[int, list[int]]
) -> contextlib.AbstractContextManager[None]:
    """Zero the attention module's output of block l at positions[l] (before it joins the residual stream)."""

    def zero(output, rows: list[int]):
        hidden = output_hidden(output).clone()
        hidden[:, rows] = 0
        return _set_hidden(output, hidden)

    return hooks_removed_after(
        adapter.attention(layer).register_forward_hook(lambda _m, _a, output, rows=rows: zero(output, rows))
        for layer, rows in positions.items()
        if rows
    )
