"""Summary statistics: of calibration and validation (RMS of relative errors, rank
correlation), and of measurements (the confidence interval of a median, ties between
configurations, the change between two files, overlap with its uncertainty). Pure numpy/scipy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cpbench.errors import CpbenchError

# scipy.stats is imported where it is used (`spearman`, `median_rank_bounds`): it costs most of
# a second here, and every reader of records (the report, `compare`, the acceptance summary)
# imports this module for its types. A rank imports it before it says "ready" (bench/pool.py).


def rms(values: Sequence[float]) -> float:
    """Root mean square; 0 for no values."""
    if not values:
        return 0.0
    return float(np.sqrt(np.mean(np.square(np.asarray(values, dtype=float)))))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (scipy.stats.spearmanr: average ranks for ties); None where it
    is undefined: fewer than 2 points, or either side constant (no spread)."""
    if len(x) != len(y):
        raise CpbenchError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2 or min(x) == max(x) or min(y) == max(y):
        return None
    from scipy.stats import spearmanr  # noqa: PLC0415 - see the imports

    return float(spearmanr(x, y).statistic)


# --------------------------------------------------------------------------------------------
# Measurement uncertainty: the interval of a median, ties, changes, overlap
# --------------------------------------------------------------------------------------------

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


def median_rank_bounds(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (j, n + 1 - j) of the sorted samples bounding the median with at least
    `confidence` coverage: P(j <= B < n + 1 - j) for B ~ Binomial(n, 1/2), the largest such j;
    None when even (1, n) covers less (n < 6 at 95%)."""
    if n < 1:
        return None
    from scipy.stats import binom  # noqa: PLC0415 - see the imports

    alpha = 1.0 - confidence
    # Coverage of [x_(j), x_(n+1-j)] = 1 - 2 P(B <= j - 1).
    j = int(binom.ppf(alpha / 2, n, 0.5))  # smallest k with P(B <= k) >= alpha / 2
    while j >= 1 and 1 - 2 * binom.cdf(j - 1, n, 0.5) < confidence:
        j -= 1
    while 1 - 2 * binom.cdf(j, n, 0.5) >= confidence and j + 1 <= (n + 1) // 2:
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


def precise_enough(samples: Sequence[float], target: float, confidence: float = CONFIDENCE) -> bool:
    """The samples' median interval is an order-statistic one no wider than `target` x the
    median."""
    if median_rank_bounds(len(samples), confidence) is None:
        return False
    return median_interval(samples, confidence).relative_width <= target


def drifting(samples: Sequence[float], tolerance: float = 0.1) -> bool:
    """Warm-up: the timings still drift when the last of them differs from the median of the
    (at most two) before it by more than `tolerance` (relative), or when fewer than 2 exist."""
    if len(samples) < 2:
        return True
    previous = float(np.median(samples[-3:-1]))
    return previous <= 0 or abs(samples[-1] - previous) / previous > tolerance


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
        """'fastest' (clear winner) or 'tie (n)'."""
        return "fastest" if self.clear else f"tie ({len(self.tied)})"


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


OverlapStatus = Literal["measured", "not measurable", "none by construction", "no communication"]
"""What an overlap figure is: measured (with an interval), not measurable (the communication
is within the timing noise), none by construction (the scheme cannot hide it: an all-to-all
waits for its data), or no communication at all."""


@dataclass(frozen=True)
class Overlap:
    """Share of the shorter of compute / communication hidden under the other."""

    value: float | None
    """(compute + comm - step) / min(compute, comm) at the medians, clamped to [0, hideable];
    None unless measured."""
    low: float | None
    """Lowest value the three intervals allow (clamped)."""
    high: float | None
    """Highest value the three intervals allow (clamped)."""
    status: OverlapStatus
    """What the figure is (see `OverlapStatus`)."""
    note: str
    """One sentence: what it means for this record."""


def overlap_estimate(
    step: Interval, compute: Interval, comm: Interval, hideable: float = 1.0, scheme: str = ""
) -> Overlap:
    """Overlap from the three measured variants, with its interval.

    `hideable` is the largest share the scheme can hide (0 for Ulysses: its all-to-alls wait for
    their data before any compute; 1 for a ring, whose transfers run under the kernels). The
    overlap is "not measurable" when the communication-only time is within the noise of the
    step (its median below the half-width of the step's interval, or of compute's)."""
    if comm.median <= 0 or compute.median <= 0:
        return Overlap(None, None, None, "no communication", "no communication in this configuration")
    if hideable <= 0:
        return Overlap(
            0.0,
            0.0,
            0.0,
            "none by construction",
            f"{scheme or 'this scheme'}: an all-to-all waits for its data before any compute, so "
            "nothing can be hidden (0 by construction, not measured)",
        )
    noise = max(step.high - step.low, compute.high - compute.low) / 2
    if comm.median <= noise:
        return Overlap(
            None,
            None,
            None,
            "not measurable",
            f"communication ({comm.median * 1e3:.3g} ms) is within the timing noise "
            f"(+/- {noise * 1e3:.3g} ms half-width of the step or compute interval)",
        )

    def share(s: float, c: float, m: float) -> float:
        return min(hideable, max(0.0, (c + m - s) / min(c, m)))

    value = share(step.median, compute.median, comm.median)
    corners = [
        share(s, c, m)
        for s in (step.low, step.high)
        for c in (compute.low, compute.high)
        for m in (comm.low, comm.high)
        if min(c, m) > 0
    ]
    return Overlap(
        value,
        min(corners, default=value),
        max(corners, default=value),
        "measured",
        "share of the shorter of compute/communication hidden under the other, with the range "
        f"the three 95% intervals allow (at most {hideable:g} for this scheme)",
    )
