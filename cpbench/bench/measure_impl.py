"""One configuration of an external implementation (`cpbench.impls`), measured on every rank.

The order, and why there are no variants: docs/design.md section 7."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention.comm import ByteCounter
from cpbench.bench.environment import RankHost, rank_environment
from cpbench.bench.measurement import RankMeasurement
from cpbench.bench.memory import measure_peak_memory, release_cached_memory
from cpbench.bench.reference import agreed, random_shards, reference_check
from cpbench.bench.timing import TimingPolicy, time_to_precision
from cpbench.config.bench import BenchConfig
from cpbench.impls import get_adapter
from cpbench.impls.counting import library_counting


def kernel_label(kernel: str) -> str:
    """The adapter's local kernel; flash-attn marked when it is the tests' CPU stand-in."""
    flash_attn = sys.modules.get("flash_attn")
    if kernel == "flash_attn" and getattr(flash_attn, "STAND_IN", False):
        return "flash_attn (CPU stand-in)"
    return kernel


def measure_external(
    config: BenchConfig, settings: dict[str, Any], device: torch.device, check_len: int
) -> RankMeasurement:
    """Pool task body (collective) for an external impl; see docs/design.md section 7."""
    adapter = get_adapter(config.impl)
    accuracy = agreed(lambda: reference_check(config, check_len, device), device)
    # The check's tensors (the float64 reference on rank 0) are garbage now: return their
    # cached blocks, so neither timing nor the memory probe inherits them.
    release_cached_memory(device)
    runner = adapter.prepare(config)
    backward = config.phase == "fwd+bwd"
    q, k, v, dout = random_shards(config, device)

    def run_step(counter: ByteCounter | None = None) -> None:
        for t in (q, k, v):
            t.grad = None
        with runner.context(), torch.set_grad_enabled(backward):
            out = runner.forward(q, k, v)
            if backward:
                with counter.phase("bwd") if counter else contextlib.nullcontext():
                    out.backward(dout)

    # Timed as cpbench's own full step is (`time_to_precision`: warm-up until the times stop
    # drifting, then to the scenario's precision within its budget), so the comparison's two
    # sides carry intervals of the same width.
    timed = time_to_precision(run_step, TimingPolicy.from_settings(settings, 1.0), device)
    counter = ByteCounter()
    with library_counting(counter):
        run_step(counter)
    memory = measure_peak_memory(run_step, device, (q, k, v, dout))
    return RankMeasurement(
        rank=dist.get_rank(),
        kernel=kernel_label(adapter.kernel),
        impl_version=adapter.version(),
        full=timed,
        compute=None,
        comm=None,
        bytes=counter.as_dict(),
        memory=memory,
        accuracy=accuracy,
        host=RankHost(**rank_environment(config.device)),
    )
