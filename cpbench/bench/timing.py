"""Timing of a step across ranks: warm up, then N timed iterations; each iteration's time is the
max over ranks (the slowest rank sets the step). CUDA events on GPU, perf_counter on CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


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


def time_iterations(
    step: Callable[[], object],
    warmup: int,
    iters: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    reduce_max: bool = True,
) -> list[float]:
    """Seconds per iteration on this rank, or (`reduce_max`) each iteration's max over the
    ranks of `group`. Every iteration starts with a barrier, so iteration i of every rank is
    the same step. All ranks call this."""
    distributed = dist.is_available() and dist.is_initialized()
    elapsed = _elapsed_cuda if device.type == "cuda" else _elapsed_cpu
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        if distributed:
            dist.barrier(group=group)  # start together, so the max is the step, not the skew
        samples.append(elapsed(step))
    if not distributed or not reduce_max:
        return samples
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


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

    @classmethod
    def of(cls, samples: list[float]) -> TimingSummary:
        """Median, p10 and p90 of `samples`; the quantiles use numpy.percentile's `linear`
        method (position q x (n - 1) in the sorted samples, as statistics.quantiles'
        `inclusive` method)."""
        median = statistics.median(samples)
        p10, p90 = np.percentile(np.asarray(samples, dtype=float), [10, 90], method="linear")
        return cls(median, float(p10), float(p90), tuple(samples))
