"""One configuration, measured on every rank of a pool (a pool task).

Order: correctness check against the single-process reference (once, at a reduced length when
the configuration is too long for a reference; its tensors are freed and, on CUDA, the
allocator's cache emptied before anything is timed), then warm-up and timed iterations of the full
step, of the compute-only variant (communication removed, same shapes) and of the
communication-only variant (kernels removed, same bytes); then one iteration under the byte
counter and one under the memory probe. Returns this rank's numbers; `sweep` assembles the
record from all ranks.

Masks: the step runs the configuration's mask (`BenchConfig.mask`: documents, window) on local
shards of the run length (`cpbench.model.masking.pack(...).seq_len`: the sequence plus the
padding doc_zigzag adds), and the reference check runs the same mask truncated at the check
length. Each rank times its own iterations, so the per-rank medians of the compute-only variant
are each rank's own work (what the report sets against `cpbench.model.masking.rank_pairs`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention import build_mesh, cp_attention
from cpbench.attention.comm import ByteCounter, counting
from cpbench.attention.kernels import kernel_version, select_kernel
from cpbench.attention.ring import VARIANTS, Variant
from cpbench.bench.environment import rank_environment
from cpbench.bench.measure_impl import measure_external
from cpbench.bench.memory import measure_peak_memory, release_cached_memory
from cpbench.bench.reference import (
    TORCH_DTYPES,
    agreed,
    random_shards,
    reference_check,
    torch_device,
)
from cpbench.bench.timing import time_iterations
from cpbench.config.bench import BenchConfig


def measure_config(config_dict: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Pool task (collective): measure one feasible configuration on this rank.

    `settings`: warmup, iters, check_max_seq_len. An external impl is measured through its
    adapter (`cpbench.bench.measure_impl`); cpbench's own path below is unchanged."""
    config = BenchConfig.from_dict(config_dict)
    device = torch_device(config)
    if config.impl != "cpbench":
        check_len = config.check_seq_len(settings["check_max_seq_len"])
        return measure_external(config, settings, device, check_len)
    dtype = TORCH_DTYPES[config.dtype]
    mesh = build_mesh(config.ulysses, config.ring)
    kernel = select_kernel(device, dtype, config.backend)
    check_len = config.check_seq_len(settings["check_max_seq_len"])
    accuracy = agreed(lambda: reference_check(config, check_len, device), device)
    # The check's tensors (the float64 reference on rank 0) are garbage now: return their
    # cached blocks, so neither timing nor the memory probe inherits them.
    release_cached_memory(device)

    backward = config.phase == "fwd+bwd"
    q, k, v, dout = random_shards(config, device)  # local shards of the run length

    def run_step(variant: Variant = "full", counter: ByteCounter | None = None) -> None:
        for t in (q, k, v):
            t.grad = None
        with torch.set_grad_enabled(backward):
            out = cp_attention(
                q,
                k,
                v,
                mesh,
                layout=config.layout,
                kernel=kernel,
                kv_replication=config.kv_replication,
                variant=variant,
                mask=config.mask,
            )
            if backward:
                with counter.phase("bwd") if counter else contextlib.nullcontext():
                    out.backward(dout)

    warmup, iters = settings["warmup"], settings["iters"]
    timings = {
        variant: time_iterations(
            functools.partial(run_step, variant), warmup, iters, device, reduce_max=False
        )
        for variant in VARIANTS
    }
    counter = ByteCounter()
    with counting(counter):
        run_step("full", counter)
    memory = measure_peak_memory(run_step, device, (q, k, v, dout))
    return {
        "rank": dist.get_rank(),
        "kernel": kernel.name,
        "kernel_version": kernel_version(kernel.name),
        "samples": timings["full"],
        "compute_samples": timings["compute"],
        "comm_samples": timings["comm"],
        "bytes": counter.as_dict(),
        "memory": memory,
        "accuracy": accuracy,
        "host": rank_environment(config.device),
    }
