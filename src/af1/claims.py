"""Claims as data: each verdict is a `Claim` decided by a rule stated before the data on problems that did not choose
it, with n, estimate, 95 % interval, raw and family-adjusted p's and one of three outcomes (`outcome_text`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, with_config
from scipy import stats as scipy_stats
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.stats import Z95, exact_interval, mcnemar_exact, with_ci

ALPHA = 0.05
Outcome = Literal["confirmed", "not confirmed", "rejected"]
Alternative = Literal["greater", "less", "two-sided"]
CONFIRMED: Outcome = "confirmed"
NOT_CONFIRMED: Outcome = "not confirmed"
REJECTED: Outcome = "rejected"
MAX_N = 100_000  # beyond this an observed rate that sits on its threshold is called undecidable
POWER = 0.8  # "n to decide": the n at which the observed effect would be decided this often
RATE_TEST = "one-sided exact binomial test of the rate against"  # how `_rate_tested` claims' rules begin


@dataclasses.dataclass(frozen=True)
class About:
    """What a claim is about: its kind, statement, where measured, which one of its kind (`subject`, e.g. head "16.11")
    and the constant guess it is read against."""

    kind: str
    statement: str
    measured_on: str
    subject: str | None = None
    baseline: float | None = None


@with_config(ConfigDict(extra="forbid"))
class Claim(TypedDict):
    """One claim as decided: statement, rule, where measured, n, estimate with 95 % interval and baseline, raw and
    family-adjusted p (None: no test), outcome, and for one not confirmed the n that would decide it (None: none)."""

    kind: str
    subject: str | None  # what it is about where a result holds several of a kind: a head "16.11", a variant
    statement: str
    rule: str
    measured_on: str
    n: int
    estimate: float | None  # None: read back from a NaN (no problem, one window)
    ci: list[float | None]
    baseline: float | None
    null: float | None  # what the rule sets the estimate against: the threshold, 0 for a difference, the other
    # estimate (None: read back from a NaN)
    p_value: float | None
    p_adjusted: float | None
    p_against: float | None  # a one-sided claim's opposite test, whose adjusted p decides a rejection
    p_against_adjusted: float | None
    alternative: Alternative | None  # the test's direction; None: a rule on intervals alone
    alpha: float | None  # the level the adjusted p must be below (one-sided: ALPHA / 2, as the 95 % interval)
    family: str | None
    outcome: Outcome
    n_to_decide: int | None


@functools.lru_cache(maxsize=4096)  # a family's claims share rates and levels
def n_to_decide_rate(rate: float, threshold: float, level: float = ALPHA / 2) -> int | None:
    """The n at which the one-sided exact binomial test at `level` decides with POWER at true rate `rate` (None: rate
    at the threshold, or beyond MAX_N); exact power saw-tooths, so this is where bisection finds it cross POWER."""
    if not (math.isfinite(rate) and 0 <= rate <= 1) or rate == threshold or not 0 < threshold < 1:
        return None

    def power(n: int) -> float:
        if rate > threshold:  # the smallest k whose upper tail under the threshold is below the level
            k = int(scipy_stats.binom.isf(level, n, threshold)) + 1
            while k > 0 and scipy_stats.binom.sf(k - 2, n, threshold) < level:
                k -= 1
            while k <= n and scipy_stats.binom.sf(k - 1, n, threshold) >= level:
                k += 1
            return float(scipy_stats.binom.sf(k - 1, n, rate))
        k = int(scipy_stats.binom.ppf(level, n, threshold)) - 1  # the largest k whose lower tail is below the level
        while k < n and scipy_stats.binom.cdf(k + 1, n, threshold) < level:
            k += 1
        while k >= 0 and scipy_stats.binom.cdf(k, n, threshold) >= level:
            k -= 1
        return float(scipy_stats.binom.cdf(k, n, rate))

    if power(MAX_N) < POWER:
        return None
    below, above = 0, MAX_N  # bisection: short of POWER at `below` (none at 0), reached at `above`
    while above - below > 1:
        middle = (below + above) // 2
        below, above = (below, middle) if power(middle) >= POWER else (middle, above)
    return above


def rate_below(about: About, correct: Sequence[bool], threshold: float) -> Claim:
    """'The rate is below `threshold`': one-sided exact binomial tests (scipy's binomtest), adjusted with its family
    (`adjust`); confirmed by the test below the threshold, rejected by the test above it."""
    return _rate_tested(about, correct, threshold, "less")


def rate_above(about: About, correct: Sequence[bool], threshold: float) -> Claim:
    """'The rate is at least `threshold`': confirmed by the one-sided exact binomial test above, rejected by the one
    below (each errs at most 2.5 % at a true rate of exactly the threshold), adjusted with its family (`adjust`)."""
    return _rate_tested(about, correct, threshold, "greater")


def _rate_tested(
    about: About, correct: Sequence[bool], threshold: float, alternative: Literal["less", "greater"]
) -> Claim:
    """A rate against a threshold by the one-sided exact binomial test on its side (confirmation) and on the other
    (rejection), with the exact interval."""
    k, n = sum(bool(c) for c in correct), len(correct)
    opposite: Literal["less", "greater"] = "less" if alternative == "greater" else "greater"
    p, q = (
        float(scipy_stats.binomtest(k, n, threshold, alternative=a).pvalue) if n else 1.0
        for a in (alternative, opposite)
    )
    rule = f"{RATE_TEST} {threshold} ({alternative}); rejected by the one-sided test on the other side ({opposite})"
    value = k / n if n else float("nan")
    return tested(about, rule, n, value, list(exact_interval(k, n)), threshold, alternative, (p, q))


def interval_claim(
    about: About, rule: str, n: int, estimate: float, ci: Sequence[float], null: float, outcome: Outcome
) -> Claim:
    """A claim decided by a rule on intervals alone: no test, no family (its n to decide is the caller's)."""
    return Claim(
        kind=about.kind,
        subject=about.subject,
        statement=about.statement,
        rule=rule,
        measured_on=about.measured_on,
        n=n,
        estimate=estimate,
        ci=list(ci),
        baseline=about.baseline,
        null=null,
        p_value=None,
        p_adjusted=None,
        p_against=None,
        p_against_adjusted=None,
        alternative=None,
        alpha=None,
        family=None,
        outcome=outcome,
        n_to_decide=None,
    )


def capped(claim: Claim, outcome: Outcome, why: str) -> Claim:
    """The claim with its outcome lowered to `outcome` where the rule allows no better (why: the rule's extra
    condition), e.g. a cell that did not reach the threshold where it was chosen is never confirmed."""
    order = (REJECTED, NOT_CONFIRMED, CONFIRMED)
    lowered = order[min(order.index(claim["outcome"]), order.index(outcome))]
    return Claim(**{**claim, "outcome": lowered, "rule": f"{claim['rule']}; {why}"})


def tested(
    about: About,
    rule: str,
    n: int,
    estimate: float,
    ci: Sequence[float],
    null: float,
    alternative: Alternative,
    p: tuple[float, float | None],
) -> Claim:
    """A claim decided by a test against `null` with p's `(p_value, p_against)` (None: no opposite test), the outcome
    from their family-adjusted values (`decided`)."""
    p_value, p_against = p
    alpha = ALPHA if alternative == "two-sided" else ALPHA / 2
    rule = f"{rule}; each p adjusted over its family, below {alpha}"
    claim = interval_claim(about, rule, n, estimate, ci, null, NOT_CONFIRMED)
    test = {"p_value": p_value, "p_adjusted": p_value, "alternative": alternative, "alpha": alpha}
    against = {"p_against": p_against, "p_against_adjusted": p_against}
    return decided(Claim(**{**claim, **test, **against}))


def decided(claim: Claim, times: float = 1.0, times_against: float = 1.0) -> Claim:
    """Confirmed by its own adjusted p below the level, rejected by the opposite one; else not confirmed, with the n
    the observed effect needs at ALPHA over `times` (or `times_against`, on the other side)."""
    level = claim["alpha"] or ALPHA
    p, q = claim["p_adjusted"], claim["p_against_adjusted"]
    outcome = CONFIRMED if p is not None and p < level else REJECTED if q is not None and q < level else NOT_CONFIRMED
    out = Claim(**{**claim, "outcome": outcome, "n_to_decide": None})
    if outcome == NOT_CONFIRMED:
        towards = _towards(claim)
        if towards or claim["p_against"] is not None:  # an effect pointing away is decided by the opposite test
            out["n_to_decide"] = n_for_effect(claim, times if towards else times_against)
    return out


def _towards(claim: Claim) -> bool:
    """Whether the estimate lies on the claim's side of its null (a two-sided claim: off it)."""
    estimate, null = claim["estimate"], claim["null"]
    if estimate is None or null is None or not math.isfinite(estimate) or not math.isfinite(null) or estimate == null:
        return False
    return claim["alternative"] in ("two-sided", None) or (estimate > null) == (claim["alternative"] == "greater")


def n_for_effect(claim: Claim, times: float = 1.0) -> int | None:
    """The n deciding an effect of the observed size with POWER at ALPHA / `times`: a rate's by exact binomial power,
    any other's by its interval shrinking as 1/sqrt(n)."""
    level = (claim["alpha"] or ALPHA) / times
    estimate, null = claim["estimate"], claim["null"]
    if claim["rule"].startswith(RATE_TEST) and estimate is not None and null is not None:
        need = n_to_decide_rate(estimate, null, level)
        return None if need is None else max(need, claim["n"] + 1)
    return n_to_part(claim, level)


def n_to_part(claim: Claim, level: float = ALPHA / 2) -> int | None:
    """About the n at which a one-sided test at `level` decides the effect with POWER, its half-width shrinking as
    1/sqrt(n) (None: on the null, or past MAX_N); values that do not spread: the sign test's n = log2(1 / level)."""
    low, high = (math.nan if v is None else v for v in claim["ci"])
    estimate, null = claim["estimate"], claim["null"]
    distance = math.nan if estimate is None or null is None else abs(estimate - null)
    se = (high - low) / 2 / Z95
    if not all(map(math.isfinite, (se, distance))) or distance == 0 or claim["n"] == 0:
        return None
    if se == 0:
        return max(claim["n"] + 1, math.ceil(-math.log2(level)))
    z = float(scipy_stats.norm.isf(level) + scipy_stats.norm.isf(1 - POWER))
    need = max(claim["n"] + 1, math.ceil(claim["n"] * (z * se / distance) ** 2))
    return need if need <= MAX_N else None


RESAMPLES = 9999  # permutation tests: the smallest p is 1 / 10,000
BOOTSTRAP = 2000


def percentile_interval(
    samples: tuple[np.ndarray, ...], statistic: Any, seed: int = 0, paired: bool = False, vectorized: bool = True
) -> list[float]:
    """95 % percentile-bootstrap interval (BOOTSTRAP resamples, seeded) of `statistic` over `samples`."""
    ci = scipy_stats.bootstrap(
        samples,
        statistic,
        paired=paired,
        vectorized=vectorized,
        confidence_level=0.95,
        n_resamples=BOOTSTRAP,
        method="percentile",
        rng=np.random.default_rng(seed),
    ).confidence_interval
    return [float(ci.low), float(ci.high)]


def mean_interval(values: Sequence[float], seed: int = 0) -> list[float]:
    """95 % percentile-bootstrap interval of the mean over problems (the interval every per-problem effect gets)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2 or float(x.std()) == 0.0:
        mean = float(x.mean()) if len(x) else float("nan")
        return [mean, mean]
    return percentile_interval((x,), np.mean, seed)


def _mean_p(x: np.ndarray, threshold: float, alternative: Literal["less", "greater"]) -> float:
    """One-sided one-sample t test of the mean against `threshold` (a sign test where the values do not spread)."""
    if len(x) >= 2 and float(x.std()) > 0:
        test: Any = scipy_stats.ttest_1samp(x, threshold, alternative=alternative)  # untyped in scipy
        return float(test.pvalue)
    side = x < threshold if alternative == "less" else x > threshold
    return 0.5 ** len(x) if len(x) >= 2 and bool(side.all()) else 1.0  # one problem, or no spread: a sign test


def share_above(
    about: About,
    change_P: Sequence[float],
    keep_P: Sequence[float],
    gap_P: Sequence[float],
    margin: float,
    seed: int = 0,
) -> Claim:
    """'The share moved towards the counterfactual's answer exceeds the answer-keeping one's by `margin`': sum(change
    - keep) / sum(gap), bootstrap interval; a one-sided t test where sum(gap) < 0, else nothing is decided."""
    c, k, g = (np.asarray(v, dtype=float) for v in (change_P, keep_P, gap_P))
    keep = np.isfinite(c) & np.isfinite(k) & np.isfinite(g)
    d, g = (c - k)[keep], g[keep]
    moved = len(g) >= 1 and float(g.sum()) < 0
    x = d - margin * g
    estimate = float(d.sum() / g.sum()) if moved else float("nan")
    ci = [estimate, estimate]
    if moved and len(d) >= 2 and float(np.abs(d).max()) > 0:
        ci = percentile_interval((d, g), lambda a, b, axis: a.sum(axis) / b.sum(axis), seed, paired=True)
    return tested(
        dataclasses.replace(about, baseline=margin),
        f"share difference sum(change - keep) / sum(gap) against {margin}: one-sided t test of (change - keep) - "
        f"{margin} * gap below 0 over problems (a sign test where the values do not spread; nothing is decided where "
        "the counterfactual does not move the answer towards its own); rejected by the one-sided test above it",
        len(d),
        estimate,
        ci,
        margin,
        "greater",
        (_mean_p(x, 0.0, "less") if moved else 1.0, _mean_p(x, 0.0, "greater") if moved else 1.0),
    )


def mean_below(about: About, values: Sequence[float], threshold: float, seed: int = 0) -> Claim:
    """'The mean over problems is below `threshold`': one-sided t tests (a sign test where values do not spread) both
    ways, each adjusted over its family, with the mean's bootstrap interval."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]

    def p_of(alternative: Literal["less", "greater"]) -> float:
        return _mean_p(x, threshold, alternative)

    return tested(
        dataclasses.replace(about, baseline=threshold),
        f"one-sided t test of the mean against {threshold} (a sign test where the values do not spread); rejected by "
        "the one-sided test above it",
        len(x),
        float(x.mean()) if len(x) else float("nan"),
        mean_interval(x.tolist(), seed),
        threshold,
        "less",
        (p_of("less"), p_of("greater")),
    )


def paired_greater(
    about: About,
    first_P: Sequence[float],
    second_P: Sequence[float],
    seed: int = 0,
    alternative: Literal["greater", "two-sided"] = "greater",
    unit: str = "problems",
) -> Claim:
    """'On the same problems `first` is larger than `second` on average' (or differs), by a paired permutation test,
    with the mean difference's bootstrap interval; one-sided, rejected by the test the other way."""
    a, b = np.asarray(first_P, dtype=float), np.asarray(second_P, dtype=float)
    d = a - b

    def p_of(side: Literal["greater", "less", "two-sided"]) -> float:
        if len(d) < 2 or float(np.abs(d).max()) == 0:  # no problem differs (or one problem): nothing to claim
            return 1.0
        return float(
            scipy_stats.permutation_test(
                (a, b),
                lambda x, y, axis: np.mean(x - y, axis=axis),
                permutation_type="samples",
                alternative=side,
                n_resamples=RESAMPLES,
                vectorized=True,
                rng=np.random.default_rng(seed),
            ).pvalue
        )

    one_sided = alternative == "greater"
    return tested(
        dataclasses.replace(about, baseline=0.0),
        f"paired permutation test over {unit} ({RESAMPLES:,} resamples, "
        f"{'one-sided' if one_sided else 'two-sided'}; at least 1 / {min(RESAMPLES + 1, 2 ** len(d)):,}: exact "
        "where the sign flips are fewer than the resamples)"
        + ("; rejected by the one-sided test the other way" if one_sided else ""),
        len(d),
        float(d.mean()) if len(d) else float("nan"),
        mean_interval(d.tolist(), seed),
        0.0,
        alternative,
        (p_of(alternative), p_of("less") if one_sided else None),
    )


def groups_greater(
    about: About,
    first: Sequence[float],
    second: Sequence[float],
    alternative: Literal["greater", "two-sided"] = "greater",
    unit: str = "runs",
    seed: int = 0,
) -> Claim:
    """'`first`'s independent units exceed `second`'s on average' (or differ): a permutation test over labels (its
    smallest p 1 / C(n1 + n2, n1)), with the difference's bootstrap interval; one-sided, rejected the other way."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)

    def p_of(side: Literal["greater", "less", "two-sided"]) -> float:
        if len(a) < 2 or len(b) < 2 or float(np.ptp(np.concatenate([a, b]))) == 0:
            return 1.0  # a variant of one run cannot be told from another
        return float(
            scipy_stats.permutation_test(
                (a, b),
                lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
                permutation_type="independent",
                alternative=side,
                n_resamples=RESAMPLES,
                vectorized=True,
                rng=np.random.default_rng(seed),
            ).pvalue
        )

    estimate = float(a.mean() - b.mean()) if len(a) and len(b) else float("nan")
    ci = [estimate, estimate]
    if len(a) >= 2 and len(b) >= 2 and float(np.ptp(np.concatenate([a, b]))) > 0:
        ci = percentile_interval((a, b), lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis), seed)
    one_sided = alternative == "greater"
    smallest = 1 / math.comb(len(a) + len(b), len(a)) if len(a) and len(b) else 1.0
    return tested(
        dataclasses.replace(about, baseline=0.0),
        f"permutation test of the difference of means over {unit} ({len(a)} and {len(b)}, independent; "
        f"{'one-sided' if one_sided else 'two-sided'}; exact where the splits are fewer than {RESAMPLES:,}; at least "
        f"{smallest:.3g})" + ("; rejected by the one-sided test the other way" if one_sided else ""),
        len(a) + len(b),
        estimate,
        ci,
        0.0,
        alternative,
        (p_of(alternative), p_of("less") if one_sided else None),
    )


def over_problems_and_draws(
    about: About, top_P: Sequence[float], random_DP: Sequence[Sequence[float]], top_lower: bool, seed: int = 0
) -> Claim:
    """'The top set's value per problem is lower (`top_lower`; else higher) than random draws'': a hierarchical
    bootstrap over draws, then problems (p = (1 + resamples at or below 0) / 10,000), rejected the other way."""
    t = np.asarray(top_P, dtype=float)
    y = np.asarray(random_DP, dtype=float).reshape(-1, len(t))
    sign = 1.0 if top_lower else -1.0
    d_obs = sign * (float(y.mean()) - float(t.mean())) if len(t) and len(y) else float("nan")
    p, against, ci = 1.0, 1.0, [d_obs, d_obs]
    if len(t) >= 2 and len(y) >= 2:
        rng = np.random.default_rng(seed)
        D, P = y.shape
        counts_BD = np.stack([np.bincount(r, minlength=D) for r in rng.integers(0, D, (RESAMPLES, D))])
        counts_BP = np.stack([np.bincount(r, minlength=P) for r in rng.integers(0, P, (RESAMPLES, P))])
        random_B = ((counts_BD @ y) * counts_BP).sum(1) / (D * P)
        stat_B = sign * (random_B - counts_BP @ t / P)
        p = float((1 + (stat_B <= 0).sum()) / (RESAMPLES + 1))
        against = float((1 + (stat_B >= 0).sum()) / (RESAMPLES + 1))
        ci = [float(np.percentile(stat_B, 2.5)), float(np.percentile(stat_B, 97.5))]
    return tested(
        dataclasses.replace(about, baseline=0.0),
        f"hierarchical bootstrap over the {len(y)} draws and then the {len(t)} problems ({RESAMPLES:,} resamples, "
        f"one-sided; at least 1 / {RESAMPLES + 1:,}) of the draws' mean minus the top set's; rejected by the "
        "resamples the other way",
        len(t),
        d_obs,
        ci,
        0.0,
        "greater",
        (p, against),
    )


def paired_differs(about: About, first_P: Sequence[bool], second_P: Sequence[bool]) -> Claim:
    """'On the same problems the two sides differ', by the exact McNemar test (two-sided); the estimate is the
    difference of the rates, with the bootstrap interval of the paired difference."""
    test = mcnemar_exact(list(first_P), list(second_P))
    n = len(first_P)
    diff = (sum(map(bool, first_P)) - sum(map(bool, second_P))) / n if n else float("nan")
    return tested(
        dataclasses.replace(about, baseline=0.0),
        "exact McNemar test (two-sided)",
        n,
        diff,
        mean_interval([float(x) - float(y) for x, y in zip(first_P, second_P, strict=True)]),
        0.0,
        "two-sided",
        (test["p_value"], None),
    )


def paired_more(about: About, first_P: Sequence[bool], second_P: Sequence[bool]) -> Claim:
    """'On the same problems `first` is right more often than `second`': exact one-sided McNemar, rejected the other
    way; the estimate the difference of rates with the paired difference's bootstrap interval."""
    only_first = sum(bool(x) and not y for x, y in zip(first_P, second_P, strict=True))
    only_second = sum(bool(y) and not x for x, y in zip(first_P, second_P, strict=True))
    m, n = only_first + only_second, len(first_P)
    p, q = (
        float(scipy_stats.binomtest(only_first, m, 0.5, alternative=a).pvalue) if m else 1.0
        for a in ("greater", "less")
    )
    return tested(
        dataclasses.replace(about, baseline=0.0),
        "exact McNemar test (one-sided: the binomial test on the discordant pairs); rejected by the test the other way",
        n,
        (only_first - only_second) / n if n else float("nan"),
        mean_interval([float(x) - float(y) for x, y in zip(first_P, second_P, strict=True)]),
        0.0,
        "greater",
        (p, q),
    )


def interval_above(
    about: About, estimate: float, ci: Sequence[float | None], other: float, other_ci: Sequence[float | None], n: int
) -> Claim:
    """'This estimate is above the other' by 95 % intervals: confirmed wholly above, rejected wholly below, else not
    confirmed with about the n at which this interval would clear the other (held fixed)."""
    low, high = (float("nan") if v is None else float(v) for v in ci)
    other_low, other_high = (float("nan") if v is None else float(v) for v in other_ci)
    outcome = CONFIRMED if low > other_high else REJECTED if high < other_low else NOT_CONFIRMED
    claim = interval_claim(
        dataclasses.replace(about, baseline=other),
        f"confirmed where its 95 % interval lies wholly above the other's ({other:.3f} [{other_low:.2f}, "
        f"{other_high:.2f}]), rejected where wholly below, otherwise not confirmed",
        n,
        estimate,
        [low, high],
        other,
        outcome,
    )
    gap = estimate - other_high if estimate > other else other_low - estimate
    half = (high - low) / 2
    if outcome == NOT_CONFIRMED and n and gap > 0 and half > 0:
        need = max(n + 1, math.ceil(n * (half / gap) ** 2))
        claim["n_to_decide"] = need if need <= MAX_N else None
    return claim


def prediction_interval(values: Sequence[float]) -> tuple[float, list[float]]:
    """The values' mean, and where one more draw falls: a 95 % t prediction interval."""
    mean = float(np.mean(values))
    spread = np.std(values, ddof=1) * (1 + 1 / len(values)) ** 0.5 * scipy_stats.t.ppf(0.975, len(values) - 1)
    return mean, [mean - float(spread), mean + float(spread)]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: controls the chance of any false claim in the family at the level used."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _adjusted(raw: list[float], method: Literal["holm", "bh"]) -> tuple[list[float], list[float]]:
    """The p's adjusted together, and what the adjustment asks of each: adjusted over raw (Holm's step-down or BH's
    step-up carried in), its own multiplier where the adjusted p is capped at 1."""
    if method == "holm":
        adj = holm(raw)
    else:
        adj = [float(p) for p in scipy_stats.false_discovery_control(raw, method="bh")] if raw else []
    m = len(raw)
    rank = [sum(q < raw[j] for q in raw) for j in range(m)]  # 0: the smallest p; tied p share their rank
    own = [m - rank[j] if method == "holm" else m / (rank[j] + 1) for j in range(m)]  # each p's own multiplier
    return adj, [adj[j] / raw[j] if raw[j] > 0 and adj[j] < 1 else own[j] for j in range(m)]


def adjust(claims: list[Claim], family: str, method: Literal["holm", "bh"] = "holm") -> list[Claim]:
    """One result's tested claims adjusted together (Holm, or Benjamini-Hochberg), opposite tests' p's apart, each
    decided again; claims without a test pass through."""
    tested_at = [i for i, c in enumerate(claims) if c["p_value"] is not None]
    against_at = [i for i in tested_at if claims[i]["p_against"] is not None]
    adj, times = _adjusted([float(claims[i]["p_value"] or 0.0) for i in tested_at], method)
    adj_against, times_against = _adjusted([float(claims[i]["p_against"] or 0.0) for i in against_at], method)
    against = dict(zip(against_at, zip(adj_against, times_against, strict=True), strict=True))
    name = f"{family}: {len(tested_at)} tests, {'Holm' if method == 'holm' else 'Benjamini-Hochberg'}"
    out = list(claims)
    for i, p, t in zip(tested_at, adj, times, strict=True):
        q, t_against = against.get(i, (None, 1.0))
        fields = {"p_adjusted": p, "p_against_adjusted": q, "family": name}
        out[i] = decided(Claim(**{**claims[i], **fields}), t, t_against)
    return out


def confirmed(claims: list[Claim], kind: str) -> list[str]:
    """The subjects of the claims of one kind that are confirmed."""
    return [c["subject"] or "" for c in claims if c["kind"] == kind and c["outcome"] == CONFIRMED]


def interval_text(claim: Claim) -> str:
    return f"{with_ci(claim['estimate'], claim['ci'])}, n {claim['n']}"


def n_to_decide_text(claim: Mapping[str, Any]) -> str:
    """A table's "n to decide" cell: the n for a claim not confirmed, or that no n decides it at this estimate;
    empty for a decided claim."""
    if claim["outcome"] != NOT_CONFIRMED:
        return ""
    need = claim.get("n_to_decide")
    return f"{need:,}" if need else "none at this estimate"


def outcome_text(claim: Claim) -> str:
    """The claim's outcome in words with its numbers: the one way a verdict is written."""
    tail = [interval_text(claim)]
    if claim["baseline"] is not None:
        tail.append(f"baseline {claim['baseline']:.3f}")
    against = claim["outcome"] == REJECTED and claim["p_against"] is not None  # decided by the opposite test
    raw, adj = (claim["p_against"], claim["p_against_adjusted"]) if against else (claim["p_value"], claim["p_adjusted"])
    if raw is not None:
        word = "p against" if against else "p"
        tail.append(f"{word} {raw:.2g}" + (f", adjusted {adj:.2g}" if claim["family"] and adj is not None else ""))
    low, high = claim["ci"]
    decisive = high if claim["outcome"] == REJECTED else low if claim["outcome"] == CONFIRMED else None
    if claim["p_value"] is None and decisive is not None:  # a rule on the interval: its deciding end, unrounded
        tail.append(f"{'upper' if claim['outcome'] == REJECTED else 'lower'} end {decisive:.4f}")
    text = f"{claim['outcome']}: {claim['statement']} ({'; '.join(tail)})"
    if claim["outcome"] == NOT_CONFIRMED:
        n = claim["n_to_decide"]
        text += f"; at this estimate about n {n:,} would decide it" if n else "; no n decides it at this estimate"
    return text
