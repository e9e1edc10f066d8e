"""The additive fit of attention logits, a[i-j] + b[i] + c[j], its Pearson r per window, and the token-level fit judged
on held-out windows."""

from __future__ import annotations

from typing import cast

import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.interventions.attention import LayerPlan, attention_plans
from af1.models.adapter import ModelAdapter
from af1.tasks.evaluation import batches


@torch.no_grad()
def capture_logits(adapter: ModelAdapter, ids_NT: torch.Tensor, batch_size: int = 4) -> torch.Tensor:
    """Pre-softmax logits [layer, head, window, query, key] from post-RoPE q and k (GQA: head h reads h // group)."""
    L, H, T = adapter.n_layers, adapter.n_heads, ids_NT.shape[1]
    out = torch.zeros(L, H, ids_NT.shape[0], T, T)
    group = H // adapter.n_kv_heads
    cap = getattr(adapter.config, "attn_logit_softcapping", None)
    for sl in batches(ids_NT.shape[0], batch_size):

        def capture(layer: int, sl: slice = sl):
            def fn(module, q, k, _v):
                k = k.repeat_interleave(group, dim=1) if k.shape[1] != q.shape[1] else k
                scale = getattr(module, "scaling", None) or q.shape[-1] ** -0.5
                logits = q.float() @ k.float().transpose(-1, -2) * scale
                if cap:  # where softmax sees them (Gemma-2 caps attention logits)
                    logits = torch.tanh(logits / cap) * cap
                out[layer, :, sl] = logits.transpose(0, 1).cpu()

            return fn

        ids = ids_NT[sl].to(adapter.device)
        with attention_plans(adapter, {layer: LayerPlan(capture=capture(layer)) for layer in range(L)}):
            adapter.model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return out


