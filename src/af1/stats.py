"""Numbers a reviewer accepts: every rate carries its n, its exact (Clopper-Pearson) 95 % interval and the constant
guess's score on the same problems; paired exact McNemar tests."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Hashable, Sequence

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

Z95 = 1.959963984540054
BASELINE_WARNING = 0.5


def exact_interval(k: int, n: int) -> tuple[float, float]:
    """95 % exact (Clopper-Pearson) interval of k successes in n trials, from the beta quantiles; (nan, nan) when n is
    0. Its ends are where the one-sided exact binomial tests of the rate claims reach 2.5 % (`af1.claims`)."""
    from scipy.stats import beta  # scipy only when a rate is made: `af1 --help` stays fast

    if n == 0:
        return float("nan"), float("nan")
    low = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return low, high


def constant_baseline(targets: Sequence[Hashable], layouts: Sequence[Hashable] | None = None) -> float:
    """What a constant guess scores: the share of problems with the most common target; with `layouts`, one guess per
    token layout (sum of n_g * b_g over n)."""
    if not targets:
        return float("nan")
    if layouts is None:
        return Counter(targets).most_common(1)[0][1] / len(targets)
    if len(layouts) != len(targets):
        raise ValueError(f"{len(layouts)} layouts for {len(targets)} targets")
    best: dict[Hashable, int] = {}
    for (layout, _), count in Counter(zip(layouts, targets, strict=True)).items():
        best[layout] = max(best.get(layout, 0), count)
    return sum(best.values()) / len(targets)


@with_config(ConfigDict(extra="forbid"))
class LayoutRate(TypedDict):
    """One token layout's part of a pooled rate: its value, n, 95 % interval and constant guess."""

    layout: int
    value: float
    n: int
    ci: list[float]
    baseline: float


class Rate(TypedDict):
    """A rate as every number af1 reports it: value, k of n, 95 % interval, constant-guess baseline; for a task of
    several token layouts each layout's part (`by_layout`, filled in by `Scores.rate`)."""

    value: float
    k: int
    n: int
    ci: list[float]
    baseline: float
    near_constant: bool
    by_layout: NotRequired[list[LayoutRate]]


@with_config(ConfigDict(extra="forbid"))
class McNemar(TypedDict):
    """A paired exact McNemar test: problems only the first / only the second side gets right, two-sided p."""

    only_first: int
    only_second: int
    p_value: float


@with_config(ConfigDict(extra="forbid"))
class Paired(McNemar):
    """A McNemar test with the number of problems paired."""

    n: int


class MeanStd(TypedDict):
    """Mean and sample standard deviation of n values."""

    mean: float
    std: float
    n: int


def rate(correct: Sequence[bool], targets: Sequence[Hashable], layouts: Sequence[Hashable] | None = None) -> Rate:
    """A rate with its n, 95 % exact interval and constant-guess baseline (same problems; per token layout when
    `layouts` gives each problem's)."""
    if len(correct) != len(targets):
        raise ValueError(f"{len(correct)} outcomes for {len(targets)} targets")
    k, n = sum(bool(c) for c in correct), len(correct)
    low, high = exact_interval(k, n)
    baseline = constant_baseline(targets, layouts)
    return Rate(
        value=k / n if n else float("nan"),
        k=k,
        n=n,
        ci=[low, high],
        baseline=baseline,
        near_constant=bool(baseline >= BASELINE_WARNING),
    )


def baseline_warning(what: str, baseline: float, n: int) -> str | None:
    """One line when a constant guess already scores half or more."""
    if n and baseline >= BASELINE_WARNING:
        return (
            f"{what}: the target is near constant (a constant guess scores {baseline:.2f} on these {n} problems); "
            "rates on it say little"
        )
    return None


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> McNemar:
    """Paired exact McNemar test of two configurations on the same problems (two-sided binomial on discordant pairs)."""
    if len(a) != len(b):
        raise ValueError("McNemar needs the same problems on both sides")
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    m = only_a + only_b
    if m == 0:
        p = 1.0
    else:
        tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2**m
        p = min(1.0, 2 * tail)
    return McNemar(only_first=only_a, only_second=only_b, p_value=p)


def split_indices(n: int, fraction: float = 0.5, seed: int = 0) -> tuple[list[int], list[int]]:
    """A seeded split of range(n) into (selection, confirmation), the selection taking `fraction`."""
    if not 0 < fraction < 1:
        raise ValueError(f"the selection fraction must be in (0, 1), got {fraction}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = round(n * fraction)
    return sorted(order[:cut]), sorted(order[cut:])


def mean_std(values: Sequence[float]) -> MeanStd:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n}


def rate_text(rate: Rate | MeanStd) -> str:
    """A rate as `with_ci` writes it; a mean over draws or seeds as mean ± std over n."""
    if "ci" in rate:
        return with_ci(rate["value"], rate["ci"])
    return f"{rate['mean']:.3f} ± {rate['std']:.3f} over {rate['n']}"


def with_ci(value: float | str | None, ci: Sequence[float | None] | None = None) -> str:
    """A rate or estimate and its 95 % interval, the one way it is written (tables, terminals, hover texts,
    verdicts): 0.816 [0.69, 0.90]; "-" where there is no finite value, the value alone without a finite interval."""
    if not isinstance(value, float | int) or not math.isfinite(value):
        return "-"
    bounds = [b for b in ci or () if isinstance(b, float | int) and math.isfinite(b)]
    return f"{value:.3f} [{bounds[0]:.2f}, {bounds[1]:.2f}]" if len(bounds) == 2 else f"{value:.3f}"
