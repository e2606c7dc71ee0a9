"""Timing of a step across ranks: warm-up, then timed iterations to a precision, each the max
over ranks. CUDA events on GPU, perf_counter on CPU. The method: docs/design.md section 7."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

from cpbench.model.calibrate.stats import drifting, precise_enough
from cpbench.model.ties import CONFIDENCE, ORDER_STATISTICS, median_interval, median_rank_bounds


def _elapsed_cuda(step: Callable[[], object]) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _elapsed_cpu(step: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def step_timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """The seconds of one call of a step on `device` (CUDA events on a GPU, else wall clock)."""
    return _elapsed_cuda if device.type == "cuda" else _elapsed_cpu


def _reduced(
    values: list[float], device: torch.device, group: dist.ProcessGroup | None
) -> list[float]:
    """The max over the ranks of each value (the values themselves without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [float(x) for x in t.tolist()]


def time_iterations(
    step: Callable[[], object],
    warmup: int,
    iters: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> list[float]:
    """Each iteration's seconds, the max over the ranks of `group`. Every iteration starts with
    a barrier, so iteration i of every rank is the same step. All ranks call this."""
    distributed = dist.is_available() and dist.is_initialized()
    elapsed = step_timer(device)
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        if distributed:
            dist.barrier(group=group)  # start together, so the max is the step, not the skew
        samples.append(elapsed(step))
    return _reduced(samples, device, group)


StopReason = Literal["precision reached", "max iterations", "time budget", "fixed count"]
"""Why the timed iterations stopped."""


@dataclass(frozen=True)
class TimingPolicy:
    """How long to warm up and how many iterations to time."""

    warmup: int = 1
    """Warm-up iterations always run (>= 0)."""
    warmup_cap: int = 5
    """At most this many warm-up iterations: warm-up goes on past `warmup` while the timings
    drift (`stats.drifting`, 10%)."""
    min_iters: int = 6
    """Timed iterations always run (6 is the fewest with a 95% order-statistic interval)."""
    max_iters: int = 100
    """Timed iterations at most."""
    precision: float | None = 0.05
    """Target relative width of the median's 95% interval, (high - low) / median; None = a
    fixed count of `min_iters` iterations."""
    budget_s: float = 2.0
    """Wall seconds of timed iterations (barriers included; the max over ranks, so every rank
    agrees) after which timing stops even if the target is not met."""

    @classmethod
    def from_settings(cls, settings: dict[str, object], scale: float = 1.0) -> TimingPolicy:
        """The policy of a sweep's settings dict (warmup, iters, max_iters, precision, budget);
        `scale` multiplies the budget (the variants get a share of the step's)."""
        precision = settings.get("precision")
        iters = int(settings["iters"])  # type: ignore[call-overload]
        return cls(
            warmup=int(settings["warmup"]),  # type: ignore[call-overload]
            warmup_cap=int(settings.get("warmup_cap", 5)),  # type: ignore[call-overload]
            min_iters=iters,
            max_iters=max(iters, int(settings.get("max_iters", 100))),  # type: ignore[call-overload]
            precision=None if precision is None else float(precision),  # type: ignore[arg-type]
            budget_s=float(settings.get("budget", 2.0)) * scale,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class TimedRun:
    """What `time_to_precision` measured on this rank."""

    samples: list[float]
    """This rank's own seconds per timed iteration."""
    max_samples: list[float]
    """Each timed iteration's max over the ranks (the step time; the same on every rank)."""
    warmup: int
    """Warm-up iterations run."""
    stop: StopReason
    """Why timing stopped."""


def time_to_precision(
    step: Callable[[], object],
    policy: TimingPolicy,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> TimedRun:
    """Warm up until the timings stop drifting, then time until the median is known to
    `policy.precision` (docs/design.md section 7). All ranks call this."""
    distributed = dist.is_available() and dist.is_initialized()
    elapsed = step_timer(device)

    started = [time.perf_counter()]

    def one() -> tuple[float, float, float]:
        """(this rank's time, the max over ranks, the max wall seconds since timing began)."""
        if distributed:
            dist.barrier(group=group)
        mine = elapsed(step)
        worst, wall = _reduced([mine, time.perf_counter() - started[0]], device, group)
        return mine, worst, wall

    warm: list[float] = []
    while len(warm) < policy.warmup or (
        policy.precision is not None and len(warm) < policy.warmup_cap and drifting(warm)
    ):
        warm.append(one()[1])
    if device.type == "cuda":
        torch.cuda.synchronize()
    mine_all: list[float] = []
    max_all: list[float] = []
    stop: StopReason = "fixed count"
    started[0] = time.perf_counter()
    while True:
        mine, worst, wall = one()
        mine_all.append(mine)
        max_all.append(worst)
        n = len(max_all)
        if n < policy.min_iters:
            continue
        if policy.precision is None:
            break
        if precise_enough(max_all, policy.precision):
            stop = "precision reached"
            break
        if n >= policy.max_iters:
            stop = "max iterations"
            break
        if wall >= policy.budget_s and median_rank_bounds(n) is not None:
            stop = "time budget"
            break
    return TimedRun(mine_all, max_all, len(warm), stop)


@dataclass(frozen=True)
class TimingSummary:
    """Summary of one configuration's timed iterations (seconds)."""

    median: float
    """Median iteration time (statistics.median: mean of the middle two for an even count)."""
    p10: float
    """10th percentile, linearly interpolated between order statistics (numpy's default)."""
    p90: float
    """90th percentile, interpolated the same way."""
    samples: tuple[float, ...]
    """Every iteration's time, in the order timed."""
    ci_low: float = math.nan
    """Lower end of the median's 95% interval (`ties.median_interval`)."""
    ci_high: float = math.nan
    """Upper end of the median's 95% interval."""
    interval_method: str = ORDER_STATISTICS
    """How the interval was obtained (order statistics, or the sample range when n < 6)."""

    @classmethod
    def of(cls, samples: list[float]) -> TimingSummary:
        """Median, p10 and p90 of `samples`; the quantiles use numpy.percentile's `linear`
        method (position q x (n - 1) in the sorted samples, as statistics.quantiles'
        `inclusive` method); the median's 95% interval from `ties.median_interval`."""
        median = statistics.median(samples)
        p10, p90 = np.percentile(np.asarray(samples, dtype=float), [10, 90], method="linear")
        interval = median_interval(samples, CONFIDENCE)
        return cls(
            median, float(p10), float(p90), tuple(samples), interval.low, interval.high,
            interval.method,
        )  # fmt: skip

    @property
    def relative_width(self) -> float:
        """(ci_high - ci_low) / median."""
        return (self.ci_high - self.ci_low) / self.median if self.median > 0 else math.inf
