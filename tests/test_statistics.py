"""The statistics of measurements (cpbench.model.calibrate.stats) and intervals and ties
(cpbench.model.ties): the median's interval, ties, changes, overlap and the prediction's
interval, on synthetic timings."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from cpbench.errors import CpbenchError
from cpbench.model.calibrate.stats import overlap_estimate, precise_enough
from cpbench.model.ties import (
    ORDER_STATISTICS,
    PRIOR_RELATIVE_ERROR,
    SAMPLE_RANGE,
    Interval,
    compare_intervals,
    median_interval,
    median_rank_bounds,
    prediction_interval,
    rank_with_ties,
    ratio_tied,
    relative_sigma,
)

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)


@pytest.mark.parametrize("n", [6, 10, 20, 50, 101, 1000])
def test_rank_bounds_cover_at_least_95_percent_and_are_the_tightest(n: int) -> None:
    j, k = median_rank_bounds(n)  # type: ignore[misc]
    coverage = 1 - 2 * binom.cdf(j - 1, n, 0.5)
    assert coverage >= 0.95
    tighter = 1 - 2 * binom.cdf(j, n, 0.5)  # one rank further in on each side
    assert tighter < 0.95
    assert k == n + 1 - j


def test_too_few_samples_give_the_range_and_never_meet_a_target() -> None:
    assert median_rank_bounds(5) is None
    iv = median_interval([3.0, 1.0, 2.0])
    assert (iv.low, iv.median, iv.high, iv.method) == (1.0, 2.0, 3.0, SAMPLE_RANGE)
    assert not precise_enough([1.0] * 5, 0.5)
    assert precise_enough([1.0] * 6, 0.01)


def test_interval_covers_the_true_median_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(0)
    hits = 0
    trials = 2000
    for _ in range(trials):
        samples = rng.lognormal(0.0, 0.3, size=15)  # true median exp(0) = 1
        iv = median_interval(list(samples))
        hits += iv.low <= 1.0 <= iv.high
    assert iv.method == ORDER_STATISTICS
    assert 0.95 <= hits / trials <= 0.995  # n = 15: exact coverage 96.5%


def test_a_tie_is_declared_and_a_clear_winner_named() -> None:
    rng = np.random.default_rng(1)
    a = list(1.00 + 0.05 * rng.standard_normal(30))
    b = list(1.01 + 0.05 * rng.standard_normal(30))  # 1% apart, 5% noise: a tie
    c = list(1.50 + 0.05 * rng.standard_normal(30))  # 50% slower: clearly behind
    tie = rank_with_ties({"a": median_interval(a), "b": median_interval(b), "c": median_interval(c)})
    assert not tie.clear and set(tie.tied) == {"a", "b"} and tie.verdict == "tie (2)"
    assert tie.order[-1] == "c"
    fast = list(0.70 + 0.02 * rng.standard_normal(30))
    clear = rank_with_ties({"a": median_interval(a), "fast": median_interval(fast)})
    assert clear.clear and clear.leader == "fast" and clear.tied == ("fast",)
    assert clear.verdict == "best"


def test_an_interleaved_remeasurement_settles_a_tie() -> None:
    first = {"a": Interval(1.0, 0.9, 1.1, 20, ""), "b": Interval(1.02, 0.92, 1.12, 20, "")}
    tiebreak = {"a": Interval(1.05, 1.04, 1.06, 20, ""), "b": Interval(0.99, 0.98, 1.0, 20, "")}
    ranked = rank_with_ties(first, tiebreak)
    assert ranked.clear and ranked.leader == "b"
    assert ranked.resolved_by == "interleaved re-measurement"
    partial = rank_with_ties(first, {"a": tiebreak["a"]})  # not every tied leader: no decision
    assert not partial.clear and partial.resolved_by is None


def test_compare_verdicts() -> None:
    before = Interval(1.0, 0.98, 1.02, 20, "")
    slower = compare_intervals(before, Interval(1.2, 1.18, 1.22, 20, ""))
    assert slower.verdict == "slower" and slower.low == pytest.approx(1.18 / 1.02)
    assert slower.regression(0.05) and not slower.regression(0.25)
    faster = compare_intervals(before, Interval(0.8, 0.79, 0.81, 20, ""))
    assert faster.verdict == "faster" and faster.percent == pytest.approx(-20.0)
    same = compare_intervals(before, Interval(1.01, 0.97, 1.05, 20, ""))
    assert same.verdict == "no significant change" and not same.regression(0.0)


def test_overlap_not_measurable_when_communication_is_within_the_noise() -> None:
    step = Interval(1.00, 0.90, 1.10, 20, "")
    compute = Interval(0.98, 0.90, 1.06, 20, "")
    tiny_comm = Interval(0.02, 0.019, 0.021, 20, "")  # 20 ms < the 100 ms half-width
    hidden = overlap_estimate(step, compute, tiny_comm)
    assert hidden.status == "not measurable" and hidden.value is None
    comm = Interval(0.50, 0.49, 0.51, 20, "")
    tight_step = Interval(1.20, 1.19, 1.21, 20, "")
    tight_compute = Interval(1.00, 0.99, 1.01, 20, "")
    measured = overlap_estimate(tight_step, tight_compute, comm)
    assert measured.status == "measured"
    assert measured.value == pytest.approx((1.0 + 0.5 - 1.2) / 0.5)
    assert measured.low is not None and measured.high is not None
    assert measured.low <= measured.value <= measured.high <= 1.0
    ulysses = overlap_estimate(tight_step, tight_compute, comm, hideable=0.0, scheme="ulysses")
    assert ulysses.status == "none by construction" and ulysses.value == 0.0
    assert "ulysses" in ulysses.note
    # Never above what the scheme can hide, even when the raw figure says more.
    capped = overlap_estimate(Interval(1.0, 0.99, 1.01, 20, ""), tight_compute, comm, hideable=0.3)
    assert capped.value == pytest.approx(0.3) and capped.high == pytest.approx(0.3)


def test_prediction_interval_and_ratio_ties() -> None:
    sigma, source = relative_sigma(None)
    assert sigma == PRIOR_RELATIVE_ERROR and "uncalibrated prior" in source
    cal, _ = relative_sigma(0.10, 12)
    assert cal == pytest.approx(0.10 * math.sqrt(12 / 10), rel=1e-12)
    a = prediction_interval(1.0, 0.1)
    assert (a.low_s, a.high_s) == pytest.approx((math.exp(-0.1), math.exp(0.1)))
    assert ratio_tied(1.0, 1.05, 0.1) and not ratio_tied(1.0, 1.2, 0.1)
    assert ratio_tied(1.05, 1.0, 0.1) and not ratio_tied(1.2, 1.0, 0.1)  # a ratio either way
    assert ratio_tied(0.0, 0.0, 0.1) and not ratio_tied(0.0, 1.0, 0.1)
    with pytest.raises(CpbenchError, match="sigma >= 0"):
        prediction_interval(1.0, -0.1)
