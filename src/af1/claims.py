"""Claims as data: each verdict af1 prints is a `Claim`, decided by a rule stated before the data on problems that
did not choose what it is about, with its n, estimate, 95 % interval, raw and family-adjusted p, and one of three
outcomes. Every sentence that decides something reads its outcome from here (`outcome_text`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, with_config
from scipy import stats as scipy_stats
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.stats import Z95, mcnemar_exact, wilson, with_ci

ALPHA = 0.05
Outcome = Literal["confirmed", "not confirmed", "rejected"]
Alternative = Literal["greater", "less", "two-sided"]
CONFIRMED: Outcome = "confirmed"
NOT_CONFIRMED: Outcome = "not confirmed"
REJECTED: Outcome = "rejected"
MAX_N = 100_000  # beyond this an observed rate that sits on its threshold is called undecidable
RATE_TEST = "one-sided exact binomial test of the rate against"  # how `_rate_tested` claims' rules begin


@with_config(ConfigDict(extra="forbid"))
class Claim(TypedDict):
    """One claim and how it was decided: what it says, the rule (stated before the data), where it was measured,
    n, the estimate with its 95 % interval and the baseline it is read against, the test's raw p and the p adjusted
    over its family (None where no test is involved), the outcome, and for a claim not confirmed the n at which
    the observed estimate would decide it (None where it cannot: it sits on the line, or points where no rule of
    the claim's decides)."""

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
    alternative: Alternative | None  # the test's direction; None: a rule on intervals alone
    alpha: float | None  # the level the adjusted p must be below (one-sided: ALPHA / 2, as the 95 % interval)
    family: str | None
    outcome: Outcome
    n_to_decide: int | None


def n_to_decide_rate(rate: float, threshold: float, z: float = Z95) -> int | None:
    """The smallest n at which a Wilson interval (95 %, or at `z`) around the observed `rate` (held fixed) excludes
    `threshold`, the score test's answer: the interval only narrows as n grows, so every larger n decides too (None:
    the rate is the threshold, or no n up to MAX_N does)."""
    if not math.isfinite(rate) or rate == threshold:
        return None

    def decides(n: int) -> bool:
        low, high = wilson(rate * n, n, z)
        return low >= threshold or high < threshold

    if not decides(MAX_N):
        return None
    below, above = 0, MAX_N  # bisection: never decided at `below`, decided at `above`
    while above - below > 1:
        middle = (below + above) // 2
        below, above = (below, middle) if decides(middle) else (middle, above)
    return above


def rate_reaches(
    kind: str,
    statement: str,
    correct: Sequence[bool],
    threshold: float,
    measured_on: str,
    baseline: float | None,
    subject: str | None = None,
) -> Claim:
    """'The rate is at least `threshold`', decided by the 95 % Wilson interval of `correct`: confirmed where its
    lower end is at or above the threshold, rejected where its upper end is below, otherwise not confirmed."""
    _, n, value, (low, high) = _counted(correct)
    outcome = CONFIRMED if n and low >= threshold else REJECTED if n and high < threshold else NOT_CONFIRMED
    claim = interval_claim(
        kind,
        statement,
        f"confirmed where the 95 % Wilson interval's lower end is >= {threshold}, rejected where its upper end is "
        "below it, otherwise not confirmed",
        measured_on,
        n,
        value,
        [low, high],
        baseline,
        threshold,
        outcome,
        subject,
    )
    claim["n_to_decide"] = n_to_decide_rate(value, threshold) if outcome == NOT_CONFIRMED else None
    return claim


def rate_below(
    kind: str,
    statement: str,
    correct: Sequence[bool],
    threshold: float,
    measured_on: str,
    baseline: float | None,
    subject: str | None = None,
) -> Claim:
    """'The rate is below `threshold`', decided by a one-sided exact binomial test (scipy's binomtest) against the
    threshold, adjusted with its family (`adjust`); rejected where the 95 % Wilson interval lies wholly at or above
    the threshold."""
    return _rate_tested(kind, statement, correct, threshold, measured_on, baseline, subject, "less")


def rate_above(
    kind: str,
    statement: str,
    correct: Sequence[bool],
    threshold: float,
    measured_on: str,
    baseline: float | None,
    subject: str | None = None,
) -> Claim:
    """'The rate is at least `threshold`' as one test of a family: a one-sided exact binomial test (scipy's
    binomtest) against the threshold, adjusted with its family (`adjust`); rejected where the 95 % Wilson interval's
    upper end is below the threshold (as `rate_reaches`)."""
    return _rate_tested(kind, statement, correct, threshold, measured_on, baseline, subject, "greater")


def _rate_tested(
    kind: str,
    statement: str,
    correct: Sequence[bool],
    threshold: float,
    measured_on: str,
    baseline: float | None,
    subject: str | None,
    alternative: Literal["less", "greater"],
) -> Claim:
    """A rate against a threshold by a one-sided exact binomial test, rejected where its Wilson interval lies wholly
    on the other side of the threshold."""
    k, n, value, ci = _counted(correct)
    p = float(scipy_stats.binomtest(k, n, threshold, alternative=alternative).pvalue) if n else 1.0
    rule = f"{RATE_TEST} {threshold}; rejected where the 95 % Wilson " + (
        "interval's upper end is below it" if alternative == "greater" else "interval's lower end is at or above it"
    )
    claim = tested(kind, statement, rule, measured_on, n, value, ci, p, alternative, threshold, baseline, subject)
    against = ci[1] < threshold if alternative == "greater" else ci[0] >= threshold
    if n and against:
        return Claim(**{**claim, "outcome": REJECTED, "n_to_decide": None})
    if claim["outcome"] == NOT_CONFIRMED and not _towards(claim):  # only the interval can reject it
        claim["n_to_decide"] = n_to_decide_rate(value, threshold)
    return claim


def _counted(correct: Sequence[bool]) -> tuple[int, int, float, list[float]]:
    """Right answers, n, the rate (NaN for none) and its 95 % Wilson interval."""
    k, n = sum(bool(c) for c in correct), len(correct)
    return k, n, k / n if n else float("nan"), list(wilson(k, n))


def interval_claim(
    kind: str,
    statement: str,
    rule: str,
    measured_on: str,
    n: int,
    estimate: float,
    ci: Sequence[float],
    baseline: float | None,
    null: float,
    outcome: Outcome,
    subject: str | None = None,
) -> Claim:
    """A claim decided by a rule on intervals alone: no test, no family (its n to decide is the caller's)."""
    return Claim(
        kind=kind,
        subject=subject,
        statement=statement,
        rule=rule,
        measured_on=measured_on,
        n=n,
        estimate=estimate,
        ci=list(ci),
        baseline=baseline,
        null=null,
        p_value=None,
        p_adjusted=None,
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
    kind: str,
    statement: str,
    rule: str,
    measured_on: str,
    n: int,
    estimate: float,
    ci: Sequence[float],
    p_value: float,
    alternative: Alternative,
    null: float,
    baseline: float | None = None,
    subject: str | None = None,
) -> Claim:
    """A claim decided by a test against `null`: confirmed where its p (adjusted over its family, once `adjust` has
    run) is below ALPHA (one-sided: ALPHA / 2, the level its 95 % interval shows), otherwise not confirmed, with
    about the n at which the observed effect would reach it."""
    alpha = ALPHA if alternative == "two-sided" else ALPHA / 2
    rule = f"{rule}, p adjusted over its family below {alpha}"
    claim = interval_claim(kind, statement, rule, measured_on, n, estimate, ci, baseline, null, NOT_CONFIRMED, subject)
    test = {"p_value": p_value, "p_adjusted": p_value, "alternative": alternative, "alpha": alpha}
    return decided(Claim(**{**claim, **test}))


def decided(claim: Claim, times: float = 1.0) -> Claim:
    """The outcome of a tested claim from its adjusted p; where not confirmed, the n the observed effect needs at the
    level its family asks (ALPHA over `times`, the multiplier the adjustment puts on its p). An effect pointing away
    from the claim no test can confirm: the n its maker set (its rejection rule's) stays."""
    p = claim["p_adjusted"]
    confirmed = p is not None and p < (claim["alpha"] or ALPHA)
    out = Claim(**{**claim, "outcome": CONFIRMED if confirmed else NOT_CONFIRMED, "n_to_decide": None})
    if not confirmed:
        out["n_to_decide"] = n_for_effect(claim, times) if _towards(claim) else claim["n_to_decide"]
    return out


def _towards(claim: Claim) -> bool:
    """Whether the estimate lies on the claim's side of its null (a two-sided claim: off it)."""
    estimate, null = claim["estimate"], claim["null"]
    if estimate is None or null is None or not math.isfinite(estimate) or not math.isfinite(null) or estimate == null:
        return False
    return claim["alternative"] in ("two-sided", None) or (estimate > null) == (claim["alternative"] == "greater")


def n_for_effect(claim: Claim, times: float = 1.0) -> int | None:
    """About the n at which an effect of the observed size, against its null, would reach the level ALPHA / `times`
    (its family's multiplier): for a rate, where the score test at that level decides (its spread is the null's);
    otherwise where the effect's interval would clear the null."""
    level = (claim["alpha"] or ALPHA) / times
    z = float(scipy_stats.norm.isf(level / 2 if claim["alternative"] == "two-sided" else level))
    if claim["rule"].startswith(RATE_TEST) and claim["estimate"] is not None and claim["null"] is not None:
        return n_to_decide_rate(claim["estimate"], claim["null"], z)
    return n_to_part(claim, z)


def n_to_part(claim: Claim, z: float = Z95) -> int | None:
    """About the n at which the claim's interval, its half-width shrinking as 1/sqrt(n), would lie `z` standard
    errors clear of its null; None where the estimate sits on the null, or no n up to MAX_N would. Values that do not
    spread all point one way: the sign test's p, 0.5 ** n one-sided, reaches the level that `z` stands for at
    n = log2(1 / level)."""
    low, high = (math.nan if v is None else v for v in claim["ci"])
    estimate, null = claim["estimate"], claim["null"]
    distance = math.nan if estimate is None or null is None else abs(estimate - null)
    se = (high - low) / 2 / Z95
    if not all(map(math.isfinite, (se, distance))) or distance == 0 or claim["n"] == 0:
        return None
    if se == 0:
        return max(claim["n"] + 1, math.ceil(-math.log2(float(scipy_stats.norm.sf(z)))))
    need = max(claim["n"] + 1, math.ceil(claim["n"] * (z * se / distance) ** 2))
    return need if need <= MAX_N else None


RESAMPLES = 9999  # permutation tests: the smallest p is 1 / 10,000
BOOTSTRAP = 2000


def mean_interval(values: Sequence[float], seed: int = 0) -> list[float]:
    """95 % percentile-bootstrap interval of the mean over problems (the interval every per-problem effect gets)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2 or float(x.std()) == 0.0:
        mean = float(x.mean()) if len(x) else float("nan")
        return [mean, mean]
    ci = scipy_stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=0.95,
        n_resamples=BOOTSTRAP,
        method="percentile",
        rng=np.random.default_rng(seed),
    ).confidence_interval
    return [float(ci.low), float(ci.high)]


def mean_below(
    kind: str,
    statement: str,
    values: Sequence[float],
    threshold: float,
    measured_on: str,
    subject: str | None = None,
    seed: int = 0,
) -> Claim:
    """'The mean over problems is below `threshold`', by a one-sided one-sample t test (p), with the mean's
    bootstrap interval; decided by its family's adjusted p (`adjust`), rejected where the interval lies wholly at or
    above the threshold."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) >= 2 and float(x.std()) > 0:
        test: Any = scipy_stats.ttest_1samp(x, threshold, alternative="less")  # a TtestResult, untyped in scipy
        p = float(test.pvalue)
    elif len(x) >= 2 and float(x.max()) < threshold:  # no spread, every value below: a sign test
        p = 0.5 ** len(x)
    else:  # one problem, or none below: nothing to claim
        p = 1.0
    claim = tested(
        kind,
        statement,
        f"one-sided t test of the mean against {threshold} (a sign test where the values do not spread); rejected "
        "where the bootstrap interval lies at or above it",
        measured_on,
        len(x),
        float(x.mean()) if len(x) else float("nan"),
        mean_interval(x.tolist(), seed),
        p,
        "less",
        threshold,
        baseline=threshold,
        subject=subject,
    )
    low = claim["ci"][0]
    if low is not None and low >= threshold:
        return Claim(**{**claim, "outcome": REJECTED, "n_to_decide": None})
    if claim["outcome"] == NOT_CONFIRMED and not _towards(claim):  # only the interval can reject it
        claim["n_to_decide"] = n_to_part(claim)
    return claim


def paired_greater(
    kind: str,
    statement: str,
    first_P: Sequence[float],
    second_P: Sequence[float],
    measured_on: str,
    subject: str | None = None,
    seed: int = 0,
    alternative: Literal["greater", "two-sided"] = "greater",
    unit: str = "problems",
) -> Claim:
    """'On the same problems, `first` is larger than `second` on average' (or, two-sided, 'differs from'), by a
    paired permutation test (the two values of a problem swapped at random), with the bootstrap interval of the
    mean difference."""
    a, b = np.asarray(first_P, dtype=float), np.asarray(second_P, dtype=float)
    d = a - b
    if len(d) >= 2 and float(np.abs(d).max()) > 0:
        p = float(
            scipy_stats.permutation_test(
                (a, b),
                lambda x, y, axis: np.mean(x - y, axis=axis),
                permutation_type="samples",
                alternative=alternative,
                n_resamples=RESAMPLES,
                vectorized=True,
                rng=np.random.default_rng(seed),
            ).pvalue
        )
    else:  # no problem differs (or one problem): nothing to claim
        p = 1.0
    one_sided = alternative == "greater"
    claim = tested(
        kind,
        statement,
        f"paired permutation test over {unit} ({RESAMPLES:,} resamples, "
        f"{'one-sided' if one_sided else 'two-sided'}; at least 1 / {RESAMPLES + 1:,})"
        + ("; rejected where the bootstrap interval lies wholly below 0" if one_sided else ""),
        measured_on,
        len(d),
        float(d.mean()) if len(d) else float("nan"),
        mean_interval(d.tolist(), seed),
        p,
        alternative,
        0.0,
        baseline=0.0,
        subject=subject,
    )
    high = claim["ci"][1]
    if one_sided and high is not None and high < 0:
        return Claim(**{**claim, "outcome": REJECTED, "n_to_decide": None})
    if one_sided and claim["outcome"] == NOT_CONFIRMED and not _towards(claim):  # only the interval can reject it
        claim["n_to_decide"] = n_to_part(claim)
    return claim


def paired_differs(
    kind: str,
    statement: str,
    first_P: Sequence[bool],
    second_P: Sequence[bool],
    measured_on: str,
    subject: str | None = None,
) -> Claim:
    """'On the same problems the two sides differ', by the exact McNemar test (two-sided); the estimate is the
    difference of the rates, with the bootstrap interval of the paired difference."""
    test = mcnemar_exact(list(first_P), list(second_P))
    n = len(first_P)
    diff = (sum(map(bool, first_P)) - sum(map(bool, second_P))) / n if n else float("nan")
    return tested(
        kind,
        statement,
        "exact McNemar test (two-sided)",
        measured_on,
        n,
        diff,
        mean_interval([float(x) - float(y) for x, y in zip(first_P, second_P, strict=True)]),
        test["p_value"],
        "two-sided",
        0.0,
        baseline=0.0,
        subject=subject,
    )


def interval_above(
    kind: str,
    statement: str,
    estimate: float,
    ci: Sequence[float | None],
    other: float,
    other_ci: Sequence[float | None],
    measured_on: str,
    n: int,
) -> Claim:
    """'This estimate is above the other', decided by their 95 % intervals: confirmed where this one's lies wholly
    above the other's, rejected where it lies wholly below, otherwise not confirmed, with about the n at which this
    one's interval, shrinking as 1/sqrt(n), would clear the other's (held fixed: where one random model falls does
    not narrow with this claim's n); none where the estimate lies inside the other interval."""
    low, high = (float("nan") if v is None else float(v) for v in ci)
    other_low, other_high = (float("nan") if v is None else float(v) for v in other_ci)
    outcome = CONFIRMED if low > other_high else REJECTED if high < other_low else NOT_CONFIRMED
    claim = interval_claim(
        kind,
        statement,
        f"confirmed where its 95 % interval lies wholly above the other's ({other:.3f} [{other_low:.2f}, "
        f"{other_high:.2f}]), rejected where wholly below, otherwise not confirmed",
        measured_on,
        n,
        estimate,
        [low, high],
        other,
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


def adjust(claims: list[Claim], family: str, method: Literal["holm", "bh"] = "holm") -> list[Claim]:
    """The tested claims of one result adjusted together (Holm; Benjamini-Hochberg where `method` says so), each
    decided again by its adjusted p; claims without a test pass through unchanged."""
    tested_at = [i for i, c in enumerate(claims) if c["p_value"] is not None]
    raw = [float(claims[i]["p_value"] or 0.0) for i in tested_at]
    if method == "holm":
        adj = holm(raw)
    else:
        adj = [float(p) for p in scipy_stats.false_discovery_control(raw, method="bh")] if raw else []
    m = len(raw)
    rank = [sum(q < raw[j] for q in raw) for j in range(m)]  # 0: the smallest p; tied p share their rank
    own = [m - rank[j] if method == "holm" else m / (rank[j] + 1) for j in range(m)]  # each p's own multiplier
    # what the adjustment asks of each p: adjusted over raw (Holm's step-down or BH's step-up carried in), its own
    # multiplier where the adjusted p is capped at 1
    times = [adj[j] / raw[j] if raw[j] > 0 and adj[j] < 1 else own[j] for j in range(m)]
    name = f"{family}: {m} tests, {'Holm' if method == 'holm' else 'Benjamini-Hochberg'}"
    out = list(claims)
    for j, (i, p) in enumerate(zip(tested_at, adj, strict=True)):
        again = decided(Claim(**{**claims[i], "p_adjusted": p, "family": name}), times[j])
        rejected = claims[i]["outcome"] == REJECTED  # rejection reads the interval alone, which adjusting leaves
        out[i] = Claim(**{**again, "outcome": REJECTED, "n_to_decide": None}) if rejected else again
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
    if claim["p_value"] is not None:
        adj = claim["p_adjusted"]
        tail.append(
            f"p {claim['p_value']:.2g}" + (f", adjusted {adj:.2g}" if claim["family"] and adj is not None else "")
        )
    low, high = claim["ci"]
    decisive = high if claim["outcome"] == REJECTED else low if claim["outcome"] == CONFIRMED else None
    if claim["p_value"] is None and decisive is not None:  # a rule on the interval: its deciding end, unrounded
        tail.append(f"{'upper' if claim['outcome'] == REJECTED else 'lower'} end {decisive:.4f}")
    text = f"{claim['outcome']}: {claim['statement']} ({'; '.join(tail)})"
    if claim["outcome"] == NOT_CONFIRMED:
        n = claim["n_to_decide"]
        text += f"; at this estimate about n {n:,} would decide it" if n else "; no n decides it at this estimate"
    return text
