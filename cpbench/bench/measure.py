"""One configuration, measured on every rank of a pool (a pool task).

The order (checks, timed variants, byte counter, memory probe): docs/design.md section 7."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention import build_mesh, cp_attention
from cpbench.attention.api import mask_needs_band
from cpbench.attention.comm import ByteCounter, counting
from cpbench.attention.kernels import LocalKernel, kernel_version, select_kernel
from cpbench.attention.ring import VARIANTS, Variant
from cpbench.bench.environment import (
    RankHost,
    gpu_clock_state,
    rank_cpu_mark,
    rank_cpu_usage,
    rank_environment,
)
from cpbench.bench.measure_impl import measure_external
from cpbench.bench.measure_inference import measure_inference
from cpbench.bench.measurement import RankMeasurement
from cpbench.bench.memory import measure_peak_memory, release_cached_memory
from cpbench.bench.reference import (
    TORCH_DTYPES,
    agreed,
    random_shards,
    reference_check,
    torch_device,
)
from cpbench.bench.rowcheck import DEFAULT_ROWS, full_length_row_check
from cpbench.bench.timing import TimedRun, TimingPolicy, time_to_precision
from cpbench.config.bench import BenchConfig


def measure_config(config_dict: dict[str, Any], settings: dict[str, Any]) -> RankMeasurement:
    """Pool task (collective): measure one feasible configuration on this rank.

    `settings`: warmup, iters (the minimum), max_iters, precision (None = a fixed count of
    iters), budget (seconds of timed steps), check_max_seq_len, check_rows (rows of the
    full-length check). An external impl is measured through its adapter
    (`cpbench.bench.measure_impl`), an inference point (prefill, decode) by
    `cpbench.bench.measure_inference`. Either answer carries `cpu`: the CPU seconds this rank's
    process used in the task (`environment.rank_cpu_usage`), for the record's other-load
    measurement."""
    mark = rank_cpu_mark()
    return replace(_measure_config(config_dict, settings), cpu=rank_cpu_usage(mark))


def _measure_config(config_dict: dict[str, Any], settings: dict[str, Any]) -> RankMeasurement:
    config = BenchConfig.from_dict(config_dict)
    device = torch_device(config)
    if config.inference is not None:  # prefill or decode: its own check, step and bytes
        return measure_inference(config, settings, device)
    check_len = config.check_seq_len(settings["check_max_seq_len"])
    if config.impl != "cpbench":
        return measure_external(config, settings, device, check_len)
    mesh = build_mesh(config.ulysses, config.ring)
    kernel = _kernel(config, device)
    accuracy = agreed(lambda: reference_check(config, check_len, device), device)
    rows = int(settings.get("check_rows", DEFAULT_ROWS))
    sampled = None
    if check_len < config.seq_len and rows > 0:
        sampled = agreed(lambda: full_length_row_check(config, kernel, device, rows), device)
    # The check's tensors (the float64 reference on rank 0) are garbage now: return their
    # cached blocks, so neither timing nor the memory probe inherits them.
    release_cached_memory(device)
    tensors = random_shards(config, device)  # local shards of the run length
    step = functools.partial(run_step, config, mesh, kernel, tensors)
    timings: dict[str, TimedRun] = {
        variant: time_to_precision(
            functools.partial(step, variant),
            TimingPolicy.from_settings(settings, 1.0 if variant == "full" else 0.5),
            device,
        )
        for variant in VARIANTS
    }
    counter = ByteCounter()
    with counting(counter):
        step("full", counter)
    memory = measure_peak_memory(step, device, tensors)
    return RankMeasurement(
        rank=dist.get_rank(),
        kernel=kernel.name,
        kernel_version=kernel_version(kernel.name),
        full=timings["full"],
        compute=timings["compute"],
        comm=timings["comm"],
        bytes=counter.as_dict(),
        memory=memory,
        accuracy=accuracy,
        sampled_rows=sampled,
        host=RankHost(**rank_environment(config.device)),
        gpu=gpu_clock_state(device.index or 0) if device.type == "cuda" else None,
    )


def measure_interleaved(config_dicts: list[dict[str, Any]], settings: dict[str, Any]) -> list[float]:
    """Pool task (collective): re-measure tied configurations interleaved, A B A B ..., so that
    slow drift of the machine falls on all of them alike (`sweep --separate-ties`).

    Each round times one full step of every configuration (barrier, time, max over ranks); the
    rounds go on past `iters` (at least 6) until the ranking of the medians' intervals is
    clear (`stats.rank_with_ties`), or max_iters rounds, or the budget x the number of
    configurations. Returns the max-over-ranks samples, one list per configuration, flattened
    in round order: [round 0: A, B, ...; round 1: A, B, ...] (the caller splits them)."""
    from cpbench.model.calibrate.stats import median_interval, rank_with_ties  # noqa: PLC0415

    configs = [BenchConfig.from_dict(d) for d in config_dicts]
    device = torch_device(configs[0])
    steps = [
        functools.partial(
            run_step, c, build_mesh(c.ulysses, c.ring), _kernel(c, device), random_shards(c, device)
        )
        for c in configs
    ]
    policy = TimingPolicy.from_settings(settings, float(len(configs)))
    for step in steps:  # one warm-up each: the inputs are new
        step()
    samples: list[list[float]] = [[] for _ in steps]
    while True:
        for i, step in enumerate(steps):
            samples[i].extend(
                time_to_precision(
                    step, TimingPolicy(warmup=0, min_iters=1, precision=None), device
                ).max_samples
            )
        n = len(samples[0])
        if n >= max(6, policy.min_iters):
            ranked = rank_with_ties({str(i): median_interval(s) for i, s in enumerate(samples)})
            if ranked.clear or n >= policy.max_iters or sum(map(sum, samples)) >= policy.budget_s:
                break
    return [x for round_ in zip(*samples, strict=True) for x in round_]


def _kernel(config: BenchConfig, device: torch.device) -> LocalKernel:
    """The local kernel the configuration's step runs (its mask may need a band kernel)."""
    band = mask_needs_band(config)
    return select_kernel(
        device, TORCH_DTYPES[config.dtype], config.kernel, band=band, head_dim=config.head_dim
    )


def run_step(
    config: BenchConfig,
    mesh: Any,
    kernel: LocalKernel,
    tensors: tuple[torch.Tensor, ...],
    variant: Variant = "full",
    counter: ByteCounter | None = None,
) -> None:
    """One measured step of cpbench's implementation on this rank: the configuration's
    attention (its `variant`) over the local shards `tensors` (q, k, v, dout), and the
    backward pass for fwd+bwd (counted as "bwd" when a `counter` is counting)."""
    q, k, v, dout = tensors
    for t in (q, k, v):
        t.grad = None
    backward = config.phase == "fwd+bwd"
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
            cp_comm=config.cp_comm,
            heads_k_stride=config.heads_k_stride,
        )
        if backward:
            with counter.phase("bwd") if counter else contextlib.nullcontext():
                out.backward(dout)
