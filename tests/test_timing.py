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


def test_summary_carries_the_median_interval() -> None:
    samples = [0.10 + 0.001 * i for i in range(20)]
    summary = TimingSummary.of(samples)
    assert summary.interval_method.startswith("order statistics")
    assert summary.ci_low <= summary.median <= summary.ci_high
    assert summary.relative_width == pytest.approx((summary.ci_high - summary.ci_low) / summary.median)


def _synthetic_step(times: list[float]):  # type: ignore[no-untyped-def]
    """A step whose duration follows `times` (then repeats the last)."""
    import time  # noqa: PLC0415

    calls = [0]

    def step() -> None:
        time.sleep(times[min(calls[0], len(times) - 1)])
        calls[0] += 1

    return step, calls


def test_timing_stops_at_the_precision_and_warms_up_while_drifting() -> None:
    import torch  # noqa: PLC0415

    from cpbench.bench.timing import TimingPolicy, time_to_precision  # noqa: PLC0415

    # Warm-up drifts 40 ms -> 20 ms -> 10 ms, then steady at 10 ms.
    step, calls = _synthetic_step([0.04, 0.02, 0.01])
    policy = TimingPolicy(warmup=1, warmup_cap=5, min_iters=3, max_iters=50, precision=0.5)
    run = time_to_precision(step, policy, torch.device("cpu"))
    assert run.warmup >= 3  # kept warming while the times drifted by more than 10%
    assert run.stop == "precision reached" and 6 <= len(run.samples) < 50
    assert run.samples == run.max_samples  # one process: its own times are the max
    fixed = time_to_precision(step, TimingPolicy(warmup=0, min_iters=4, precision=None),
                              torch.device("cpu"))
    assert (len(fixed.samples), fixed.warmup, fixed.stop) == (4, 0, "fixed count")


def test_timing_stops_at_the_budget_when_the_target_is_unreachable() -> None:
    import torch  # noqa: PLC0415

    from cpbench.bench.timing import TimingPolicy, time_to_precision  # noqa: PLC0415

    step, _ = _synthetic_step([0.001, 0.02] * 100)  # alternating: a wide interval
    policy = TimingPolicy(warmup=0, warmup_cap=0, min_iters=1, max_iters=1000,
                          precision=0.001, budget_s=0.2)
    run = time_to_precision(step, policy, torch.device("cpu"))
    assert run.stop == "time budget" and len(run.samples) < 1000
    assert 0.15 <= sum(run.max_samples) <= 0.2 + 0.02  # wall budget: the steps fill most of it


def test_other_load_is_load_beyond_the_ranks_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep runs configurations back to back, so the load average before one still holds the
    previous one's ranks: 4 busy ranks on 2 cores are not "other load"; 2 more processes are."""
    from cpbench.bench import environment  # noqa: PLC0415
    from cpbench.bench.environment import machine_state  # noqa: PLC0415

    monkeypatch.setattr(environment, "usable_cores", lambda: 2)

    after = {"load1": 4.0, "time": 1.0}
    own = machine_state({"load1": 3.9, "time": 0.0}, after, 4, 1, "cpu")
    assert not [w for w in own["warnings"] if w.startswith("other load")]
    assert any(w.startswith("oversubscribed") for w in own["warnings"])
    other = machine_state({"load1": 6.0, "time": 0.0}, after, 4, 1, "cpu")
    assert [w for w in other["warnings"] if w.startswith("other load")]
