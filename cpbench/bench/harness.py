"""The one measurement every step kind runs on each rank (nccl-tests' common.cu): a `StepKind`
says how to check and build its step; `measure_step` checks, releases, times, counts, probes,
and answers this rank's `RankMeasurement` (`cpbench.app.record` assembles the record)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from cpbench.attention.comm import ByteCounter, counting
from cpbench.attention.ring import Variant
from cpbench.bench.environment import (
    GpuClocks,
    RankCpu,
    RankHost,
    gpu_clock_state,
    rank_environment,
)
from cpbench.bench.memory import RankMemory, measure_peak_memory, release_cached_memory
from cpbench.bench.reference import agreed
from cpbench.bench.timing import TimedRun, TimingPolicy, time_to_precision
from cpbench.config.bench import BenchConfig


@dataclass(frozen=True)
class RankMeasurement:
    """One rank's numbers of one configuration."""

    rank: int
    """This rank's index in the world."""
    kernel: str
    """The local attention kernel that ran (an external impl's, as its adapter names it)."""
    full: TimedRun
    """The full step, timed to the scenario's precision."""
    compute: TimedRun | None
    """The compute-only variant (communication removed); None for an external impl."""
    comm: TimedRun | None
    """The communication-only variant (kernels removed); None for an external impl."""
    bytes: dict[str, dict[str, int]]
    """Bytes this rank sent in one counted step, by phase ("fwd", "bwd") and collective."""
    memory: RankMemory
    """Peak memory of one step under the memory probe."""
    accuracy: dict[str, Any] | None
    """The record's `accuracy` (`reference_check`; rank 0 only, None elsewhere)."""
    host: RankHost
    """This rank's host and device."""
    sampled_rows: dict[str, Any] | None = None
    """The record's `accuracy.sampled_rows` (the full-length row check; None when not run)."""
    kernel_version: str | None = None
    """The local kernel's version (cpbench's own implementation)."""
    impl_version: str | None = None
    """The external library's version (None for cpbench's own)."""
    gpu: GpuClocks | None = None
    """This rank's GPU clocks and throttling (CUDA, where NVML answers)."""
    cpu: RankCpu | None = None
    """CPU seconds this rank's process used in the task (`measure.measure_config` sets it)."""
    kv_cache_bytes: int | None = None
    """Inference only: nbytes of the K and V tensors this rank holds for the step (prefill:
    its cache shard and new-token shard; decode: its cache shard); None for training."""


class Step(Protocol):
    """One step on this rank; `counter` is set under the byte counter (the backward's bytes
    are counted as "bwd"); kinds without variants ignore `variant`."""

    def __call__(self, variant: Variant = "full", counter: ByteCounter | None = None) -> None: ...


@dataclass(frozen=True)
class Prepared:
    """A kind's step, built after the check: what is timed, counted and probed."""

    step: Step
    inputs: tuple[torch.Tensor, ...]
    """The step's live tensors (the memory probe counts allocations beyond them)."""
    kernel: str
    """The local kernel that runs (an external impl's, as its adapter names it)."""
    kernel_version: str | None = None
    impl_version: str | None = None
    variants: tuple[Variant, ...] = ("full",)
    """Timed in order; "full" gets the step's time budget, the others half of it."""
    kv_cache_bytes: int | None = None


@dataclass(frozen=True)
class StepKind:
    """What one kind of step (training scheme, external library, prefill, decode) fills in."""

    check: Callable[[], dict[str, Any] | None]
    """Collective: the record's `accuracy` on rank 0 (None elsewhere)."""
    prepare: Callable[[], Prepared]
    """Builds the step's inputs (after the check's memory is released)."""
    row_check: Callable[[], dict[str, Any] | None] | None = None
    """Collective: the full-length sampled-row check, when it runs."""
    counting: Callable[[ByteCounter], AbstractContextManager[Any]] = counting
    gpu_clocks: bool = True
    """Report the GPU's clocks (NVML) after the run; an external impl's record has none."""


def measure_step(
    kind: StepKind, config: BenchConfig, settings: dict[str, Any], device: torch.device
) -> RankMeasurement:
    """Collective: check (every rank agrees on a failure), release the check's cached memory,
    time each variant to precision, count one full step's bytes, probe one step's memory."""
    accuracy = agreed(kind.check, device)
    sampled = agreed(kind.row_check, device) if kind.row_check is not None else None
    # The check's tensors (the float64 reference on rank 0) are garbage now: return their
    # cached blocks, so neither timing nor the memory probe inherits them.
    release_cached_memory(device)
    run = kind.prepare()
    timings = {
        variant: time_to_precision(
            functools.partial(run.step, variant),
            TimingPolicy.from_settings(settings, 1.0 if variant == "full" else 0.5),
            device,
        )
        for variant in run.variants
    }
    counter, cuda = ByteCounter(), device.type == "cuda"
    with kind.counting(counter):
        run.step("full", counter)
    memory = measure_peak_memory(functools.partial(run.step, "full", None), device, run.inputs)
    return RankMeasurement(
        rank=dist.get_rank(),
        kernel=run.kernel,
        kernel_version=run.kernel_version,
        impl_version=run.impl_version,
        full=timings["full"],
        compute=timings.get("compute"),
        comm=timings.get("comm"),
        bytes=counter.as_dict(),
        memory=memory,
        accuracy=accuracy,
        sampled_rows=sampled,
        host=RankHost(**rank_environment(config.device)),
        gpu=gpu_clock_state(device.index or 0) if cuda and kind.gpu_clocks else None,
        kv_cache_bytes=run.kv_cache_bytes,
    )
