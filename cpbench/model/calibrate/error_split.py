"""The model's error split into a part common to the candidates of one problem and a part of
each candidate (the sigma `cpbench.model.ties.ratio_tied` tests a ratio on): docs/cost-model.md
section 1."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cpbench.errors import CpbenchError
from cpbench.model.ties import PRIOR_RELATIVE_ERROR

MEDIAN_ABS_TO_SIGMA = 0.6745
"""Median of |x| for a standard normal x: sigma = median |error| / 0.6745."""
PRIOR_RATIO_MEDIAN_ABS = 0.11
"""Median |log error| of the ratio of two candidates of one problem, measured by issue 24
against published CP-attention tables (8x A100 NVLink, 4x A100 PCIe, 8x L20 PCIe, 8x H800; 35
groups) beside 0.47 for absolute times: the prior split below is taken from it. On the
dataset cpbench ships (`cpbench/data/published/cp_attention.csv`, no yunchang table in it) the
same median is 0.148 over its 30 pairs, within two standard errors (0.023 each) of 0.11
(`tests/test_calibrate.py` recomputes it)."""
PRIOR_CANDIDATE_SIGMA = PRIOR_RATIO_MEDIAN_ABS / MEDIAN_ABS_TO_SIGMA / math.sqrt(2.0)
"""Per-candidate sigma of the prior: the ratio's sigma (0.11 / 0.6745 = 0.163) over sqrt(2)."""
PRIOR_CANDIDATE_SHARE = PRIOR_CANDIDATE_SIGMA / PRIOR_RELATIVE_ERROR
"""Per-candidate sigma as a fraction of the total where no residual splits it (0.33)."""
CANDIDATE_SIGMA_FLOOR = 0.03
"""Least per-candidate sigma: a fit that explains the differences exactly still leaves the
run-to-run spread of a measured step (a few percent on GPUs); a choice, not a measurement."""


@dataclass(frozen=True)
class ErrorSplit:
    """The model's log error of a step time, split into the problem's common part and the
    candidate's own part."""

    common_sigma: float
    """Sigma of the error shared by every candidate of one problem."""
    candidate_sigma: float
    """Sigma of a candidate's own error (what a ratio of two candidates carries, twice)."""
    source: str
    """Where the split comes from, in words."""
    points: int = 0
    """Residuals it was estimated from (0: the prior split)."""
    groups: int = 0
    """Problems with two or more residuals among them (what sigma_candidate is pooled over)."""

    @property
    def ratio_sigma(self) -> float:
        """Sigma of the log-ratio of two candidates of one problem: sqrt(2) x candidate."""
        return math.sqrt(2.0) * self.candidate_sigma


def prior_split(total_sigma: float = PRIOR_RELATIVE_ERROR, source: str = "") -> ErrorSplit:
    """The stated split of a total sigma: `PRIOR_CANDIDATE_SHARE` of it per candidate (at
    least `CANDIDATE_SIGMA_FLOOR`), the rest common."""
    if total_sigma < 0:
        raise CpbenchError(f"sigma must be >= 0, got {total_sigma}")
    candidate = min(total_sigma, max(CANDIDATE_SIGMA_FLOOR, PRIOR_CANDIDATE_SHARE * total_sigma))
    common = math.sqrt(max(0.0, total_sigma**2 - candidate**2))
    text = (
        f"prior split: per-candidate sigma {PRIOR_CANDIDATE_SHARE:.0%} of the total (from the "
        f"median |log error| {PRIOR_RATIO_MEDIAN_ABS} of candidate ratios on published tables, "
        f"issue 24)"
    )
    return ErrorSplit(common, candidate, f"{source}; {text}" if source else text)


def split_residuals(
    residuals: Sequence[tuple[Hashable, float]],
    fitted_parameters: int = 0,
    source: str = "",
) -> ErrorSplit:
    """The split estimated from (group, log(predicted / measured)) residuals; see the module
    docstring. `fitted_parameters` (of a calibration on the same points) inflates the mean
    square by n / (n - k), as a fit's in-sample residuals are smaller than its errors."""
    if not residuals:
        return prior_split(source=source)
    for _, value in residuals:
        if not math.isfinite(value):
            raise CpbenchError(f"a residual must be finite, got {value}")
    by_group: dict[Hashable, list[float]] = {}
    for key, value in residuals:
        by_group.setdefault(key, []).append(value)
    n = len(residuals)
    inflate = n / (n - fitted_parameters) if n > fitted_parameters + 1 else 2.0
    mean_square = inflate * sum(v * v for _, v in residuals) / n
    pooled = [vs for vs in by_group.values() if len(vs) >= 2]
    dof = sum(len(vs) - 1 for vs in pooled)
    if dof == 0:
        split = prior_split(math.sqrt(mean_square), source)
        return ErrorSplit(split.common_sigma, split.candidate_sigma, split.source, n, 0)
    within = sum((v - sum(vs) / len(vs)) ** 2 for vs in pooled for v in vs) / dof
    candidate = max(CANDIDATE_SIGMA_FLOOR, math.sqrt(within))
    common = math.sqrt(max(0.0, mean_square - candidate**2))
    text = (
        f"{n} residuals in {len(pooled)} problem(s) with >= 2 candidates: per-candidate sigma "
        f"{candidate:.1%} (within-problem spread), common {common:.1%}"
    )
    return ErrorSplit(common, candidate, f"{source}; {text}" if source else text, n, len(pooled))
