"""TimingSummary: the median and spread conventions the records and tables state."""

from __future__ import annotations

import dataclasses
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


def test_other_load_is_cpu_time_beyond_the_ranks_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other load is the machine's busy CPU time minus what the ranks and cpbench itself used
    (100 clock ticks a second here): 1.5 s busy of 2.0 s with the ranks at 1.0 s is 25 % other
    (warned); with the ranks at 1.5 s it is none; a rank that is the snapshotting process
    itself (torchrun's rank 0) is counted once; a rank that did not report leaves it unknown."""
    from cpbench.bench import environment  # noqa: PLC0415
    from cpbench.bench.environment import RankCpu, machine_state, other_cpu_share  # noqa: PLC0415

    monkeypatch.setattr(environment, "usable_cores", lambda: 2)
    monkeypatch.setattr(environment, "_clock_ticks_per_second", lambda: 100.0)
    zero = dict.fromkeys(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), 0)
    before = {"load1": 6.0, "time": 0.0, "cpu_times": zero, "process_cpu": 10.0, "pid": 1,
              "host": "a"}
    after = {"load1": 6.0, "time": 1.0, "cpu_times": dict(zero, user=140, system=10, idle=50),
             "process_cpu": 10.0, "pid": 1, "host": "a"}

    def ranks(*seconds: float, pid: int = 2) -> list[RankCpu]:
        return [RankCpu(s, pid + i, "a") for i, s in enumerate(seconds)]

    assert other_cpu_share(before, after, ranks(0.5, 0.5)) == pytest.approx(0.25, abs=1e-12)
    loaded = machine_state(before, after, 2, 1, "cpu", ranks_cpu=ranks(0.5, 0.5))
    assert loaded["other_cpu"] == pytest.approx(0.25, abs=1e-12)
    assert [w for w in loaded["warnings"] if w.startswith("other load during the run: other "
                                                          "processes used 25%")]
    quiet = machine_state(before, after, 2, 1, "cpu", ranks_cpu=ranks(0.75, 0.75))
    assert quiet["other_cpu"] == 0.0 and not [w for w in quiet["warnings"] if "other" in w]
    # a load average far above the ranks' own is not other load by itself (it lags a minute)
    assert quiet["load1_before"] == 6.0
    # this process used 0.5 s too: excluded when it is not a rank, counted once when it is
    mine = dict(after, process_cpu=10.5)
    assert other_cpu_share(before, mine, ranks(0.5, 0.5)) == pytest.approx(0.0, abs=1e-12)
    assert other_cpu_share(before, mine, ranks(0.5, 0.5, pid=1)) == pytest.approx(0.25)
    # ranks on another host are not this machine's
    remote = [dataclasses.replace(r, host="b") for r in ranks(0.75, 0.75)]
    assert other_cpu_share(before, after, remote) == pytest.approx(0.75)
    assert other_cpu_share(before, after, [None, *ranks(1.0)]) is None  # type: ignore[list-item]
    assert machine_state(before, after, 2, 1, "cpu")["other_cpu"] is None


def test_other_load_measured_on_this_machine() -> None:
    """For real, on this machine, whatever else runs on it (bounds that hold under any load):
    /proc/stat's ticks over an interval add up to the machine's CPUs x the wall time (within
    15%); CPU this process burns is not other load (other <= busy - 90% of what it burned); a
    stranger burning a core for 0.5 s is (other >= 80% of the stranger's own CPU seconds, from
    getrusage of the reaped child). The share with a quiet machine is the unit test above."""
    import os  # noqa: PLC0415
    import resource  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import time  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from cpbench.bench.environment import host_snapshot, other_cpu_share  # noqa: PLC0415

    stat = Path("/proc/stat")
    if not stat.exists():
        pytest.skip("no /proc/stat on this platform")
    cpus = sum(1 for line in stat.read_text().splitlines() if line[:3] == "cpu" and line[3:4].isdigit())
    ticks = float(os.sysconf("SC_CLK_TCK"))

    def seconds(before: dict, after: dict) -> tuple[float, float]:
        """(all, busy) CPU seconds of the machine between two snapshots."""
        delta = {k: after["cpu_times"][k] - before["cpu_times"][k] for k in before["cpu_times"]}
        idle = delta["idle"] + delta["iowait"] + delta["steal"]
        return sum(delta.values()) / ticks, (sum(delta.values()) - idle) / ticks

    before = host_snapshot()
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass
    after = host_snapshot()
    total_s, busy_s = seconds(before, after)
    wall = after["time"] - before["time"]
    assert abs(total_s - cpus * wall) < 0.15 * cpus * wall, (total_s, cpus, wall)
    burned = after["process_cpu"] - before["process_cpu"]
    own = other_cpu_share(before, after, [])
    assert own is not None and own * total_s <= busy_s - 0.9 * burned + 2 / ticks, (own, busy_s)

    used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = host_snapshot()
    stranger = subprocess.Popen(
        [sys.executable, "-S", "-c", "import time\nt = time.process_time() + 0.5\n"
         "while time.process_time() < t: pass"]
    )  # fmt: skip
    stranger.wait(timeout=120)
    after = host_snapshot()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    stranger_s = (used.ru_utime + used.ru_stime) - (used_before.ru_utime + used_before.ru_stime)
    other = other_cpu_share(before, after, [])
    total_s, _ = seconds(before, after)
    assert stranger_s >= 0.5
    assert other is not None and other * total_s >= 0.8 * stranger_s, (other, total_s, stranger_s)
