"""One inference configuration (a prefill with a cached prefix, or a decode step), measured on
every rank of a pool. The order: docs/design.md section 7."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention.comm import ByteCounter, counting
from cpbench.attention.inference import prefill_attention, shard_prefill
from cpbench.attention.inference_decode import decode_attention, shard_cache
from cpbench.attention.kernels import LocalKernel, kernel_version, select_kernel
from cpbench.attention.mesh import build_mesh
from cpbench.bench import inference_verify
from cpbench.bench.environment import RankHost, gpu_clock_state, rank_environment
from cpbench.bench.measurement import RankMeasurement
from cpbench.bench.memory import measure_peak_memory, release_cached_memory
from cpbench.bench.reference import TORCH_DTYPES, agreed
from cpbench.bench.timing import TimingPolicy, time_to_precision
from cpbench.config.bench import BenchConfig
from cpbench.model.inference import DecodeCase, PrefillCase, inference_case


def check_case(case: PrefillCase | DecodeCase, max_len: int) -> PrefillCase | DecodeCase:
    """The case the reference check runs: the case itself when P + T <= max_len, else P and
    T scaled by max_len / (P + T) (T at least 1; a decode step keeps its T, P = max_len - T)."""
    total = case.cached_len + case.new_tokens
    if total <= max_len:
        return case
    if isinstance(case, DecodeCase):
        new_tokens = case.new_tokens
        cached_len = max(0, max_len - new_tokens)
    else:
        new_tokens = max(1, case.new_tokens * max_len // total)
        cached_len = max(0, max_len - new_tokens)
    problem = replace(case.problem, seq_len=cached_len + new_tokens)
    return replace(case, problem=problem, cached_len=cached_len, new_tokens=new_tokens)


def _accuracy(checked: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record's `accuracy` of rank 0's verify record (None on the other ranks); the
    output's error against its bound (the bytes are judged on the timed step)."""
    if checked is None:
        return None
    error, bound = checked["max_error"], checked["tolerance"]
    return {
        "max_abs_error": error,
        "errors": {"out": error},
        "check_seq_len": checked["cached_len"] + checked["new_tokens"],
        "tolerance": bound,
        "bounds": {"out": bound},
        "passed": error <= bound,
        "check_cached_len": checked["cached_len"],
        "check_new_tokens": checked["new_tokens"],
    }


def _check(
    case: PrefillCase | DecodeCase, device: torch.device, kernel: LocalKernel
) -> dict[str, Any] | None:
    """Collective: the reference check of `case` (rank 0 gets its verify record)."""
    if isinstance(case, PrefillCase):
        return inference_verify.run_prefill_case_on_rank(case, device, kernel)
    return inference_verify.run_decode_case_on_rank(case, device, kernel)


def measure_inference(
    config: BenchConfig, settings: dict[str, Any], device: torch.device
) -> RankMeasurement:
    """Pool task body (collective): check, time, count and probe one inference point."""
    step_spec = config.inference
    if step_spec is None:
        raise ValueError("measure_inference needs an inference point")  # the caller's bug
    case = inference_case(config, step_spec)
    dtype = TORCH_DTYPES[config.dtype]
    kernel = select_kernel(device, dtype, config.kernel, band=False, head_dim=config.head_dim)
    checked = check_case(case, int(settings["check_max_seq_len"]))
    accuracy = _accuracy(agreed(lambda: _check(checked, device, kernel), device))
    release_cached_memory(device)
    q, k, v = inference_verify.case_inputs(case, device)
    mesh = build_mesh(config.ulysses, config.ring)
    if isinstance(case, PrefillCase):
        lq, lk, lv = (t.to(dtype) for t in shard_prefill(q, k, v, mesh, case.cached_len))
        step = functools.partial(
            prefill_attention,
            lq, lk, lv, mesh, case.cached_len, case.new_tokens, case.scheme, kernel,
        )
    else:
        lq = q.to(dtype)
        lk, lv = (t.to(dtype) for t in shard_cache(k, v, mesh, case.layout))
        step = functools.partial(
            decode_attention, lq, lk, lv, mesh, case.cached_len, case.layout, kernel
        )
    del q, k, v  # the global inputs: only the shards stay for timing
    timed = time_to_precision(step, TimingPolicy.from_settings(settings), device)
    counter = ByteCounter()
    with counting(counter):
        step()
    memory = measure_peak_memory(step, device, (lq, lk, lv))
    return RankMeasurement(
        rank=dist.get_rank(),
        kernel=kernel.name,
        kernel_version=kernel_version(kernel.name),
        full=timed,
        compute=None,
        comm=None,
        bytes=counter.as_dict(),
        memory=memory,
        accuracy=accuracy,
        host=RankHost(**rank_environment(config.device)),
        gpu=gpu_clock_state(device.index or 0) if device.type == "cuda" else None,
        kv_cache_bytes=int(lk.nbytes + lv.nbytes),
    )
