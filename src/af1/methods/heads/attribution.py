"""Attribution patching (docs/methods.md §2): each component's effect to first order, its last-position change times the
gradient, estimating path patching's 'total'. Shapes: P, B, L, H, d, E = H x d, D."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from scipy import stats as scipy_stats
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import percentile_interval
from af1.interventions.sites import Site, edit_sites, head_inputs, mlp_output, record
from af1.methods.counterfactuals import Counterfactual
from af1.methods.heads.capture import EffectSums
from af1.models.adapter import ModelAdapter
from af1.models.forward import forward_last
from af1.tasks.evaluation import batches
from af1.tasks.task import Task

ESTIMATE = "attribution"  # the path name path patching's results carry when the effects are these estimates


@contextlib.contextmanager
def last_position_leaves(
    adapter: ModelAdapter, sites: Sequence[Site]
) -> Iterator[tuple[dict[Site, torch.Tensor], dict[Site, torch.Tensor]]]:
    """Gradients on, each site's last-position value given an added zero that requires grad: yields (value [B, ...]
    detached, zero); the zero's gradient runs through every later path, attention included."""
    values: dict[Site, torch.Tensor] = {}
    zeros: dict[Site, torch.Tensor] = {}

    def leaf(site: Site):
        def fn(x: torch.Tensor) -> torch.Tensor:
            zero = torch.zeros_like(x[:, -1]).requires_grad_()
            values[site], zeros[site] = x[:, -1].detach().clone(), zero
            return torch.cat([x[:, :-1], (x[:, -1] + zero)[:, None]], 1)

        return fn

    with torch.enable_grad(), edit_sites(adapter, {site: leaf(site) for site in sites}):
        yield values, zeros


def attribution_step(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    batch_size: int = 16,
    weight_P: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
    contrast_P: torch.Tensor | None = None,
) -> EffectSums:
    """Attribution patching of every head and MLP (of `layers`) on one answer step, as `downstream_path_patching`
    measures them exactly: the estimated relative change of the correct logit and of the logit difference."""
    L, H, d = adapter.n_layers, adapter.n_heads, adapter.head_dim
    P = len(task)
    sums = EffectSums.zeros(P, L, H, layers)
    patched = sorted(layers) if layers is not None else list(range(L))
    weight_P = torch.ones(P) if weight_P is None else weight_P
    sites = [s for layer in patched for s in (head_inputs(layer), mlp_output(layer))]
    for sl in batches(P, batch_size):
        with torch.no_grad(), record(adapter, sites, last_only=True) as corrupt:
            cf_BV = forward_last(adapter.model, cf.input_ids_PT[sl], task.context_len)
        with last_position_leaves(adapter, sites) as (clean, zeros):
            logits_BV = forward_last(adapter.model, task.input_ids_PT[sl], task.context_len)
            answer_B = task.answer_ids_P[sl]
            wrong_BV = logits_BV.detach().clone()
            wrong_BV[torch.arange(len(answer_B)), answer_B] = -math.inf
            correct_B = logits_BV.gather(1, answer_B[:, None])[:, 0]
            against_B = wrong_BV.argmax(-1) if contrast_P is None else contrast_P[sl].to(logits_BV.device)
            wrong_B = logits_BV.gather(1, against_B[:, None])[:, 0]
            leaves = [zeros[s] for s in sites]
            grad_correct = torch.autograd.grad(correct_B.sum(), leaves, retain_graph=True)
            grad_diff = torch.autograd.grad((correct_B - wrong_B).sum(), leaves)
        w_B = weight_P[sl]
        cf_gap_B = cf_BV.gather(1, answer_B[:, None].to(cf_BV.device)) - cf_BV.gather(1, against_B[:, None])
        sums.gap_P[sl] = (cf_gap_B[:, 0].float().cpu() - (correct_B - wrong_B).detach().float().cpu()) * w_B
        scale_B = w_B / correct_B.detach().abs().clamp(min=1e-6)
        for i, site in enumerate(sites):
            change = (corrupt[site] - clean[site]).float()
            g_c, g_d = grad_correct[i].float(), grad_diff[i].float()
            assert site.layer is not None
            if site.kind == "head_inputs":
                by_head_c = (g_c * change).view(-1, H, d).sum(-1)  # [B, H]
                by_head_d = (g_d * change).view(-1, H, d).sum(-1)
                sums.rel_PLH[sl, site.layer] = by_head_c * scale_B[:, None]
                sums.diff_PLH[sl, site.layer] = by_head_d * w_B[:, None]
            else:
                sums.rel_L[site.layer] += float(((g_c * change).sum(-1) * scale_B).sum())
                sums.diff_L[site.layer] += float(((g_d * change).sum(-1) * w_B).sum())
        sums.clean_diff += float(((correct_B - wrong_B).detach() * w_B).sum())
    return sums


class RankAgreement(TypedDict):
    """How well an estimated ranking of components agrees with the exact one on the same problems: Spearman's rho with
    its bootstrap interval over problems, and the top-k overlap."""

    n: int
    n_ranked: int
    spearman: float
    spearman_ci: list[float]
    k: int
    top_k_shared: float


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(scipy_stats.spearmanr(x, y)[0])  # pyright: ignore[reportArgumentType]  # (statistic, p-value)


def agreement(estimate_PZ: torch.Tensor, exact_PZ: torch.Tensor, k: int, seed: int = 0) -> RankAgreement:
    """Spearman's rho between two rankings of Z components (means over P problems; NaN columns left out), its percentile
    bootstrap interval over problems, and the top-k overlap (most negative first)."""
    keep = ~(estimate_PZ.isnan().any(0) | exact_PZ.isnan().any(0))
    a, b = estimate_PZ[:, keep].double().numpy(), exact_PZ[:, keep].double().numpy()
    rho = _spearman(a.mean(0), b.mean(0))
    interval = percentile_interval(  # problems resampled as a whole: their rows of both
        (np.arange(len(a)),),
        lambda rows: _spearman(a[rows.astype(int)].mean(0), b[rows.astype(int)].mean(0)),
        seed,
        vectorized=False,
    )
    k = min(k, int(keep.sum()))
    top_a, top_b = set(np.argsort(a.mean(0))[:k].tolist()), set(np.argsort(b.mean(0))[:k].tolist())
    return RankAgreement(
        n=len(a),
        n_ranked=int(keep.sum()),
        spearman=rho,
        spearman_ci=interval,
        k=k,
        top_k_shared=len(top_a & top_b) / k if k else 1.0,
    )
