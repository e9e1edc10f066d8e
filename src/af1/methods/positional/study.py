"""Attention logits as position + meaning (docs/methods.md §3, Han & Ji 2025): per head, logits fitted
by a[i-j] + b[i] + c[j], its r against random-weight (initialised, rescaled) and shuffled-token controls."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, interval_above, prediction_interval
from af1.methods.positional.corpus import CORPUS_SOURCE, corpus_windows, load_corpus, shuffled, window_warnings
from af1.methods.positional.fit import Spread, capture_logits, median, median_ci, summary, token_fit_heldout, window_fit
from af1.methods.positional.perturbation import perturbation_curve
from af1.methods.positional.rope import RopeParts, rope_parts
from af1.methods.positional.windows import window_claims
from af1.models.adapter import ModelAdapter
from af1.tasks.task import document_start

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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


class HeldOut(TypedDict):
    """The decomposition tested out of sample (`token_fit_heldout`): fitted on half the windows, row-centred r on the
    other, beside position alone, shuffled tokens and random weights over several seeds; and the claims these decide."""

    train_windows: list[int]
    test_windows: list[int]
    r_layer_head: list[list[float | None]]  # position + token meaning, per layer and head (mean over held-out windows)
    r_position_only_layer_head: list[list[float | None]]
    r_median: float | None
    r_median_ci: list[float | None]
    r_position_only_median: float | None
    r_position_only_median_ci: list[float | None]
    r_token_permuted_median: float | None  # the meaning term read with token identities permuted (its null)
    r_shuffled_median: float | None
    r_shuffled_median_ci: list[float | None]
    random_init_seeds: list[int]
    r_random_init_medians: list[float | None]  # one per seed
    r_random_init_mean: float | None
    r_random_init_range: list[float | None]  # where one random-weight model's r falls: 95 % t prediction interval
    r_norm_matched_medians: list[float | None]  # the same seeds, each tensor rescaled to the trained model's norm
    r_norm_matched_mean: float | None
    r_norm_matched_range: list[float | None]
    claims: list[Claim]


class Positional(RopeParts):
    """The positional study's part: [layer, head] grids (NaN where no r), spreads, intervals and controls; the RoPE
    analyses None where the family has no plain rotary embedding (`rope_analyses_skipped` says why)."""

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


RANDOM_SEEDS = 5  # random-weight controls of the held-out test


LEARNED = {  # the learned claims, by whether the random weights are rescaled to the trained model's norms
    False: (
        "learned",
        "the held-out decomposition is learned: the trained model's median r is above where that of "
        "the same architecture with random weights falls",
    ),
    True: (
        "learned_at_scale",
        "it is learned, not the architecture at the trained scale: the trained model's "
        "median r is above where that of random weights rescaled to the trained model's norm of every weight "
        "tensor falls",
    ),
}


def heldout_study(
    adapter: ModelAdapter, ids_NT: torch.Tensor, shuffled_NT: torch.Tensor, logits: torch.Tensor, seed: int
) -> HeldOut:
    """The held-out test of the decomposition and its claims: a meaning term adds to position out of sample, is learned
    (against random weights over RANDOM_SEEDS seeds) and is shaped by word order (against shuffled tokens)."""
    N = ids_NT.shape[0]
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    train = order[: N // 2].sort().values
    test = order[N // 2 :].sort().values

    def heldout(
        logits_LHNTT: torch.Tensor, ids: torch.Tensor, with_token: bool = True, permuted: int | None = None
    ) -> torch.Tensor:
        """The held-out row-centred r [layer, head, held-out window] (`token_fit_heldout`)."""
        L, H = logits_LHNTT.shape[:2]
        fitted = token_fit_heldout(logits_LHNTT.flatten(0, 1), ids, train, with_token, permuted=permuted)
        return fitted.view(L, H, len(test))

    r_LHN = heldout(logits, ids_NT)
    pos_LHN = heldout(logits, ids_NT, with_token=False)
    permuted_LHN = heldout(logits, ids_NT, permuted=seed)
    shuffled_LHN = heldout(capture_logits(adapter, shuffled_NT), shuffled_NT)
    seeds = [seed + 1 + s for s in range(RANDOM_SEEDS)]
    randoms = {  # per control, each seed's held-out median
        scaled: [
            float(median(heldout(capture_logits(random_init_like(adapter, s, scaled), ids_NT), ids_NT).mean(-1)))
            for s in seeds
        ]
        for scaled in LEARNED
    }
    falls = {scaled: prediction_interval(medians) for scaled, medians in randoms.items()}  # mean, prediction interval
    r_median, ci = float(median(r_LHN.mean(-1))), median_ci(r_LHN, seed=seed)
    where = f"{len(test)} held-out windows (fitted on the other {len(train)})"
    meaning, word_order = window_claims(r_LHN, pos_LHN, permuted_LHN, shuffled_LHN, where, seed)
    over = f"(a 95 % prediction interval over {len(seeds)} seeds)"
    learned = [
        interval_above(About(kind, f"{said} {over}", where), r_median, ci, *falls[scaled], len(test))
        for scaled, (kind, said) in LEARNED.items()
    ]
    claims = [meaning, *learned, word_order]
    return HeldOut(
        train_windows=train.tolist(),
        test_windows=test.tolist(),
        r_layer_head=r_LHN.mean(-1).tolist(),
        r_position_only_layer_head=pos_LHN.mean(-1).tolist(),
        r_median=r_median,
        r_median_ci=ci,
        r_position_only_median=float(median(pos_LHN.mean(-1))),
        r_token_permuted_median=float(median(permuted_LHN.mean(-1))),
        r_position_only_median_ci=median_ci(pos_LHN, seed=seed),
        r_shuffled_median=float(median(shuffled_LHN.mean(-1))),
        r_shuffled_median_ci=median_ci(shuffled_LHN, seed=seed),
        random_init_seeds=seeds,
        r_random_init_medians=list(randoms[False]),
        r_random_init_mean=falls[False][0],
        r_random_init_range=list(falls[False][1]),
        r_norm_matched_medians=list(randoms[True]),
        r_norm_matched_mean=falls[True][0],
        r_norm_matched_range=list(falls[True][1]),
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
    shuffled_ids = shuffled(ids, 1 if start else 0, config.seed)
    fits = {
        "": window_fit(logits),
        "random_init": window_fit(capture_logits(random_init_like(adapter, config.seed), ids)),
        "norm_matched": window_fit(capture_logits(random_init_like(adapter, config.seed, norm_matched=True), ids)),
        "shuffled": window_fit(capture_logits(adapter, shuffled_ids)),
    }
    heldout = heldout_study(adapter, ids, shuffled_ids, logits, config.seed) if len(ids) >= 2 else None
    one_window = ["one window: nothing to hold out, so the decomposition is not tested out of sample"]
    # per window: the trained model's four fits, then each control's plain and row-centred r
    controls = ("random_init", "norm_matched", "shuffled")
    windows = fits[""] | {f"{c}{suffix}": fits[c][f"r{suffix}"] for c in controls for suffix in ("", "_row_centred")}
    per_head = {name: r.mean(-1) for name, r in windows.items()}
    d = {name: summary(v) for name, v in per_head.items()}
    rope = rope_parts(adapter, ids, config.n_queries)
    curve = perturbation_curve(adapter, ids, config.seed)
    return Positional.of(
        rope,
        corpus=str(corpus) if corpus else CORPUS_SOURCE,
        window=ids.shape[1],
        n_windows=ids.shape[0],
        window_start=start[1] if start else None,
        n_layers=adapter.n_layers,
        n_heads=adapter.n_heads,
        attention_softcapping=getattr(adapter.config, "attn_logit_softcapping", None),
        # [layer, head] grids: r_layer_head, r_row_centred_layer_head, ...; r_random_init_layer_head, ...
        **{f"{fit}_layer_head": per_head[fit].tolist() for fit in fits[""]},
        **{f"r_{control}_layer_head": per_head[control].tolist() for control in controls},
        distribution=d,
        median_ci={name: median_ci(v, seed=config.seed) for name, v in windows.items()},
        median_ci_n_windows=ids.shape[0],
        median_ci_note=f"95 % bootstrap over the {ids.shape[0]} windows of {ids.shape[1]} tokens (1000 draws) of "
        "the median over heads; the windows are passages of one text, so the interval is over passages, not genres",
        warnings=window_warnings(ids.shape[0], config.n_windows, ids.shape[1])
        + (one_window if heldout is None else []),
        r_mean=d["r"]["mean"],
        # medians: r_median, r_median_row_centred, r_median_no_sink; r_median_random_init(_row_centred), ...
        **{f"r_median{fit.removeprefix('r')}": d[fit]["median"] for fit in ("r", "r_row_centred", "r_no_sink")},
        **{f"r_median_{c}{s}": d[f"{c}{s}"]["median"] for c in controls for s in ("", "_row_centred")},
        perplexity_vs_swap=curve["tokens"],
        perplexity_vs_position_swap=curve["position_ids"],
        swap_fraction="share of tokens displaced by disjoint adjacent swaps (the document start stays)",
        heldout=heldout,
    )
