"""The chosen heads' slices of W_Q, W_K, W_V and W_O: masks (key/value rows by group), saved and loaded as safetensors,
and the check that nothing outside them moved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from af1.errors import Af1Error
from af1.models.adapter import ModelAdapter, weight_of

GQA_CHOICE = "the key/value rows of each chosen query head's KV group are trained (shared with its sibling heads)"


def head_slices(adapter: ModelAdapter, heads: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Boolean masks over the attention parameters that belong to the chosen heads."""
    if (reason := adapter.no_head_slices()) is not None:
        raise Af1Error(f"precise fine-tuning does not support {reason}")
    d, group = adapter.head_dim, adapter.n_heads // adapter.n_kv_heads
    masks: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in adapter.model.named_parameters()}
    for layer, h in heads:
        if not (0 <= layer < adapter.n_layers and 0 <= h < adapter.n_heads):
            raise Af1Error(f"head ({layer}, {h}) is out of range: {adapter.n_layers} layers x {adapter.n_heads} heads")
        attn = adapter.attention(layer)
        for proj, rows in (("q_proj", h), ("k_proj", h // group), ("v_proj", h // group)):
            for p in getattr(attn, proj).parameters():
                m = masks.setdefault(names[id(p)], torch.zeros_like(p, dtype=torch.bool))
                m[rows * d : (rows + 1) * d] = True
        w = weight_of(adapter.o_proj(layer))
        m = masks.setdefault(names[id(w)], torch.zeros_like(w, dtype=torch.bool))
        m[:, h * d : (h + 1) * d] = True
    return masks


def save_slices(adapter: ModelAdapter, masks: dict[str, torch.Tensor], path: Path, meta: dict[str, Any]) -> Path:
    """Only the trained entries, with their masks, as safetensors; `load_slices` puts them back on a base model."""
    named = dict(adapter.model.named_parameters())
    tensors = {}
    for n, m in masks.items():
        tensors[f"{n}::values"] = named[n].detach()[m].cpu().contiguous()
        tensors[f"{n}::mask"] = m.cpu().contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"af1": json.dumps(meta)})
    return path


@torch.no_grad()
def load_slices(adapter: ModelAdapter, path: Path) -> None:
    """Put the trained entries `save_slices` wrote back into the model, in place."""
    named = dict(adapter.model.named_parameters())
    tensors = load_file(str(path))
    for key, values in tensors.items():
        if key.endswith("::values"):
            name = key.removesuffix("::values")
            if name not in named:
                raise Af1Error(f"{path} holds a slice of '{name}', which this model does not have")
            mask = tensors[f"{name}::mask"].to(named[name].device)
            named[name][mask] = values.to(named[name].dtype).to(named[name].device)


def check_frozen(adapter: ModelAdapter, base: dict[str, torch.Tensor], masks: dict[str, torch.Tensor] | None) -> None:
    """After training: no weight is NaN, and every entry outside the trained slices is bit-identical to the base."""
    for name, value in adapter.model.state_dict().items():
        if torch.isnan(value).any():
            raise Af1Error(f"fine-tuning made {name} NaN: lower the learning rate")
        if masks is None:
            continue
        frozen = ~masks[name].to(value.device) if name in masks else torch.ones_like(value, dtype=torch.bool)
        if not torch.equal(value[frozen], base[name].to(value.device)[frozen]):
            raise Af1Error(f"a frozen entry of {name} changed during precise fine-tuning")
