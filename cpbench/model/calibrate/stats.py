"""Summary statistics of calibration and validation: RMS of relative errors, rank correlation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import spearmanr

from cpbench.errors import CpbenchError


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
    return float(spearmanr(x, y).statistic)
