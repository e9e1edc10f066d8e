"""RoPE's parts: the dummy-distance test and the band energies of queries and keys before rotation."""

from __future__ import annotations

import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.interventions.attention import LayerPlan, attention_plans
from af1.models.adapter import ModelAdapter
from af1.results import Part


def rope_tables(adapter: ModelAdapter, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] of the model's rotary embedding; refuses families without a plain one."""
    base = getattr(adapter.model, adapter.model.base_model_prefix)
    rotary = getattr(base, "rotary_emb", None)
    if not adapter.plain_rotary or rotary is None:
        raise Af1Error(f"the {adapter.family.name} family has no plain rotary embedding for the RoPE analyses")
    x = torch.zeros(1, T, adapter.hidden_size, device=adapter.device)
    cos, sin = rotary(x, torch.arange(T, device=adapter.device)[None])
    return cos[0].float().cpu(), sin[0].float().cpu()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The vector's halves swapped, the new first half negated: what RoPE's sine multiplies."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def unrotate(post: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pre-RoPE vectors from post-RoPE ones at the positions of cos/sin ([..., T, d])."""
    return (post * cos - _rotate_half(post) * sin) / (cos**2 + sin**2)


@torch.no_grad()
def capture_qk(adapter: ModelAdapter, ids_1T: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Post-RoPE q [H, T, d] and k [H, T, d] (GQA-expanded) of one window, per layer."""
    store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    group = adapter.n_heads // adapter.n_kv_heads

    def capture(layer: int):
        def fn(_module, q, k, _v):
            store[layer] = q[0].float().cpu(), k[0].repeat_interleave(group, 0).float().cpu()

        return fn

    with attention_plans(adapter, {layer: LayerPlan(capture=capture(layer)) for layer in range(adapter.n_layers)}):
        adapter.model(input_ids=ids_1T.to(adapter.device), use_cache=False, logits_to_keep=1)
    return store


def dummy_distance_r2(q_pre_HTd, k_pre_HTd, cos, sin, queries: list[int], distances: list[int]) -> torch.Tensor:
    """Per head and query: R^2 of a two-way additive fit (distance, key) of logits with a substituted distance."""
    r2 = []
    for i in queries:
        q = q_pre_HTd[:, i][:, None]  # [H, 1, d]
        qd = q * cos[distances] + _rotate_half(q) * sin[distances]  # [H, D, d]: the query placed at distance d
        k = k_pre_HTd[:, : i + 1] * cos[0] + _rotate_half(k_pre_HTd[:, : i + 1]) * sin[0]  # keys at position 0
        M = qd @ k.transpose(-1, -2)  # [H, D, keys]
        fit = M.mean(-1, keepdim=True) + M.mean(-2, keepdim=True) - M.mean((-1, -2), keepdim=True)
        ss_tot = ((M - M.mean((-1, -2), keepdim=True)) ** 2).sum((-1, -2))
        r2.append(1 - ((M - fit) ** 2).sum((-1, -2)) / ss_tot.clamp(min=1e-12))
    return torch.stack(r2, -1)  # [H, queries]


class Bands(TypedDict):
    """Per head and RoPE frequency band [head, band], band 0 = highest frequency."""

    logit_variance_share: torch.Tensor  # the band's share of the logit variance over the causal triangle
    key_energy_mean: torch.Tensor  # key energy in the token-independent mean
    key_energy_token: torch.Tensor  # key energy in the rest (token-dependent)


def band_analysis(
    q_post_HTd: torch.Tensor, k_post_HTd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_bands: int = 8
) -> Bands:
    """Per head and RoPE frequency band: key energy in the token-independent mean vs the rest, and each band's
    share of the logit variance over the causal triangle."""
    _, T, d = k_post_HTd.shape
    half = d // 2
    k_pre = unrotate(k_post_HTd, cos[:T], sin[:T])
    mean = k_pre.mean(1, keepdim=True)
    pair_energy_mean = (mean**2)[..., :half] + (mean**2)[..., half:]  # [H, 1, half]
    resid = k_pre - mean
    pair_energy_rest = ((resid**2)[..., :half] + (resid**2)[..., half:]).mean(1, keepdim=True)
    bands = torch.arange(half) * n_bands // half
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    total = (q_post_HTd @ k_post_HTd.transpose(-1, -2))[:, mask]
    shares, e_mean, e_rest = [], [], []
    for b in range(n_bands):
        dims = torch.cat([(bands == b).nonzero().flatten(), (bands == b).nonzero().flatten() + half])
        part = (q_post_HTd[..., dims] @ k_post_HTd[..., dims].transpose(-1, -2))[:, mask]
        shares.append(part.var(-1) / total.var(-1).clamp(min=1e-12))
        e_mean.append(pair_energy_mean[..., bands == b].sum((-1, -2)))
        e_rest.append(pair_energy_rest[..., bands == b].sum((-1, -2)))
    return Bands(
        logit_variance_share=torch.stack(shares, -1),
        key_energy_mean=torch.stack(e_mean, -1),
        key_energy_token=torch.stack(e_rest, -1),
    )


class RopeParts(Part):
    """The dummy-distance test and the RoPE band energies over every layer and head; all None, with the reason,
    where the family has no plain rotary embedding."""

    rope_analyses_skipped: str | None = None  # why they did not run (no plain rotary tables)
    dummy_distance_r2_layer_head: list[list[float | None]] | None = None  # [layer, head], median over queries
    dummy_distance_r2_median: float | None = None
    dummy_distance_interaction_share_median: float | None = None
    band_logit_variance_share: list[float | None] | None = None  # [band], band 0 = highest frequency
    band_key_energy_mean: list[float | None] | None = None
    band_key_energy_token: list[float | None] | None = None


def rope_parts(adapter: ModelAdapter, ids_NT: torch.Tensor, n_queries: int) -> RopeParts:
    """The dummy-distance R^2 and the band analysis on the first window, every layer (None where no plain RoPE)."""
    T = ids_NT.shape[1]
    try:
        cos, sin = rope_tables(adapter, 2 * T)
    except Af1Error as exc:
        return RopeParts(rope_analyses_skipped=str(exc))
    qk = capture_qk(adapter, ids_NT[:1])
    layers = [qk[layer] for layer in range(adapter.n_layers)]
    queries = sorted({int(x) for x in torch.linspace(T // 4, T - 1, n_queries)})
    pre = [(unrotate(q, cos[:T], sin[:T]), unrotate(k, cos[:T], sin[:T])) for q, k in layers]
    r2 = torch.stack(
        [dummy_distance_r2(q, k, cos, sin, queries, list(range(T))) for q, k in pre]
    )  # [layer, head, query]
    bands = [band_analysis(q, k, cos, sin) for q, k in layers]
    return RopeParts(
        dummy_distance_r2_layer_head=r2.median(-1).values.tolist(),
        dummy_distance_r2_median=float(r2.median()),
        dummy_distance_interaction_share_median=float(1 - r2.median()),
        band_logit_variance_share=torch.stack([b["logit_variance_share"] for b in bands]).mean((0, 1)).tolist(),
        band_key_energy_mean=torch.stack([b["key_energy_mean"] for b in bands]).mean((0, 1)).tolist(),
        band_key_energy_token=torch.stack([b["key_energy_token"] for b in bands]).mean((0, 1)).tolist(),
    )
