"""Intervals and ties: a measured median's 95% interval (order statistics) and a prediction's
(lognormal sigma), two genuinely different things kept side by side, and the tie tests on
each. Pure numpy; the rules in words: docs/cost-model.md section 1."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from cpbench.errors import CpbenchError

# ------------------------- measured: a median's distribution-free interval; ties overlap

CONFIDENCE = 0.95
"""Confidence level of every interval cpbench records and compares."""

TIE_RULE = (
    "tie: the two medians' 95% confidence intervals overlap (distribution-free order-statistic "
    "intervals of each median, over per-iteration max-over-ranks step times)"
)
"""How a tie is decided, in words (tables and reports print it)."""


@dataclass(frozen=True)
class Interval:
    """A median with its confidence interval (seconds, or any one unit)."""

    median: float
    """The sample median."""
    low: float
    """Lower end of the interval."""
    high: float
    """Upper end of the interval."""
    n: int
    """Samples it came from."""
    method: str
    """How the interval was obtained (order statistics, or the sample range when too few
    samples give no 95% interval)."""

    @property
    def relative_width(self) -> float:
        """(high - low) / median: the precision a target is checked against (inf at median 0)."""
        return (self.high - self.low) / self.median if self.median > 0 else math.inf

    def overlaps(self, other: Interval) -> bool:
        """The two intervals share a point (then neither median is known to be smaller)."""
        return self.low <= other.high and other.low <= self.high


ORDER_STATISTICS = "order statistics (binomial, distribution-free)"
SAMPLE_RANGE = "sample range (too few samples for a 95% interval)"


@functools.lru_cache(maxsize=1024)
def median_rank_bounds(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (j, n + 1 - j) of the sorted samples bounding the median with at least
    `confidence` coverage: P(j <= B < n + 1 - j) for B ~ Binomial(n, 1/2), the largest such j;
    None when even (1, n) covers less (n < 6 at 95%).

    Exact: the coverage 1 - 2 P(B <= j - 1) in integers (2^n P(B <= k) is a sum of binomial
    coefficients), so a rank needs no scipy (its import costs a rank most of a second)."""
    if n < 1:
        return None
    miss = (1 - Fraction(confidence)) * (1 << n)  # 2^n (1 - confidence)
    j, below, coefficient = 0, 0, 1  # below = 2^n P(B <= j - 1); coefficient = C(n, j)
    while j + 1 <= (n + 1) // 2 and 2 * (below + coefficient) <= miss:
        below += coefficient
        coefficient = coefficient * (n - j) // (j + 1)
        j += 1
    if j < 1:
        return None
    return j, n + 1 - j


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The median of `samples` and its distribution-free confidence interval (order statistics,
    `median_rank_bounds`); with too few samples for one, the sample range (min, max), said in
    `method`. Raises on no samples."""
    if not samples:
        raise CpbenchError("median_interval needs at least one sample, got none")
    ordered = sorted(float(s) for s in samples)
    n = len(ordered)
    median = float(np.median(ordered))
    bounds = median_rank_bounds(n, confidence)
    if bounds is None:
        return Interval(median, ordered[0], ordered[-1], n, SAMPLE_RANGE)
    j, k = bounds
    return Interval(median, ordered[j - 1], ordered[k - 1], n, ORDER_STATISTICS)


def recorded_interval(
    median: float, low: float | None, high: float | None, n: int, method: str,
    samples: Sequence[float] = (),
) -> Interval:
    """A recorded median's interval: `low`/`high` as recorded, else (version 1 records) from
    the samples, else the median as a point."""
    if low is not None and high is not None:
        return Interval(median, float(low), float(high), int(n), method)
    if samples:
        found = median_interval(samples)
        return Interval(median, found.low, found.high, found.n, found.method)
    return Interval(median, median, median, 0, "no samples (a point)")


@dataclass(frozen=True)
class Ranked:
    """Candidates of one group ranked by median, the leader's ties called as such."""

    order: tuple[str, ...]
    """Names by median, fastest first."""
    leader: str
    """The fastest median."""
    tied: tuple[str, ...]
    """The leader and every candidate whose interval overlaps the leader's, by median."""
    resolved_by: str | None = None
    """None, or how the tie among the leaders was settled (an interleaved re-measurement)."""

    @property
    def clear(self) -> bool:
        """One candidate is faster than every other beyond the noise."""
        return len(self.tied) == 1

    @property
    def verdict(self) -> str:
        """How a table marks the tied leaders: 'best' (a clear winner) or 'tie (n)'."""
        return "best" if self.clear else f"tie ({len(self.tied)})"


