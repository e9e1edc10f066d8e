"""Intervals, baselines and paired tests: the numbers every rate af1 reports carries."""

from __future__ import annotations

import math

import pytest
from scipy.stats import binom

from af1.stats import (
    baseline_warning,
    constant_baseline,
    exact_interval,
    mcnemar_exact,
    mean_std,
    rate,
    split_indices,
)


def test_exact_interval_known_values():
    """Clopper-Pearson: the ends where each one-sided exact binomial test reaches 2.5 %."""
    low, high = exact_interval(28, 35)  # SmolLM2's old best cell: 0.800
    assert (round(low, 4), round(high, 4)) == (0.6306, 0.9156)
    assert binom.sf(27, 35, low) == pytest.approx(0.025) and binom.cdf(28, 35, high) == pytest.approx(0.025)
    assert exact_interval(0, 10)[0] == 0.0 and exact_interval(10, 10)[1] == 1.0
    assert exact_interval(36, 36)[0] == pytest.approx(0.025 ** (1 / 36))  # 0.9026: all right on 36 clears 0.9
    assert all(math.isnan(x) for x in exact_interval(0, 0))


def test_constant_baseline_and_rate():
    assert constant_baseline(["1", "1", "1", "2"]) == 0.75
    r = rate([True, False, True, True], ["a", "b", "a", "c"])
    assert (r["value"], r["k"], r["n"], r["baseline"], r["near_constant"]) == (0.75, 3, 4, 0.5, True)
    assert r["ci"] == list(exact_interval(3, 4))
    # two token layouts, each answered by its own constant guess: 3 of 4 and 2 of 2, not the 3 of 6 of one guess
    targets, layouts = ["1", "1", "1", "2", "2", "2"], ["a", "a", "a", "a", "b", "b"]
    assert constant_baseline(targets) == 0.5 and constant_baseline(targets, layouts) == 5 / 6
    assert rate([True] * 6, targets, layouts)["baseline"] == 5 / 6 and constant_baseline(targets, [0] * 6) == 0.5
    assert baseline_warning("x", 0.49, 10) is None and "near constant" in str(baseline_warning("x", 0.5, 10))
    with pytest.raises(ValueError):
        rate([True], ["a", "b"])


def test_mcnemar_exact_two_sided():
    a = [True] * 10 + [False] * 5
    b = [False] * 10 + [False] * 5  # 10 discordant pairs, all one way: p = 2 / 2**10
    assert mcnemar_exact(a, b)["p_value"] == pytest.approx(2 / 1024)
    assert mcnemar_exact(a, a)["p_value"] == 1.0
    c = [True, False, True, False]
    d = [False, True, False, True]  # 2 each way: p = 1
    assert mcnemar_exact(c, d) == {"only_first": 2, "only_second": 2, "p_value": 1.0}


def test_split_is_seeded_disjoint_and_complete():
    sel, conf = split_indices(11, 0.5, seed=3)
    assert sorted(sel + conf) == list(range(11)) and not set(sel) & set(conf) and len(sel) == 6
    assert split_indices(11, 0.5, seed=3) == (sel, conf) and split_indices(11, 0.5, seed=4) != (sel, conf)
    assert mean_std([1.0, 3.0]) == {"mean": 2.0, "std": pytest.approx(math.sqrt(2)), "n": 2}
