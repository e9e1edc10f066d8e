"""Position means of the residual stream for CAMA and the token-agnostic mean ablation, leave-one-out.
fp32 sums per (layer, position, token) from one streaming pass, saved as safetensors and reused (docs/methods.md §1)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from af1.errors import Af1Error
from af1.interventions.sites import record, residual
from af1.models.adapter import ModelAdapter
from af1.models.cache import cache_root
from af1.models.forward import forward_last, suffix_start
from af1.progress import progress
from af1.results import write_atomic
from af1.tasks.evaluation import batches
from af1.tasks.task import Task

FORMAT = "sums-v2"  # fp32 sums, counts and member hashes: older files (means only) cannot leave a problem out


def model_fingerprint(adapter: ModelAdapter) -> str:
    """The identity of a model's numbers: its config and every byte of every parameter (in its own dtype), so
    that a model changed anywhere (fine-tuned, edited) never reads another's cached means."""
    digest = hashlib.sha256(adapter.config.to_json_string(use_diff=False).encode())
    for name, p in adapter.named_weights():
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
        digest.update(p.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()[:32]


def means_key(adapter: ModelAdapter, task: Task, fingerprint: str | None = None) -> str:
    """The cache key of a task's means: the model's numbers (`fingerprint`, computed when not given) and the exact
    prompts averaged over."""
    return _key(fingerprint or model_fingerprint(adapter), task.input_ids_PT)


def row_hashes(input_ids_BT: torch.Tensor) -> torch.Tensor:
    """A 63-bit hash of each prompt's ids ([B] int64): which problems a set of means averaged over."""
    rows = input_ids_BT.cpu().to(torch.int64).numpy()
    return torch.tensor(
        [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little") >> 1 for r in rows],
        dtype=torch.int64,
    )


@dataclass
class PositionMeans:
    """fp32 sums of every block's output per position and token at that position, their counts, and the prompts
    they are over: conditional and token-agnostic means, with or without the evaluated problem itself."""

    sums_LTSD: torch.Tensor  # [layer, position, slot, d]: sum over problems with slot's token at t
    slot_tokens_TS: torch.Tensor  # [position, slot]: token id of a slot, -1 where unused
    counts_TS: torch.Tensor  # [position, slot]: problems behind each sum
    member_hashes: torch.Tensor  # [N] `row_hashes` of the prompts averaged over
    key: str
    meta: dict[str, Any]

    @property
    def n_problems(self) -> int:
        """Problems averaged over (every one counted at the last position)."""
        return int(self.counts_TS[-1].sum())

    @property
    def cond_LTSD(self) -> torch.Tensor:
        """E[h | token at t] over every member: [layer, position, slot, d]."""
        return self.sums_LTSD / self.counts_TS.clamp(min=1)[None, :, :, None]

    def cond_TSD(self, layer: int) -> torch.Tensor:
        """E[h[layer] | token at t] over every member, one layer of `cond_LTSD`: [position, slot, d]."""
        return self.sums_LTSD[layer] / self.counts_TS.clamp(min=1)[..., None]

    @property
    def mean_LTD(self) -> torch.Tensor:
        """The token-agnostic mean over every member: [layer, position, d]."""
        return self.sums_LTSD.sum(2) / self.n_problems

    def slots(self, input_ids_BT: torch.Tensor, strict: bool = True) -> torch.Tensor:
        """Slot index of each token at its position; a token the means never saw there is an error, or with
        `strict` off the index S, whose sum and count are zero (`counts`, `replacement`)."""
        hit = self.slot_tokens_TS[None] == input_ids_BT[..., None].cpu()  # [B, T, S]
        seen = hit.any(-1)
        if strict and not bool(seen.all()):
            raise Af1Error("a prompt has a token at a position that the means' task never had there")
        return torch.where(seen, hit.float().argmax(-1), self.slot_tokens_TS.shape[1])

    def counts(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """[B, T] members with each prompt's token at each position (0 where the means never saw it)."""
        padded_TS = torch.cat([self.counts_TS, torch.zeros(len(self.counts_TS), 1)], 1)
        return padded_TS[torch.arange(input_ids_BT.shape[1])[None], self.slots(input_ids_BT, strict=False)]

    def unseen(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """[B] bool: prompts with a token at some position that no member had there."""
        return (self.counts(input_ids_BT) == 0).any(1)

    def inside(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """[B] bool: is each prompt one of the problems these means average over."""
        return torch.isin(row_hashes(input_ids_BT), self.member_hashes)

    def conditional(self, layer: int, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """E[h[layer][t] | token at t] over every member, for every position of every prompt: [B, T, D]."""
        slots = self.slots(input_ids_BT)
        T = slots.shape[1]
        return self.cond_TSD(layer)[torch.arange(T)[None], slots]

    def replacement(
        self, layer: int, input_ids_BT: torch.Tensor, own_BUD: torch.Tensor | None, conditional: bool = True
    ) -> torch.Tensor:
        """What CAMA (`conditional`) or the agnostic mean writes into h[layer] at the last s positions, [B, s, D] fp32
        (s: own's length, else all), `own` left out; `fallbacks` counts where the agnostic mean stands in."""
        B, T = input_ids_BT.shape
        s = T if own_BUD is None else own_BUD.shape[1]
        sums_USD = self.sums_LTSD[layer][T - s :]
        total_UD = sums_USD.sum(1)
        left_B1 = torch.zeros(B, 1, 1) if own_BUD is None else self.inside(input_ids_BT).float()[:, None, None]
        own_BUD = torch.zeros(1, 1, 1) if own_BUD is None else own_BUD.float().cpu()
        agnostic = (total_UD[None] - left_B1 * own_BUD) / (self.n_problems - left_B1).clamp(min=1)
        if not conditional:
            return agnostic.expand(B, s, -1)
        slots_BU = self.slots(input_ids_BT, strict=False)[:, T - s :]  # a token never seen: slot S, zero sum
        n_cond = self.counts(input_ids_BT)[:, T - s :, None] - left_B1  # [B, s, 1]
        sums_USD = torch.cat([sums_USD, torch.zeros(s, 1, sums_USD.shape[-1])], 1)
        cond = (sums_USD[torch.arange(s)[None], slots_BU] - left_B1 * own_BUD) / n_cond.clamp(min=1)
        return torch.where(n_cond > 0, cond, agnostic)  # nobody else has the token: the token-agnostic mean

    def fallbacks(self, input_ids_BT: torch.Tensor, start: int) -> torch.Tensor:
        """[B, T] bool: positions from `start` where no other member has the prompt's token (it is the only one, or
        the means never saw the token there): CAMA uses the (leave-one-out) token-agnostic mean there."""
        others = self.counts(input_ids_BT) - self.inside(input_ids_BT)[:, None].float()
        none = others < 1
        none[:, :start] = False
        return none

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a file holds of these means (beside their key and meta)."""
        return {name: getattr(self, name).contiguous() for name in TENSORS}

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor], key: str, meta: dict[str, Any]) -> PositionMeans:
        return cls(
            tensors["sums_LTSD"], tensors["slot_tokens_TS"], tensors["counts_TS"], tensors["member_hashes"], key, meta
        )

    def save(self, path: str | Path) -> Path:
        """One safetensors file, whole or not at all, whoever else writes there."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            path, save(self.tensors(), metadata={"key": self.key, "format": FORMAT, "meta": json.dumps(self.meta)})
        )
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
        if metadata.get("format") != FORMAT:
            raise Af1Error(
                f"means file {path} holds means only (an older af1): it cannot leave a problem out; compute it again"
            )
        key = metadata.get("key", "")
        if expected_key is not None and key != expected_key:
            raise Af1Error(f"means file {path} was computed for another model or task layout")
        return cls.of(tensors, key, json.loads(metadata.get("meta", "{}")))


TENSORS = ("sums_LTSD", "slot_tokens_TS", "counts_TS", "member_hashes")


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
    """One pass over all problems of the task (its prompts as they are); sums in fp32 per (layer, position, token)."""
    return _pass(adapter, [task.input_ids_PT], [torch.arange(len(task))], task.context_len, batch_size)[0]


@torch.no_grad()
def compute_step_means(adapter: ModelAdapter, steps: list[Task], batch_size: int = 32) -> list[PositionMeans]:
    """The means of several answer steps of one token layout (`Task.steps()`, rows `index_P` of one task) in one pass:
    each problem runs once, since a causal position never reads later ones."""
    if not steps:
        return []
    rows = [s.rows_in_parent for s in steps]
    return _pass(adapter, [s.input_ids_PT for s in steps], rows, steps[0].context_len, batch_size)


def _pass(
    adapter: ModelAdapter,
    ids_per_step: list[torch.Tensor],
    rows_per_step: list[torch.Tensor],
    context_len: int,
    batch_size: int,
) -> list[PositionMeans]:
    """Sums per (layer, position, token) of each step k's prompts ([P_k, T_k]; step k+1's add one token; `rows_per_step`
    names each row's problem), every problem run once at its deepest step."""
    L, D = adapter.n_layers, adapter.hidden_size
    tables = [slot_table(ids) for ids in ids_per_step]
    flat = []  # per step: [P_k, T_k] index into its sums' (position, slot) rows
    for ids, table in zip(ids_per_step, tables, strict=True):
        slots = (table[None] == ids[..., None]).float().argmax(-1)
        flat.append(torch.arange(ids.shape[1])[None] * table.shape[1] + slots)
    sums = [torch.zeros(L, t.numel(), D, dtype=torch.float32) for t in tables]
    counts = [torch.zeros(t.numel(), dtype=torch.float32) for t in tables]
    where = [{int(r): i for i, r in enumerate(rows.tolist())} for rows in rows_per_step]  # problem -> row of step k
    deepest = {r: k for k, w in enumerate(where) for r in w}  # the last step that scores each problem
    sites = [residual(layer) for layer in range(L)]
    context_LCD: torch.Tensor | None = None  # the context's states, the same in every problem: from one full row
    for d in sorted(set(deepest.values())):
        problems = [r for r, k in deepest.items() if k == d]
        ids = ids_per_step[d][[where[d][r] for r in problems]]
        c = suffix_start(adapter.model, ids, context_len)  # the suffix runs on the shared context
        if c:  # the context's positions of these problems, at every step they are scored on
            if context_LCD is None:
                with record(adapter, sites) as first:
                    forward_last(adapter.model, ids_per_step[-1][:1])
                context_LCD = torch.stack([first[site][0, :context_len].float().cpu() for site in sites])
            for k in range(d + 1):
                index = flat[k][0, :c]
                sums[k].index_add_(1, index, context_LCD[:, :c] * len(problems))
                counts[k].index_add_(0, index, torch.full((c,), float(len(problems))))
        for sl in progress(list(batches(len(problems), batch_size)), desc=f"position means (step {d})"):
            with record(adapter, sites) as cache:
                forward_last(adapter.model, ids[sl], context_len)
            for k in range(d + 1):
                step_rows = [where[k][r] for r in problems[sl]]
                index = flat[k][step_rows, c:].flatten()
                T_k = ids_per_step[k].shape[1]
                for layer in range(L):
                    h = cache[residual(layer)][:, : T_k - c]
                    sums[k][layer].index_add_(0, index, h.reshape(-1, D).float().cpu())
                counts[k].index_add_(0, index, torch.ones(len(index)))
    fingerprint = model_fingerprint(adapter)
    out = []
    for ids, table, sums_k, counts_k in zip(ids_per_step, tables, sums, counts, strict=True):
        P, T = ids.shape
        S = table.shape[1]
        sums_LTSD = sums_k.view(L, T, S, D)
        meta = {"n_problems": P, "n_layers": L, "n_positions": T}
        out.append(PositionMeans(sums_LTSD, table, counts_k.view(T, S), row_hashes(ids), _key(fingerprint, ids), meta))
    return out


def _key(fingerprint: str, ids_PT: torch.Tensor) -> str:
    digest = hashlib.sha256(f"{FORMAT}:{fingerprint}".encode())
    digest.update(ids_PT.numpy().tobytes())
    digest.update(str(ids_PT.shape).encode())
    return digest.hexdigest()[:32]


def cached_step_means(adapter: ModelAdapter, steps: list[Task], cache_dir: Path | None = None) -> list[PositionMeans]:
    """Each step's means from the cache when the same model and step come back, the others computed together in
    one pass (`compute_step_means`) and saved."""

    folder = cache_dir or cache_root() / "means"
    fingerprint = model_fingerprint(adapter)
    keys = [means_key(adapter, step, fingerprint) for step in steps]
    paths = [folder / f"{key}.safetensors" for key in keys]
    missing = [i for i, path in enumerate(paths) if not path.is_file()]
    computed = dict(zip(missing, compute_step_means(adapter, [steps[i] for i in missing]), strict=True))
    out = []
    for i, (key, path) in enumerate(zip(keys, paths, strict=True)):
        if i in computed:
            computed[i].save(path)
            out.append(computed[i])
        else:
            out.append(PositionMeans.load(path, expected_key=key))
    return out


def cached_means(adapter: ModelAdapter, task: Task, cache_dir: Path | None = None) -> PositionMeans:
    """Means from the cache when the same model and task layout come back, else computed and saved."""
    return cached_step_means(adapter, [task], cache_dir)[0]