def rank_with_ties(
    candidates: Mapping[str, Interval], tiebreak: Mapping[str, Interval] | None = None
) -> Ranked:
    """Rank named intervals by median; the leader is tied with every candidate whose interval
    overlaps its own (`Interval.overlaps`). `tiebreak`: intervals of an interleaved
    re-measurement of (some of) the tied leaders; when it covers every tied leader, the tie is
    decided on those intervals instead (comparable: measured together, A B A B)."""
    if not candidates:
        raise CpbenchError("rank_with_ties needs at least one candidate, got none")
    order = tuple(sorted(candidates, key=lambda name: (candidates[name].median, name)))
    leader = order[0]
    tied = tuple(n for n in order if n == leader or candidates[n].overlaps(candidates[leader]))
    if tiebreak and len(tied) > 1 and all(n in tiebreak for n in tied):
        again = rank_with_ties({n: tiebreak[n] for n in tied})
        return Ranked(order, again.leader, again.tied, "interleaved re-measurement")
    return Ranked(order, leader, tied)


Verdict = Literal["faster", "slower", "no significant change"]
"""What a before/after comparison concludes for one configuration."""


@dataclass(frozen=True)
class Change:
    """After / before of one configuration, with its interval and the verdict."""

    ratio: float
    """after median / before median."""
    low: float
    """Lowest ratio the two intervals allow: after.low / before.high."""
    high: float
    """Highest ratio: after.high / before.low."""
    verdict: Verdict
    """faster (high < 1: after's interval entirely below before's), slower (low > 1), else no
    significant change."""

    @property
    def percent(self) -> float:
        """(ratio - 1) x 100: + slower, - faster."""
        return (self.ratio - 1.0) * 100.0

    def regression(self, threshold: float) -> bool:
        """Significantly slower and by more than `threshold` (relative) at the median."""
        return self.verdict == "slower" and self.ratio > 1.0 + threshold


def compare_intervals(before: Interval, after: Interval) -> Change:
    """The change from `before` to `after`: the ratio of medians, its bounds from the two
    intervals (conservative: every pair of values the intervals allow), and the verdict."""
    if before.median <= 0 or before.low <= 0:
        raise CpbenchError(
            f"cannot compare against a before time of {before.median:g} s (interval low "
            f"{before.low:g} s): a time must be positive"
        )
    low, high = after.low / before.high, after.high / before.low
    verdict: Verdict = "faster" if high < 1 else ("slower" if low > 1 else "no significant change")
    return Change(after.median / before.median, low, high, verdict)


# --------------------------- predicted: time x exp(+-z sigma); two tie on their ratio

PRIOR_RELATIVE_ERROR = 0.35
"""Stated accuracy of an uncalibrated datasheet prior: one standard deviation of the relative
step-time error (estimate: the link numbers of the shipped profiles are typical nccl-tests
figures that vary by +-30% between machines of one class; cpbench's CPU validation of the
prior alone lands within 30-40% median error)."""
INTERVAL_Z = 1.0
"""Width of a printed interval, and of a ratio's in a tie test, in standard deviations (about
68% coverage)."""


@dataclass(frozen=True)
class PredictionInterval:
    """A predicted time with its uncertainty: [low, high] = time x exp(-+z sigma)."""

    seconds: float
    """The prediction."""
    relative_sigma: float
    """One standard deviation of the relative error (calibration residual or prior accuracy)."""
    low_s: float
    """Lower end."""
    high_s: float
    """Upper end."""
    source: str
    """Where sigma comes from."""


def relative_sigma(calibration_residual: float | None, points: int = 0) -> tuple[float, str]:
    """Sigma of the relative error and its source: a calibration's RMS residual inflated by
    sqrt(n / (n - 2)) for the fitted parameters (at least 5%), else `PRIOR_RELATIVE_ERROR`."""
    if calibration_residual is None or points <= 0:
        return PRIOR_RELATIVE_ERROR, (
            f"uncalibrated prior (+-{PRIOR_RELATIVE_ERROR:.0%} stated accuracy, an estimate)"
        )
    inflate = math.sqrt(points / (points - 2)) if points > 2 else 2.0
    sigma = max(0.05, calibration_residual * inflate)
    return sigma, f"calibration residual {calibration_residual:.1%} RMS on {points} points"


def prediction_interval(
    seconds: float, sigma: float, source: str = "", z: float = INTERVAL_Z
) -> PredictionInterval:
    """The multiplicative interval time x exp(+-z sigma); CpbenchError on a negative input."""
    if seconds < 0 or sigma < 0:
        raise CpbenchError(f"interval needs seconds >= 0 and sigma >= 0, got {seconds}, {sigma}")
    return PredictionInterval(
        seconds, sigma, seconds * math.exp(-z * sigma), seconds * math.exp(z * sigma), source
    )


def ratio_tied(fast_s: float, slow_s: float, sigma: float, z: float = INTERVAL_Z) -> bool:
    """Whether two predictions tie: the interval slow/fast x e^(-+z sigma) of their ratio
    contains 1, `sigma` that of the log-ratio (the errors of two predictions on one profile are
    correlated: the test is on their ratio, not on the overlap of two independent intervals).
    A time <= 0 ties only one no slower."""
    if fast_s <= 0 or slow_s <= 0:
        return slow_s <= fast_s
    return abs(math.log(slow_s / fast_s)) <= z * sigma
