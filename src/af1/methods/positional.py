"""Attention logits as position + meaning (docs/methods.md §3, Han & Ji 2025).

Per layer and head, the pre-softmax logits W[i, j] (j <= i) of natural text are fitted by
a[i-j] + b[i] + c[j] (distance, query, key) with backfitting; the fit's Pearson r says how
additive attention is. Controls: the same architecture with random weights, and shuffled
tokens. The dummy-distance test, the RoPE band energies and the word-order perturbation
complete the study.

Each window starts the way the model's documents start (its BOS, else `<|endoftext|>`, else its
EOS; see `tasks.document_start`), so the first key is the sink a trained model expects. Logits
are taken where softmax sees them (after the family's attention soft-capping, Gemma-2). Three
controls: the architecture with random weights, random weights rescaled to the trained model's
norm of every weight tensor (is additivity learned, or a property of the architecture at the
trained scale?), and shuffled tokens; each reports the plain and the row-centred r, the measure
softmax sees (a constant per query row does not change attention). Medians come with a
bootstrap interval over windows: the default is many short windows (16 of 64 tokens, about all the
shipped chapter holds) rather than a few long ones, and fewer than MIN_CI_WINDOWS windows are warned
about (an interval over 4 windows has 35 distinct resamples and says almost nothing).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy import stats as scipy_stats
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import Claim, adjust, interval_above, paired_greater
from af1.errors import Af1Error
from af1.interventions.attention import LayerPlan, attention_plans
from af1.models.adapter import ModelAdapter
from af1.tasks.evaluation import batches
from af1.tasks.task import document_start

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CORPUS_NAME = "austen_pride_and_prejudice_ch1.txt"
CORPUS_SOURCE = "Jane Austen, Pride and Prejudice (1813), chapter 1; public domain"
SWAP_FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
MIN_CI_WINDOWS = 10  # fewer windows than this: the bootstrap interval over windows is flagged


def load_corpus(path: str | Path | None = None) -> str:
    """The shipped public-domain sample, or a user's text file."""
    if path is None:
        text = resources.files("af1").joinpath("data").joinpath(CORPUS_NAME).read_text()
    else:
        path = Path(path)
        if not path.is_file():
            raise Af1Error(f"corpus file not found: {path}")
        text = path.read_text()
    if not text.strip():
        raise Af1Error(f"corpus file is empty: {path or CORPUS_NAME}")
    return text


def corpus_windows(
    adapter: ModelAdapter,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    length: int,
    n_windows: int,
    start_token: int | None = None,
) -> torch.Tensor:
    """[window, position] token ids: consecutive windows of the tokenized text, each led by `start_token` (the
    model's document start) when given."""
    limit = getattr(adapter.config, "max_position_embeddings", None) or getattr(adapter.config, "n_positions", None)
    if limit and length > limit:
        raise Af1Error(f"window {length} is longer than the model's context of {limit} tokens")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    body = length - (start_token is not None)
    available = len(ids) // body if body > 0 else 0
    if available == 0:
        raise Af1Error(f"the corpus has {len(ids)} tokens, fewer than one window of {length}")
    n = min(n_windows, available)
    windows = torch.tensor(ids[: n * body]).view(n, body)
    if start_token is not None:
        windows = torch.cat([torch.full((n, 1), start_token), windows], 1)
    return windows


# --- logit capture -------------------------------------------------------------------------


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


# --- the additive fit ----------------------------------------------------------------------


def _group_mean(values_FTT: torch.Tensor, index_TT: torch.Tensor, mask_TT: torch.Tensor, size: int) -> torch.Tensor:
    """Mean of values over the masked entries sharing an index: [N, size]."""
    idx = index_TT[mask_TT]
    sums = torch.zeros(values_FTT.shape[0], size).index_add_(1, idx, values_FTT[:, mask_TT])
    counts = torch.zeros(size).index_add_(0, idx, torch.ones(len(idx))).clamp(min=1)
    return sums / counts


