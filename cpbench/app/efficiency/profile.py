"""`profile_steps`: one ring step and one Ulysses step under torch.profiler (CPU, plus CUDA
device time on a GPU), the time split into buckets (docs/profile.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.distributed as dist

from cpbench.app.efficiency.cases import SINGLE, EfficiencyCase, EfficiencySettings
from cpbench.app.efficiency.measure import clear_task, prepared_step, rank_device
from cpbench.bench.pool import WorkerPool, WorldSpec
from cpbench.config.vocabulary import Dtype

ProfileBucket = Literal[
    "attention kernels", "copies", "fills", "merge / accumulate", "comm calls", "waits",
    "other ops & autograd",
]
PROFILE_BUCKETS: tuple[ProfileBucket, ...] = get_args(ProfileBucket)
_ELEMENTWISE = {
    "add", "add_", "mul", "mul_", "sub", "sub_", "logaddexp", "exp", "exp_", "sigmoid",
    "log_sigmoid_forward", "log", "div", "div_", "sum", "neg", "masked_fill", "where", "lerp_",
}


def bucket_of(name: str) -> ProfileBucket:
    """The profile bucket of a profiler event name (an aten op, a c10d call, a CUDA kernel,
    or a cpbench record_function range)."""
    low = name.lower()
    if low.startswith("cpbench::wait") or low.startswith("cpbench::a2a"):
        return "waits"
    if low.startswith(("c10d::", "nccl", "gloo", "record_param_comms")):
        return "comm calls"
    if any(s in low for s in ("scaled_dot_product", "flash", "fmha", "attention_kernel")):
        return "attention kernels"
    op = low.removeprefix("aten::")
    if op in ("copy_", "cat", "_to_copy", "clone", "contiguous") or "memcpy" in low:
        return "copies"
    if op in ("fill_", "zero_") or "memset" in low or "fill" in low:
        return "fills"
    if op in _ELEMENTWISE or "elementwise" in low or "reduce" in low:
        return "merge / accumulate"
    return "other ops & autograd"


@dataclass(frozen=True)
class StepProfile:
    """Where one step's time goes on rank 0 (self times of the profiler's events): of the
    profiled steps, the one whose wall time is the median (a whole step, not a mix of steps)."""

    label: str
    """The case profiled (single process, cpbench U1xR2 zigzag, ...)."""
    wall: float
    """Seconds of the step shown (wall clock, rank 0): the median of `walls` (the lower middle
    one for an even count: a step that ran)."""
    cpu: dict[str, float]
    """Seconds of host (self CPU) time per bucket; on CPU this is where the step runs."""
    device: dict[str, float]
    """Seconds of device (self CUDA) time per bucket; empty on CPU."""
    walls: tuple[float, ...] = ()
    """Wall seconds of every profiled step, in order (their spread is the run's noise)."""


def profile_task(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype
                 ) -> StepProfile | None:
    """Pool task: one warm step, then `settings.rounds` steps of `case`, each under its own
    torch.profiler; rank 0's buckets of the median step (None on the other ranks)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    step = prepared_step(case, settings, dtype)
    device = rank_device(settings)
    dist.barrier()
    step()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    steps: list[tuple[float, dict[str, float], dict[str, float]]] = []
    for _ in range(settings.rounds):
        dist.barrier()
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        cpu: dict[str, float] = dict.fromkeys(PROFILE_BUCKETS, 0.0)
        dev: dict[str, float] = (
            dict.fromkeys(PROFILE_BUCKETS, 0.0) if device.type == "cuda" else {}
        )
        for event in prof.key_averages():
            bucket = bucket_of(event.key)
            cpu[bucket] += event.self_cpu_time_total / 1e6
            if dev:
                dev[bucket] += getattr(event, "self_device_time_total", 0.0) / 1e6
        steps.append((wall, cpu, dev))
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    walls = tuple(w for w, _, _ in steps)
    wall, cpu, dev = sorted(steps, key=lambda s: s[0])[(len(steps) - 1) // 2]
    return StepProfile(case.label, wall, cpu, dev, walls)


def profile_steps(
    settings: EfficiencySettings,
    dtype: Dtype,
    cases: tuple[EfficiencyCase, ...] = (
        EfficiencyCase("cpbench", 1, 2, "zigzag"),
        EfficiencyCase("cpbench", 2, 1, "contiguous"),
    ),
) -> list[StepProfile]:
    """The baseline, then each case (default: one ring step, one Ulysses step), each profiled
    for `settings.rounds` steps on a pool of `settings.world_sizes[0]` ranks (the median step
    is shown)."""
    world = settings.world_sizes[0]
    profiles = []
    with WorkerPool(WorldSpec(world, settings.device, settings.threads_per_rank)) as pool:
        for case in (EfficiencyCase(SINGLE, 1, 1, "contiguous"), *cases):
            result = pool.run(profile_task, case, settings, dtype, timeout=settings.timeout)[0]
            if result is not None:
                profiles.append(result)
        pool.run(clear_task)
    return profiles
