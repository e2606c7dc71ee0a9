"""Summary statistics: of calibration and validation (RMS of relative errors, rank
correlation), and of measurements (precision, warm-up drift, overlap with its uncertainty); a
median's interval and ties: `cpbench.model.ties`. Pure numpy/scipy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cpbench.errors import CpbenchError
from cpbench.model.ties import CONFIDENCE, Interval, median_interval, median_rank_bounds

# scipy.stats is imported where it is used (`spearman`): it costs most of a second.


def rms(values: Sequence[float] | np.ndarray) -> float:
    """Root mean square; 0 for no values."""
    if len(values) == 0:
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
# Measurement uncertainty: precision, drift, overlap
# --------------------------------------------------------------------------------------------


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
