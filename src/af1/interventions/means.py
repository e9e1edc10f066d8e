"""Position means of the residual stream for CAMA and the token-agnostic mean ablation.

One streaming pass over a task accumulates fp32 sums of h[l][t] per (layer, position,
token at t): memory is independent of the number of problems. Means are saved as
safetensors with a key of the model and the task's token layout, and reused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from af1.context import forward_last, suffix_start
from af1.errors import Af1Error
from af1.evaluation import batches
from af1.interventions.sites import record, residual
from af1.models.adapter import ModelAdapter
from af1.progress import progress
from af1.results import write_atomic
from af1.tasks import Task


def model_fingerprint(adapter: ModelAdapter) -> str:
    """The identity of a model's numbers: its config and every byte of every parameter (in its own dtype), so
    that a model changed anywhere (fine-tuned, edited) never reads another's cached means."""
    digest = hashlib.sha256(adapter.config.to_json_string(use_diff=False).encode())
    for name, p in adapter.named_weights():
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
        digest.update(p.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()[:32]


def means_key(adapter: ModelAdapter, task: Task) -> str:
    digest = hashlib.sha256(model_fingerprint(adapter).encode())
    digest.update(task.input_ids_PT.numpy().tobytes())
    digest.update(str(task.input_ids_PT.shape).encode())
    return digest.hexdigest()[:32]


@dataclass
class PositionMeans:
    """fp32 means of every block's output per position: per token at that position, and overall."""

    cond_LTSD: torch.Tensor  # [layer, position, slot, d]: mean over problems with slot's token at t
    mean_LTD: torch.Tensor  # [layer, position, d]: token-agnostic mean
    slot_tokens_TS: torch.Tensor  # [position, slot]: token id of a slot, -1 where unused
    counts_TS: torch.Tensor  # [position, slot]: problems behind each mean
    key: str
    meta: dict[str, Any]

    def slots(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """Slot index of each token at its position; unknown tokens are an error."""
        hit = self.slot_tokens_TS[None] == input_ids_BT[..., None].cpu()  # [B, T, S]
        if not bool(hit.any(-1).all()):
            raise Af1Error("a prompt has a token at a position that the means' task never had there")
        return hit.float().argmax(-1)

    def conditional(self, layer: int, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """E[h[layer][t] | token at t] for every position of every prompt: [B, T, D]."""
        slots = self.slots(input_ids_BT)
        T = slots.shape[1]
        return self.cond_LTSD[layer][torch.arange(T)[None], slots]

    def save(self, path: str | Path) -> Path:
        tensors = {
            "cond_LTSD": self.cond_LTSD.contiguous(),
            "mean_LTD": self.mean_LTD.contiguous(),
            "slot_tokens_TS": self.slot_tokens_TS.contiguous(),
            "counts_TS": self.counts_TS.contiguous(),
        }
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata={"key": self.key, "meta": json.dumps(self.meta)})
        write_atomic(path, tmp.read_bytes())
        tmp.unlink()
        return path

    @classmethod
    def load(cls, path: str | Path, expected_key: str | None = None) -> PositionMeans:
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                metadata = f.metadata() or {}
            tensors = load_file(str(path))
        except Exception as exc:
            raise Af1Error(f"cannot read means file {path}: {exc}") from exc
        key = metadata.get("key", "")
        if expected_key is not None and key != expected_key:
            raise Af1Error(f"means file {path} was computed for another model or task layout")
        return cls(
            tensors["cond_LTSD"],
            tensors["mean_LTD"],
            tensors["slot_tokens_TS"],
            tensors["counts_TS"],
            key,
            json.loads(metadata.get("meta", "{}")),
        )


def slot_table(input_ids_PT: torch.Tensor) -> torch.Tensor:
    """[position, slot] token ids: the distinct tokens seen at each position, -1 padded."""
    per_position = [torch.unique(input_ids_PT[:, t]) for t in range(input_ids_PT.shape[1])]
    S = max(len(u) for u in per_position)
    table = torch.full((len(per_position), S), -1, dtype=torch.long)
    for t, u in enumerate(per_position):
        table[t, : len(u)] = u
    return table


@torch.no_grad()
def compute_means(adapter: ModelAdapter, task: Task, batch_size: int = 32) -> PositionMeans:
    """One pass over all problems of the task; sums in fp32 per (layer, position, token)."""
    L, D = adapter.n_layers, adapter.hidden_size
    ids = task.input_ids_PT
    P, T = ids.shape
    table = slot_table(ids)
    S = table.shape[1]
    slots_PT = (table[None] == ids[..., None]).float().argmax(-1)
    flat_PT = torch.arange(T)[None] * S + slots_PT
    sums = torch.zeros(L, T * S, D, dtype=torch.float32)
    counts = torch.zeros(T * S, dtype=torch.float32)
    c = suffix_start(adapter.model, ids, task.context_len)  # the suffix runs on the shared context
    sites = [residual(layer) for layer in range(L)]
    for sl in progress(list(batches(P, batch_size)), desc="position means"):
        with record(adapter, sites) as cache:
            forward_last(adapter.model, ids[sl], task.context_len)
        index = flat_PT[sl, c:].flatten()
        for layer in range(L):
            sums[layer].index_add_(0, index, cache[residual(layer)].reshape(-1, D).float().cpu())
        counts.index_add_(0, index, torch.ones(len(index)))
    counts[flat_PT[0, :c]] = P
    counts_TS = counts.view(T, S)
    cond = (sums / counts.clamp(min=1)[None, :, None]).view(L, T, S, D)
    mean = sums.view(L, T, S, D).sum(2) / P
    if c:  # the context's states, the same in every problem: their own means, from one full row
        with record(adapter, sites) as first:
            forward_last(adapter.model, ids[:1])
        for layer in range(L):
            h_CD = first[residual(layer)][0, :c].float().cpu()
            cond[layer, torch.arange(c), slots_PT[0, :c]] = h_CD
            mean[layer, :c] = h_CD
    meta = {"task": task.describe(), "n_problems": P, "n_layers": L}
    return PositionMeans(cond, mean, table, counts_TS, means_key(adapter, task), meta)


def cached_means(adapter: ModelAdapter, task: Task, cache_dir: Path | None = None) -> PositionMeans:
    """Means from the cache when the same model and task layout come back, else computed and saved."""
    from af1.models.loading import cache_root

    key = means_key(adapter, task)
    path = (cache_dir or cache_root() / "means") / f"{key}.safetensors"
    if path.is_file():
        return PositionMeans.load(path, expected_key=key)
    means = compute_means(adapter, task)
    means.save(path)
    return means
