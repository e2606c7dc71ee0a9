"""What one rank measured of one configuration: the answer every rank's pool task returns (for
cpbench's own implementation and an external one), from which `cpbench.app.record` assembles
the record. Plain frozen dataclasses: they pickle across the pool's processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpbench.bench.environment import GpuClocks, RankCpu, RankHost
from cpbench.bench.memory import RankMemory
from cpbench.bench.timing import TimedRun


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
    """CPU seconds this rank's process used in the task (`measure_config` sets it)."""
    kv_cache_bytes: int | None = None
    """Inference only: nbytes of the K and V tensors this rank holds for the step (prefill:
    its cache shard and new-token shard; decode: its cache shard); None for training."""
