"""TimingSummary: the median and spread conventions the records and tables state."""

from __future__ import annotations

import statistics

import pytest

from cpbench.bench.timing import TimingSummary


@pytest.mark.parametrize(
    "samples",
    [[0.3, 0.1, 0.2], [1.0, 2.0, 3.0, 4.0], [0.05, 0.051, 0.2, 0.049, 0.05, 0.06, 0.048]],
)
def test_quantiles_are_inclusive_linear_interpolation(samples: list[float]) -> None:
    """p10/p90 sit at position q x (n - 1) of the sorted samples (statistics' inclusive method);
    the median is exact."""
    summary = TimingSummary.of(samples)
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    assert summary.p10 == pytest.approx(deciles[0], rel=1e-12)
    assert summary.p90 == pytest.approx(deciles[-1], rel=1e-12)
    assert summary.median == statistics.median(samples)
    assert summary.p10 <= summary.median <= summary.p90
    assert summary.samples == tuple(samples)  # raw samples kept, in measurement order


def test_one_sample_is_its_own_spread() -> None:
    summary = TimingSummary.of([0.25])
    assert (summary.p10, summary.median, summary.p90) == (0.25, 0.25, 0.25)
