"""Word order: perplexity as adjacent tokens are swapped in growing fractions."""

from __future__ import annotations

import random

import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.models.adapter import ModelAdapter

SWAP_FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)


def swap_adjacent(n: int, swaps: int, rng: random.Random) -> list[int]:
    """A permutation of range(n) with `swaps` disjoint adjacent swaps, 2 * swaps tokens displaced (position 0,
    the document start, stays)."""
    order = list(range(n))
    starts = list(range(1, n - 1))
    rng.shuffle(starts)
    for s in starts:
        if swaps == 0:
            break
        if order[s] == s and order[s + 1] == s + 1:  # neither displaced yet: the swaps stay disjoint
            order[s], order[s + 1] = s + 1, s
            swaps -= 1
    return order


@torch.no_grad()
def perplexity(adapter: ModelAdapter, ids_NT: torch.Tensor, position_ids_NT: torch.Tensor | None = None) -> float:
    """Perplexity of the windows' next tokens, at the given position ids (default: in order)."""
    ids = ids_NT.to(adapter.device)
    kwargs = {"position_ids": position_ids_NT.to(adapter.device)} if position_ids_NT is not None else {}
    logits = adapter.model(input_ids=ids, use_cache=False, **kwargs).logits.float()
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