def additive_fit(
    W_NTT: torch.Tensor,
    terms: tuple[str, ...] = ("distance", "query", "key"),
    iters: int = 40,
    mask_TT: torch.Tensor | None = None,
):
    """Backfitting of W[i, j] ~ a[i-j] + b[i] + c[j] over the causal triangle (or the entries of `mask_TT`);
    returns the fit [N, T, T], zero outside the fitted entries."""
    N, T, _ = W_NTT.shape
    i = torch.arange(T)[:, None].expand(T, T)
    j = torch.arange(T)[None].expand(T, T)
    mask = j <= i if mask_TT is None else mask_TT
    index = {"distance": i - j, "query": i, "key": j}
    parts = {t: torch.zeros(N, T) for t in terms}
    W = W_NTT.float()
    for _ in range(iters):
        for t in terms:
            others = sum((parts[o][:, index[o]] for o in terms if o != t), torch.zeros_like(W))
            parts[t] = _group_mean(W - others, index[t], mask, T)
    return sum(parts[t][:, index[t]] for t in terms) * mask


def token_fit_heldout(
    logits_FNTT: torch.Tensor, ids_NT: torch.Tensor, train_N: torch.Tensor, with_token: bool = True, iters: int = 30
) -> torch.Tensor:
    """The falsifiable decomposition: W[n, i, j] ~ a[i-j] + b[n, i] + c[token of key j], the meaning term a function
    of the key's token shared across windows and positions (position alone without `with_token`), fitted by
    backfitting on the `train_N` windows only. Per matrix family F (a layer and head) and held-out window, the
    row-centred Pearson r there, a and c carried over (an unseen token takes the mean meaning; the query term drops
    out, as a constant per row changes no softmax): [F, held-out window]."""
    F, N, T, _ = logits_FNTT.shape
    mask_TT = torch.ones(T, T, dtype=torch.bool).tril()
    mask_TT[0] = False  # the first query's single logit says nothing once its row is centred
    M = int(mask_TT.sum())
    i = torch.arange(T)[:, None].expand(T, T)[mask_TT]
    j = torch.arange(T)[None].expand(T, T)[mask_TT]
    _, token_NT = ids_NT.unique(return_inverse=True)
    V = int(token_NT.max()) + 1

    def group_mean(values_FE: torch.Tensor, index_E: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        sums = torch.zeros(F, size).index_add_(1, index_E, values_FE)
        counts = torch.zeros(size).index_add_(0, index_E, torch.ones(len(index_E)))
        return sums / counts.clamp(min=1), counts

    y = logits_FNTT[:, train_N][:, :, mask_TT].reshape(F, -1).float()
    dist, token = (i - j).repeat(len(train_N)), token_NT[train_N][:, j].flatten()
    row = (torch.arange(len(train_N))[:, None] * T + i[None]).flatten()
    a, b, c = torch.zeros(F, T), torch.zeros(F, len(train_N) * T), torch.zeros(F, V)
    seen = torch.zeros(V)
    for _ in range(iters):
        a, _ = group_mean(y - b[:, row] - c[:, token], dist, T)
        b, _ = group_mean(y - a[:, dist] - c[:, token], row, len(train_N) * T)
        if with_token:
            c, seen = group_mean(y - a[:, dist] - b[:, row], token, V)
    unseen = seen == 0
    c[:, unseen] = ((c * seen).sum(1, keepdim=True) / seen.sum().clamp(min=1)).expand(F, int(unseen.sum()))
    test_N = torch.tensor([n for n in range(N) if n not in set(train_N.tolist())], dtype=torch.long)
    y_held = logits_FNTT[:, test_N][:, :, mask_TT].float().transpose(1, 2)  # [F, masked entry, held-out window]
    fit_held = (a[:, i - j][:, :, None] + c[:, token_NT[test_N][:, j].T]).expand_as(y_held)
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
    no_sink = mask.clone()
    no_sink[:, 0] = False
    past_first = mask.clone()
    past_first[0] = False  # row-centred, the first query's single logit is 0: left out
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


def window_fit(logits_LHNTT: torch.Tensor) -> FitQuality:
    """fit_quality per (layer, head, window): tensors [layer, head, window]."""
    L, H, N, T, _ = logits_LHNTT.shape
    q = fit_quality(logits_LHNTT.reshape(L * H * N, T, T))
    return FitQuality(
        r=q["r"].view(L, H, N),
        r_row_centred=q["r_row_centred"].view(L, H, N),
        r_no_sink=q["r_no_sink"].view(L, H, N),
        r_two_term=q["r_two_term"].view(L, H, N),
    )


def by_name(q: FitQuality) -> dict[str, torch.Tensor]:
    """The four fits by name, for what runs over all of them."""
    return {
        "r": q["r"],
        "r_row_centred": q["r_row_centred"],
        "r_no_sink": q["r_no_sink"],
        "r_two_term": q["r_two_term"],
    }


def median_ci(r_LHN: torch.Tensor, draws: int = 1000, seed: int = 0) -> list[float | None]:
    """95 % bootstrap interval of the median over heads of the per-head mean r, resampling windows; NaN for one
    window (nothing to resample)."""
    N = r_LHN.shape[-1]
    if N < 2:
        return [float("nan"), float("nan")]
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, N, (draws, N), generator=g)
    medians = torch.stack([r_LHN[..., pick].mean(-1).flatten().median() for pick in picks])
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


