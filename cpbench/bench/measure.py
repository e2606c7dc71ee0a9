"""One configuration, measured on every rank of a pool (a pool task).

Order: correctness check against the single-process reference (once, at a reduced length when
the configuration is too long for a reference), then warm-up and timed iterations of the full
step, of the compute-only variant (communication removed, same shapes) and of the
communication-only variant (kernels removed, same bytes); then one iteration under the byte
counter and one under the memory probe. Returns this rank's numbers; `sweep` assembles the
record from all ranks.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention import build_mesh, cp_attention
from cpbench.attention.comm import ByteCounter, counting
from cpbench.attention.kernels import select_kernel
from cpbench.bench.environment import rank_environment
from cpbench.bench.memory import measure_peak_memory
from cpbench.bench.timing import time_iterations
from cpbench.errors import CpbenchError
from cpbench.io.scenarios import BenchConfig
from cpbench.model.constraints import seq_divisor
from cpbench.verify import DTYPES, VerifyCase, run_case_on_rank


def check_seq_len(config: BenchConfig, cap: int) -> int:
    """The length the reference check runs at: min(L, cap) rounded down to a valid length
    (TransformerEngine also needs 2P equal chunks)."""
    divisor = seq_divisor(config.ulysses, config.ring, config.layout)
    if config.impl.startswith("transformer_engine"):
        divisor = math.lcm(divisor, 2 * config.world_size)
    return max(divisor, min(config.seq_len, cap) // divisor * divisor)


def _device(config: BenchConfig) -> torch.device:
    if config.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agreed(fn: Callable[[], Any], device: torch.device) -> Any:
    """Run `fn` on every rank; when it raises on any rank, raise on every rank.

    The reference check ends with work only rank 0 does (the float64 reference, the likeliest
    place to run out of memory); without this agreement the other ranks would walk into the
    timing collectives alone and hang there until a timeout kills them all."""
    error: Exception | None = None
    value = None
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
        error = exc
    flag = torch.tensor([0.0 if error is None else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if flag.item() > 0:
        raise CpbenchError("another rank failed during the reference check")
    return value


def random_shards(config: BenchConfig, device: torch.device) -> tuple[torch.Tensor, ...]:
    """This rank's q, k, v (requiring grad when the phase has a backward) and dout: random
    local shards of the configuration's shape (values do not matter for timing)."""
    dtype = DTYPES[config.dtype]
    local_len = config.seq_len // config.world_size
    g = torch.Generator(device=device).manual_seed(1000 + dist.get_rank())
    backward = config.phase == "fwd+bwd"

    def rand(heads: int) -> torch.Tensor:
        shape = (config.batch, local_len, heads, config.head_dim)
        return torch.randn(shape, generator=g, device=device, dtype=dtype)

    q, k, v = (
        rand(h).requires_grad_(backward) for h in (config.heads, config.kv_heads, config.kv_heads)
    )
    return q, k, v, rand(config.heads)


def reference_check(
    config: BenchConfig, check_len: int, device: torch.device
) -> dict[str, Any] | None:
    """The record's `accuracy` (rank 0; None elsewhere): the configuration, at `check_len`
    tokens, through the same path as `cpbench verify` — cpbench's or the impl's adapter."""
    case = VerifyCase(
        ulysses=config.ulysses,
        ring=config.ring,
        layout=config.layout,
        causal=config.causal,
        heads=config.heads,
        kv_heads=config.kv_heads,
        seq_len=check_len,
        head_dim=config.head_dim,
        batch=config.batch,
        dtype=config.dtype,
        kernel=config.backend,
        impl=config.impl,
    )
    result = run_case_on_rank(case, device)
    if result is None:
        return None
    accuracy = {
        "max_abs_error": result["max_error"],
        "errors": result["errors"],
        "check_seq_len": case.seq_len,
        "tolerance": result["tolerance"],
        "bounds": result["bounds"],
        "passed": result["passed"],
    }
    if "known_issues" in result:
        accuracy["tolerances"] = result["tolerances"]
        accuracy["known_issues"] = result["known_issues"]
    return accuracy


def measure_config(config_dict: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Pool task (collective): measure one feasible configuration on this rank.

    `settings`: warmup, iters, check_max_seq_len. An external impl is measured through its
    adapter (`cpbench.bench.measure_impl`); cpbench's own path below is unchanged."""
    config = BenchConfig.from_dict(config_dict)
    device = _device(config)
    if config.impl != "cpbench":
        from cpbench.bench.measure_impl import measure_external  # noqa: PLC0415

        check_len = check_seq_len(config, settings["check_max_seq_len"])
        return measure_external(config, settings, device, check_len)
    dtype = DTYPES[config.dtype]
    mesh = build_mesh(config.ulysses, config.ring)
    kernel = select_kernel(device, dtype, config.backend)
    check_len = check_seq_len(config, settings["check_max_seq_len"])
    accuracy = agreed(lambda: reference_check(config, check_len, device), device)

    backward = config.phase == "fwd+bwd"
    q, k, v, dout = random_shards(config, device)

    def run_step(variant: str = "full", counter: ByteCounter | None = None) -> None:
        for t in (q, k, v):
            t.grad = None
        with torch.set_grad_enabled(backward):
            out = cp_attention(
                q,
                k,
                v,
                mesh,
                causal=config.causal,
                layout=config.layout,
                kernel=kernel,
                kv_replication=config.kv_replication,
                variant=variant,  # type: ignore[arg-type]
            )
            if backward:
                with counter.phase("bwd") if counter else contextlib.nullcontext():
                    out.backward(dout)

    warmup, iters = settings["warmup"], settings["iters"]
    timings = {
        variant: time_iterations(
            functools.partial(run_step, variant), warmup, iters, device, reduce_max=False
        )
        for variant in ("full", "compute", "comm")
    }
    counter = ByteCounter()
    with counting(counter):
        run_step("full", counter)
    memory = measure_peak_memory(run_step, device, (q, k, v, dout))
    return {
        "rank": dist.get_rank(),
        "kernel": kernel.name,
        "samples": timings["full"],
        "compute_samples": timings["compute"],
        "comm_samples": timings["comm"],
        "bytes": counter.as_dict(),
        "memory": memory,
        "accuracy": accuracy,
        "host": rank_environment(config.device),
    }