def _group_mean(values_FE: torch.Tensor, index_E: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the mean of the entries sharing an index [F, size] (0 where none does), and each index's count."""
    sums = torch.zeros(values_FE.shape[0], size).index_add_(1, index_E, values_FE)
    counts = torch.zeros(size).index_add_(0, index_E, torch.ones(len(index_E)))
    return sums / counts.clamp(min=1), counts


def additive_fit(
    W_NTT: torch.Tensor,
    terms: tuple[str, ...] = ("distance", "query", "key"),
    iters: int = 40,
    mask_TT: torch.Tensor | None = None,
):
    """Backfitting of W[i, j] ~ a[i-j] + b[i] + c[j] over the causal triangle (or the entries of `mask_TT`);
    returns the fit [N, T, T], zero outside the fitted entries."""
    N, T, _ = W_NTT.shape
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    mask = j <= i if mask_TT is None else mask_TT
    index = {"distance": i - j, "query": i, "key": j}
    parts = {t: torch.zeros(N, T) for t in terms}
    W = W_NTT.float()
    for _ in range(iters):
        for t in terms:
            others = sum((parts[o][:, index[o]] for o in terms if o != t), torch.zeros_like(W))
            parts[t], _ = _group_mean((W - others)[:, mask], index[t][mask], T)
    return sum(parts[t][:, index[t]] for t in terms) * mask


def token_fit_heldout(
    logits_FNTT: torch.Tensor,
    ids_NT: torch.Tensor,
    train_N: torch.Tensor,
    with_token: bool = True,
    iters: int = 30,
    permuted: int | None = None,
) -> torch.Tensor:
    """The falsifiable decomposition W[n, i, j] ~ a[i-j] + s[j = 0] + b[n, i] + c[key token] fitted on `train_N`: per
    (layer, head) and held-out window the row-centred r [F, held-out]; `permuted`: meanings permuted (the null)."""
    F, N, T, _ = logits_FNTT.shape
    mask_TT = torch.ones(T, T, dtype=torch.bool).tril()
    mask_TT[0] = False  # the first query's single logit says nothing once its row is centred
    M = int(mask_TT.sum())
    i, j = mask_TT.nonzero().T  # each masked entry's query and key, row by row
    _, token_NT = ids_NT.unique(return_inverse=True)
    V = int(token_NT.max()) + 1

    y = logits_FNTT[:, train_N][:, :, mask_TT].reshape(F, -1).float()
    dist, token = (i - j).repeat(len(train_N)), token_NT[train_N][:, j].flatten()
    row = (torch.arange(len(train_N))[:, None] * T + i[None]).flatten()
    first = (j == 0).long().repeat(len(train_N))  # 1 at the first key, 0 elsewhere
    a, b, c = torch.zeros(F, T), torch.zeros(F, len(train_N) * T), torch.zeros(F, V)
    s0 = torch.zeros(F, 2)  # the first key's own positional term (column 0 held at 0)
    seen = torch.zeros(V)
    for _ in range(iters):
        a, _ = _group_mean(y - b[:, row] - c[:, token] - s0[:, first], dist, T)
        s0, _ = _group_mean(y - a[:, dist] - b[:, row] - c[:, token], first, 2)
        s0[:, 0] = 0
        b, _ = _group_mean(y - a[:, dist] - c[:, token] - s0[:, first], row, len(train_N) * T)
        if with_token:
            c, seen = _group_mean(y - a[:, dist] - b[:, row] - s0[:, first], token, V)
    unseen = seen == 0
    c[:, unseen] = ((c * seen).sum(1, keepdim=True) / seen.sum().clamp(min=1)).expand(F, int(unseen.sum()))
    if permuted is not None:  # each token reads another token's meaning
        c = c[:, torch.randperm(V, generator=torch.Generator().manual_seed(permuted))]
    test_N = torch.tensor([n for n in range(N) if n not in set(train_N.tolist())], dtype=torch.long)
    y_held = logits_FNTT[:, test_N][:, :, mask_TT].float().transpose(1, 2)  # [F, masked entry, held-out window]
    sink = s0[:, 1:] * (j == 0).float()[None]  # [F, masked entry]
    fit_held = ((a[:, i - j] + sink)[:, :, None] + c[:, token_NT[test_N][:, j].T]).expand_as(y_held)
    query_row = i - 1  # rows 1..T-1 of each window

    def row_centred(values: torch.Tensor) -> torch.Tensor:
        sums = torch.zeros(F, T - 1, len(test_N)).index_add_(1, query_row, values)
        counts = torch.zeros(T - 1).index_add_(0, query_row, torch.ones(M))
        return values - (sums / counts[None, :, None])[:, query_row]

    return pearson(row_centred(y_held).transpose(1, 2), row_centred(fit_held).transpose(1, 2))


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson r along the last dimension."""
    x = x - x.mean(-1, keepdim=True)
    y = y - y.mean(-1, keepdim=True)
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1)).clamp(min=1e-12)


class FitQuality(TypedDict):
    """Pearson r of the additive fits, per matrix (or per layer, head and window; or per layer and head)."""

    r: torch.Tensor  # distance + query + key over the causal triangle
    r_row_centred: torch.Tensor  # the same, each query row centred: what softmax sees
    r_no_sink: torch.Tensor  # refitted without the sink column (key 0)
    r_two_term: torch.Tensor  # distance + key only


def fit_quality(W_NTT: torch.Tensor) -> FitQuality:
    """Per matrix: r of the three-term fit (all, row-centred), of a fit refitted without the sink column (key 0),
    and of distance + key."""
    T = W_NTT.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    later = torch.arange(T) > 0
    no_sink = mask & later  # the sink column (key 0) left out
    past_first = mask & later[:, None]  # row-centred, the first query's single logit is 0: left out
    fit = additive_fit(W_NTT)
    fit_no_sink = additive_fit(W_NTT, mask_TT=no_sink)
    two = additive_fit(W_NTT, ("distance", "key"))

    def row_centred(M: torch.Tensor) -> torch.Tensor:
        counts = mask.sum(1).clamp(min=1)
        means = (M * mask).sum(-1) / counts
        return (M - means[..., None]) * mask

    return FitQuality(
        r=pearson(W_NTT[:, mask], fit[:, mask]),
        r_row_centred=pearson(row_centred(W_NTT)[:, past_first], row_centred(fit)[:, past_first]),
        r_no_sink=pearson(W_NTT[:, no_sink], fit_no_sink[:, no_sink]),
        r_two_term=pearson(W_NTT[:, mask], two[:, mask]),
    )


def window_fit(logits_LHNTT: torch.Tensor) -> dict[str, torch.Tensor]:
    """fit_quality per (layer, head, window), each fit by its name (r, r_row_centred, ...): [layer, head, window]."""
    L, H, N, T, _ = logits_LHNTT.shape
    q = cast("dict[str, torch.Tensor]", fit_quality(logits_LHNTT.reshape(L * H * N, T, T)))  # a FitQuality's tensors
    return {name: r.view(L, H, N) for name, r in q.items()}


def median(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The median as the spread reports it (`summary`): the mean of the two middle values of an even count (torch's
    `median` takes the lower one), so an estimate and its bootstrap interval are of one statistic."""
    return torch.quantile(x.float(), 0.5, dim=dim)


def median_ci(r_LHN: torch.Tensor, draws: int = 1000, seed: int = 0) -> list[float | None]:
    """95 % bootstrap interval of the median over heads of the per-head mean r, resampling windows; NaN for one
    window (nothing to resample)."""
    N = r_LHN.shape[-1]
    if N < 2:
        return [float("nan"), float("nan")]
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, N, (draws, N), generator=g)
    medians = torch.stack([median(r_LHN[..., pick].mean(-1)) for pick in picks])
    low, high = torch.quantile(medians.float(), torch.tensor([0.025, 0.975]))
    return [float(low), float(high)]


class Spread(TypedDict):
    """How r spreads over heads: mean, median and quartiles (None: read back from a NaN, written as null)."""

    mean: float | None
    median: float | None
    q1: float | None
    q3: float | None


def summary(r_LH: torch.Tensor) -> Spread:
    """The spread of r over every layer and head."""
    flat = r_LH.flatten().float()
    q = torch.quantile(flat, torch.tensor([0.25, 0.5, 0.75]))
    return Spread(mean=float(flat.mean()), median=float(q[1]), q1=float(q[0]), q3=float(q[2]))