# --- dummy distance and RoPE bands ---------------------------------------------------------


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


# --- perturbation ----------------------------------------------------------------------------


def swap_adjacent(n: int, swaps: int, rng: random.Random) -> list[int]:
    """A permutation of range(n) with `swaps` disjoint adjacent swaps, 2 * swaps tokens displaced (position 0,
    the document start, stays)."""
    order = list(range(n))
    want = swaps
    starts = list(range(1, n - 1))
    rng.shuffle(starts)
    used: set[int] = set()
    for s in starts:
        if want == 0:
            break
        if s in used or s + 1 in used:
            continue
        order[s], order[s + 1] = order[s + 1], order[s]
        used.update((s, s + 1))
        want -= 1
    return order


@torch.no_grad()
def perplexity(adapter: ModelAdapter, ids_NT: torch.Tensor, position_ids_NT: torch.Tensor | None = None) -> float:
    model = adapter.model
    ids = ids_NT.to(adapter.device)
    kwargs = {"position_ids": position_ids_NT.to(adapter.device)} if position_ids_NT is not None else {}
    logits = model(input_ids=ids, use_cache=False, **kwargs).logits.float()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    return float(nll.exp())


class Curve(TypedDict):
    """Perplexity by the share of tokens displaced (keys: the share as text; None: read back from a NaN)."""

    tokens: dict[str, float | None]  # the tokens swapped
    position_ids: dict[str, float | None]  # the same swaps of position ids alone


def perturbation_curve(adapter: ModelAdapter, ids_NT: torch.Tensor, seed: int = 0) -> Curve:
    """Perplexity vs the share of tokens displaced by adjacent swaps (over all windows together, so that small
    shares still differ), and vs the same swaps of position ids alone."""
    N, T = ids_NT.shape
    tokens: dict[str, float | None] = {}
    positions: dict[str, float | None] = {}
    for fraction in SWAP_FRACTIONS:
        total = round(fraction * N * T / 2)  # swaps over all windows, two tokens displaced each
        counts = [total // N + (w < total % N) for w in range(N)]
        orders = [swap_adjacent(T, counts[w], random.Random(seed * 1000 + w)) for w in range(N)]
        order = torch.tensor(orders)
        tokens[str(fraction)] = perplexity(adapter, ids_NT.gather(1, order))
        positions[str(fraction)] = perplexity(adapter, ids_NT, order)
    return Curve(tokens=tokens, position_ids=positions)


# --- the study -------------------------------------------------------------------------------


def window_warnings(n_windows: int, asked: int, window: int) -> list[str]:
    """Lines saying that the corpus held fewer windows than asked, and that an interval over few windows means
    little."""
    out = []
    if n_windows < asked:
        out.append(f"the corpus holds {n_windows} windows of {window} tokens, fewer than the {asked} asked for")
    if n_windows < MIN_CI_WINDOWS:
        out.append(
            f"the bootstrap intervals (median_ci) resample only {n_windows} windows, fewer than {MIN_CI_WINDOWS}: "
            "they say little (a shorter window, more n_windows or a longer corpus give more)"
        )
    return out


@dataclass
class PositionalConfig:
    window: int = 64
    n_windows: int = 16
    seed: int = 0
    n_queries: int = 8


def random_init_like(adapter: ModelAdapter, seed: int, norm_matched: bool = False) -> ModelAdapter:
    """The same architecture with freshly initialised weights (the config's initializer range); `norm_matched`
    rescales every weight tensor to the trained model's norm of that tensor."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(adapter.config, dtype=next(adapter.model.parameters()).dtype)
    model.config._attn_implementation = adapter.config._attn_implementation
    if norm_matched:
        norms = {name: weight.float().norm() for name, weight in adapter.named_weights()}
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if name in norms:
                    if float(weight.norm()) == 0:  # initialised to zero (biases, Gemma's norm offsets): random too
                        weight.normal_()
                    weight.mul_((norms[name].cpu() / weight.float().norm().clamp(min=1e-12)).to(weight.dtype))
    return ModelAdapter(model.eval().requires_grad_(False).to(adapter.device))


class RopeParts(TypedDict):
    """The dummy-distance test and the RoPE band energies over every layer and head; all None, with the reason,
    where the family has no plain rotary embedding."""

    rope_analyses_skipped: str | None
    dummy_distance_r2_layer_head: list[list[float | None]] | None  # [layer, head], median over queries
    dummy_distance_r2_median: float | None
    dummy_distance_interaction_share_median: float | None
    band_logit_variance_share: list[float | None] | None  # [band], band 0 = highest frequency
    band_key_energy_mean: list[float | None] | None
    band_key_energy_token: list[float | None] | None


def rope_parts(adapter: ModelAdapter, ids_NT: torch.Tensor, n_queries: int) -> RopeParts:
    """The dummy-distance R^2 and the band analysis on the first window, every layer (None where no plain RoPE)."""
    T = ids_NT.shape[1]
    try:
        cos, sin = rope_tables(adapter, 2 * T)
    except Af1Error as exc:
        return RopeParts(
            rope_analyses_skipped=str(exc),
            dummy_distance_r2_layer_head=None,
            dummy_distance_r2_median=None,
            dummy_distance_interaction_share_median=None,
            band_logit_variance_share=None,
            band_key_energy_mean=None,
            band_key_energy_token=None,
        )
    qk = capture_qk(adapter, ids_NT[:1])
    queries = sorted({int(x) for x in torch.linspace(T // 4, T - 1, n_queries)})
    distances = list(range(0, T))
    r2 = torch.stack(
        [
            dummy_distance_r2(
                unrotate(q, cos[:T], sin[:T]), unrotate(k, cos[:T], sin[:T]), cos, sin, queries, distances
            )
            for q, k in (qk[layer] for layer in range(adapter.n_layers))
        ]
    )  # [layer, head, query]
    bands = [band_analysis(q, k, cos, sin) for q, k in (qk[layer] for layer in range(adapter.n_layers))]
    return RopeParts(
        rope_analyses_skipped=None,
        dummy_distance_r2_layer_head=r2.median(-1).values.tolist(),
        dummy_distance_r2_median=float(r2.median()),
        dummy_distance_interaction_share_median=float(1 - r2.median()),
        band_logit_variance_share=torch.stack([b["logit_variance_share"] for b in bands]).mean((0, 1)).tolist(),
        band_key_energy_mean=torch.stack([b["key_energy_mean"] for b in bands]).mean((0, 1)).tolist(),
        band_key_energy_token=torch.stack([b["key_energy_token"] for b in bands]).mean((0, 1)).tolist(),
    )


class Positional(RopeParts):
    """The positional study's part of its result: [layer, head] grids as lists (NaN where no r), spreads, intervals
    and the controls; the RoPE analyses are None where the family has no plain rotary embedding
    (rope_analyses_skipped says why)."""

    corpus: str
    window: int
    n_windows: int
    window_start: str | None
    n_layers: int
    n_heads: int
    attention_softcapping: float | None
    r_layer_head: list[list[float | None]]
    r_row_centred_layer_head: list[list[float | None]]
    r_no_sink_layer_head: list[list[float | None]]
    r_two_term_layer_head: list[list[float | None]]
    r_random_init_layer_head: list[list[float | None]]
    r_norm_matched_layer_head: list[list[float | None]]
    r_shuffled_layer_head: list[list[float | None]]
    distribution: dict[str, Spread]  # by fit (r, r_row_centred, ...) and control
    median_ci: dict[str, list[float | None]]
    median_ci_n_windows: int
    median_ci_note: str
    warnings: list[str]
    r_mean: float | None
    r_median: float | None
    r_median_row_centred: float | None
    r_median_no_sink: float | None
    r_median_random_init: float | None
    r_median_random_init_row_centred: float | None
    r_median_norm_matched: float | None
    r_median_norm_matched_row_centred: float | None
    r_median_shuffled: float | None
    r_median_shuffled_row_centred: float | None
    perplexity_vs_swap: dict[str, float | None]
    perplexity_vs_position_swap: dict[str, float | None]
    swap_fraction: str
    heldout: HeldOut | None  # None: one window, nothing to hold out (a warning says so)


class HeldOut(TypedDict):
    """The decomposition tested out of sample (`token_fit_heldout`): fitted on half the windows, its row-centred r
    measured on the other half; the meaning term a function of the key's token; beside position alone, the same
    tokens shuffled, and the architecture with random weights over several seeds; and the claims these decide."""

    train_windows: list[int]
    test_windows: list[int]
    r_layer_head: list[list[float | None]]  # position + token meaning, per layer and head (mean over held-out windows)
    r_position_only_layer_head: list[list[float | None]]
    r_median: float | None
    r_median_ci: list[float | None]
    r_position_only_median: float | None
    r_position_only_median_ci: list[float | None]
    r_shuffled_median: float | None
    r_shuffled_median_ci: list[float | None]
    random_init_seeds: list[int]
    r_random_init_medians: list[float | None]  # one per seed
    r_random_init_mean: float | None
    r_random_init_ci: list[float | None]  # 95 % t interval over the seeds
    claims: list[Claim]


RANDOM_SEEDS = 5  # random-weight controls of the held-out test


def heldout_study(
    adapter: ModelAdapter, ids_NT: torch.Tensor, shuffled_NT: torch.Tensor, logits: torch.Tensor, seed: int
) -> HeldOut:
    """The held-out test of the decomposition and its claims (a meaning term that adds to position out of sample;
    learned, against random weights over RANDOM_SEEDS seeds; shaped by word order, against shuffled tokens)."""
    N = ids_NT.shape[0]
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    train = order[: N // 2].sort().values
    test = order[N // 2 :].sort().values

    def heldout(logits_LHNTT: torch.Tensor, ids: torch.Tensor, with_token: bool = True) -> torch.Tensor:
        L, H = logits_LHNTT.shape[:2]
        return token_fit_heldout(logits_LHNTT.flatten(0, 1), ids, train, with_token).view(L, H, len(test))

    r_LHN = heldout(logits, ids_NT)
    pos_LHN = heldout(logits, ids_NT, with_token=False)
    shuffled_LHN = heldout(capture_logits(adapter, shuffled_NT), shuffled_NT)
    seeds = [seed + 1 + s for s in range(RANDOM_SEEDS)]
    random_medians = [
        float(heldout(capture_logits(random_init_like(adapter, s), ids_NT), ids_NT).mean(-1).median()) for s in seeds
    ]
    mean = float(np.mean(random_medians))
    spread = scipy_stats.sem(random_medians) * scipy_stats.t.ppf(0.975, len(seeds) - 1)
    median = float(r_LHN.mean(-1).median())
    ci = median_ci(r_LHN, seed=seed)
    shuffled_median, shuffled_ci = float(shuffled_LHN.mean(-1).median()), median_ci(shuffled_LHN, seed=seed)
    where = f"{len(test)} held-out windows (fitted on the other {len(train)})"
    gain_N = (r_LHN - pos_LHN).flatten(0, 1).median(0).values  # per held-out window, the median head's gain
    claims = [
        paired_greater(
            "meaning_term",
            "a meaning term that is a function of the key's token, fitted on other windows, adds to position alone "
            "on held-out windows (row-centred r)",
            gain_N.tolist(),
            [0.0] * len(test),
            where,
            seed=seed,
            unit="held-out windows",
        ),
        interval_above(
            "learned",
            "the held-out decomposition is learned: the trained model's median r is above that of the same "
            f"architecture with random weights ({len(seeds)} seeds)",
            median,
            ci,
            mean,
            [mean - spread, mean + spread],
            where,
            len(test),
        ),
        paired_greater(
            "word_order",
            "word order shapes it: on each held-out window, the median head's r on the text is above that on the same "
            "tokens shuffled",
            r_LHN.flatten(0, 1).median(0).values.tolist(),
            shuffled_LHN.flatten(0, 1).median(0).values.tolist(),
            where,
            seed=seed,
            unit="held-out windows",
        ),
    ]
    return HeldOut(
        train_windows=train.tolist(),
        test_windows=test.tolist(),
        r_layer_head=r_LHN.mean(-1).tolist(),
        r_position_only_layer_head=pos_LHN.mean(-1).tolist(),
        r_median=median,
        r_median_ci=ci,
        r_position_only_median=float(pos_LHN.mean(-1).median()),
        r_position_only_median_ci=median_ci(pos_LHN, seed=seed),
        r_shuffled_median=shuffled_median,
        r_shuffled_median_ci=shuffled_ci,
        random_init_seeds=seeds,
        r_random_init_medians=list(random_medians),
        r_random_init_mean=mean,
        r_random_init_ci=[mean - spread, mean + spread],
        claims=adjust(claims, "the positional study"),
    )


def study(
    adapter: ModelAdapter,
    tokenizer: PreTrainedTokenizerBase,
    config: PositionalConfig,
    corpus: str | Path | None = None,
) -> Positional:
    """The whole positional study on one model: fits, controls, dummy distance, bands, perturbation."""

    start = document_start(tokenizer)
    ids = corpus_windows(
        adapter, tokenizer, load_corpus(corpus), config.window, config.n_windows, start[0] if start else None
    )
    logits = capture_logits(adapter, ids)
    fits = {
        "": window_fit(logits),
        "random_init": window_fit(capture_logits(random_init_like(adapter, config.seed), ids)),
        "norm_matched": window_fit(capture_logits(random_init_like(adapter, config.seed, norm_matched=True), ids)),
    }
    g = torch.Generator().manual_seed(config.seed)
    first = 1 if start else 0  # the document start stays in place
    shuffled_ids = torch.stack(
        [torch.cat([w[:first], w[first:][torch.randperm(len(w) - first, generator=g)]]) for w in ids]
    )
    fits["shuffled"] = window_fit(capture_logits(adapter, shuffled_ids))
    heldout = heldout_study(adapter, ids, shuffled_ids, logits, config.seed) if len(ids) >= 2 else None
    one_window = ["one window: nothing to hold out, so the decomposition is not tested out of sample"]
    trained = {k: v.mean(-1) for k, v in by_name(fits[""]).items()}
    per_head: dict[str, torch.Tensor] = dict(trained)
    for control in ("random_init", "norm_matched", "shuffled"):
        per_head[control] = fits[control]["r"].mean(-1)
        per_head[f"{control}_row_centred"] = fits[control]["r_row_centred"].mean(-1)
    windows = by_name(fits[""]) | {
        f"{c}{suffix}": fits[c]["r"] if suffix == "" else fits[c]["r_row_centred"]
        for c in ("random_init", "norm_matched", "shuffled")
        for suffix in ("", "_row_centred")
    }
    d = {name: summary(v) for name, v in per_head.items()}
    rope = rope_parts(adapter, ids, config.n_queries)
    curve = perturbation_curve(adapter, ids, config.seed)
    return Positional(
        **rope,
        corpus=str(corpus) if corpus else CORPUS_SOURCE,
        window=ids.shape[1],
        n_windows=ids.shape[0],
        window_start=start[1] if start else None,
        n_layers=adapter.n_layers,
        n_heads=adapter.n_heads,
        attention_softcapping=getattr(adapter.config, "attn_logit_softcapping", None),
        r_layer_head=trained["r"].tolist(),
        r_row_centred_layer_head=trained["r_row_centred"].tolist(),
        r_no_sink_layer_head=trained["r_no_sink"].tolist(),
        r_two_term_layer_head=trained["r_two_term"].tolist(),
        r_random_init_layer_head=per_head["random_init"].tolist(),
        r_norm_matched_layer_head=per_head["norm_matched"].tolist(),
        r_shuffled_layer_head=per_head["shuffled"].tolist(),
        distribution=d,
        median_ci={name: median_ci(v, seed=config.seed) for name, v in windows.items()},
        median_ci_n_windows=ids.shape[0],
        median_ci_note=f"95 % bootstrap over the {ids.shape[0]} windows of {ids.shape[1]} tokens (1000 draws) of "
        "the median over heads; the windows are passages of one text, so the interval is over passages, not genres",
        warnings=window_warnings(ids.shape[0], config.n_windows, ids.shape[1])
        + (one_window if heldout is None else []),
        r_mean=d["r"]["mean"],
        r_median=d["r"]["median"],
        r_median_row_centred=d["r_row_centred"]["median"],
        r_median_no_sink=d["r_no_sink"]["median"],
        r_median_random_init=d["random_init"]["median"],
        r_median_random_init_row_centred=d["random_init_row_centred"]["median"],
        r_median_norm_matched=d["norm_matched"]["median"],
        r_median_norm_matched_row_centred=d["norm_matched_row_centred"]["median"],
        r_median_shuffled=d["shuffled"]["median"],
        r_median_shuffled_row_centred=d["shuffled_row_centred"]["median"],
        perplexity_vs_swap=curve["tokens"],
        perplexity_vs_position_swap=curve["position_ids"],
        swap_fraction="share of tokens displaced by disjoint adjacent swaps (the document start stays)",
        heldout=heldout,
    )
