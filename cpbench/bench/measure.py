"""One configuration, measured on every rank of a pool (a pool task).

The order (checks, timed variants, byte counter, memory probe): docs/design.md section 7."""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import replace
from typing import Any

import torch

from cpbench.attention import build_mesh, cp_attention
from cpbench.attention.api import mask_needs_band
from cpbench.attention.comm import ByteCounter
from cpbench.attention.inference import prefill_attention, shard_prefill
from cpbench.attention.inference_decode import decode_attention, shard_cache
from cpbench.attention.kernels import LocalKernel, kernel_version, select_kernel
from cpbench.attention.ring import VARIANTS, Variant
from cpbench.bench import inference_verify
from cpbench.bench.environment import rank_cpu_mark, rank_cpu_usage
from cpbench.bench.harness import Prepared, RankMeasurement, Step, StepKind, measure_step
from cpbench.bench.reference import TORCH_DTYPES, random_shards, reference_check, torch_device
from cpbench.bench.rowcheck import DEFAULT_ROWS, full_length_row_check
from cpbench.bench.timing import TimingPolicy, time_to_precision
from cpbench.config.bench import BenchConfig
from cpbench.impls import get_adapter
from cpbench.impls.counting import library_counting
from cpbench.model.inference import DecodeCase, PrefillCase, inference_case


def measure_config(config_dict: dict[str, Any], settings: dict[str, Any]) -> RankMeasurement:
    """Pool task (collective): measure one feasible configuration on this rank, its step kind
    through the one harness (`measure_step`); `cpu`: this rank's CPU seconds in the task.

    `settings`: warmup, iters (the minimum), max_iters, precision (None = a fixed count of
    iters), budget (seconds of timed steps), check_max_seq_len, check_rows (rows of the
    full-length check)."""
    mark = rank_cpu_mark()
    config = BenchConfig.from_dict(config_dict)
    device = torch_device(config)
    if config.inference is not None:  # prefill or decode: its own check, step and bytes
        kind = inference_kind(config, settings, device)
    elif config.impl != "cpbench":
        kind = library_kind(config, settings, device)
    else:
        kind = training_kind(config, settings, device)
    return replace(measure_step(kind, config, settings, device), cpu=rank_cpu_usage(mark))


# ---------------------------------------------------------- cpbench's own scheme (training)


def training_kind(config: BenchConfig, settings: dict[str, Any], device: torch.device) -> StepKind:
    """cpbench's step: the full step and its compute-only and communication-only variants."""
    check_len = config.check_seq_len(settings["check_max_seq_len"])
    mesh = build_mesh(config.ulysses, config.ring)
    kernel = _kernel(config, device)
    rows = int(settings.get("check_rows", DEFAULT_ROWS))

    def prepare() -> Prepared:
        tensors = random_shards(config, device)  # local shards of the run length
        step = functools.partial(run_step, config, mesh, kernel, tensors)
        return Prepared(step, tensors, kernel.name, kernel_version(kernel.name), variants=VARIANTS)

    return StepKind(
        check=lambda: reference_check(config, check_len, device),
        row_check=(lambda: full_length_row_check(config, kernel, device, rows))
        if check_len < config.seq_len and rows > 0
        else None,
        prepare=prepare,
    )


def measure_interleaved(config_dicts: list[dict[str, Any]], settings: dict[str, Any]) -> list[float]:
    """Pool task (collective): re-measure tied configurations interleaved, A B A B ..., so that
    slow drift of the machine falls on all of them alike (`sweep --separate-ties`).

    Each round times one full step of every configuration (barrier, time, max over ranks); the
    rounds go on past `iters` (at least 6) until the ranking of the medians' intervals is
    clear (`ties.rank_with_ties`), or max_iters rounds, or the budget x the number of
    configurations. Returns the max-over-ranks samples, one list per configuration, flattened
    in round order: [round 0: A, B, ...; round 1: A, B, ...] (the caller splits them)."""
    from cpbench.model.ties import median_interval, rank_with_ties  # noqa: PLC0415

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
            q, k, v, mesh, layout=config.layout, kernel=kernel,
            kv_replication=config.kv_replication, variant=variant, mask=config.mask,
            cp_comm=config.cp_comm, heads_k_stride=config.heads_k_stride,
        )  # fmt: skip
        if backward:
            with counter.phase("bwd") if counter else contextlib.nullcontext():
                out.backward(dout)


# ------------------------------------------------------------- an external impl (library)


def kernel_label(kernel: str) -> str:
    """The adapter's local kernel; flash-attn marked when it is the tests' CPU stand-in."""
    flash_attn = sys.modules.get("flash_attn")
    if kernel == "flash_attn" and getattr(flash_attn, "STAND_IN", False):
        return "flash_attn (CPU stand-in)"
    return kernel


def adapter_step(runner: Any, tensors: tuple[torch.Tensor, ...], backward: bool = True) -> Step:
    """One step of an impl adapter's `runner` on this rank's shards (q, k, v, dout), inside its
    step context; the backward for fwd+bwd (counted as "bwd" when a `counter` is counting)."""
    q, k, v, dout = tensors

    def step(variant: Variant = "full", counter: ByteCounter | None = None) -> None:
        for t in (q, k, v):
            t.grad = None
        with runner.context(), torch.set_grad_enabled(backward):
            out = runner.forward(q, k, v)
            if backward:
                with counter.phase("bwd") if counter else contextlib.nullcontext():
                    out.backward(dout)

    return step


def library_kind(config: BenchConfig, settings: dict[str, Any], device: torch.device) -> StepKind:
    """An external impl through its adapter: checked through the adapter, timed whole (no
    compute-only or communication-only variant: those remove cpbench's own transfers or
    kernels), its bytes counted at the library boundary (`impls.counting`)."""
    check_len = config.check_seq_len(settings["check_max_seq_len"])
    adapter = get_adapter(config.impl)

    def prepare() -> Prepared:
        runner = adapter.prepare(config)
        tensors = random_shards(config, device)
        step = adapter_step(runner, tensors, config.phase == "fwd+bwd")
        return Prepared(step, tensors, kernel_label(adapter.kernel), impl_version=adapter.version())

    return StepKind(
        check=lambda: reference_check(config, check_len, device),
        prepare=prepare,
        counting=library_counting,
        gpu_clocks=False,
    )


# ------------------------------------------------------------ inference (prefill, decode)


def check_case(case: PrefillCase | DecodeCase, max_len: int) -> PrefillCase | DecodeCase:
    """The case the reference check runs: the case itself when P + T <= max_len, else P and
    T scaled by max_len / (P + T) (T at least 1; a decode step keeps its T, P = max_len - T)."""
    total = case.cached_len + case.new_tokens
    if total <= max_len:
        return case
    decode = isinstance(case, DecodeCase)
    new_tokens = case.new_tokens if decode else max(1, case.new_tokens * max_len // total)
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


def inference_kind(
    config: BenchConfig, settings: dict[str, Any], device: torch.device
) -> StepKind:
    """A prefill or decode step: checked by `bench.inference_verify` at min(P + T,
    check_max_seq_len) keys, timed whole (no variants), with the cache bytes this rank holds."""
    step_spec = config.inference
    if step_spec is None:
        raise ValueError("inference_kind needs an inference point")  # the caller's bug
    case = inference_case(config, step_spec)
    dtype = TORCH_DTYPES[config.dtype]
    kernel = select_kernel(device, dtype, config.kernel, band=False, head_dim=config.head_dim)
    checked = check_case(case, int(settings["check_max_seq_len"]))

    def prepare() -> Prepared:
        q, k, v = inference_verify.case_inputs(case, device)
        mesh = build_mesh(config.ulysses, config.ring)
        if isinstance(case, PrefillCase):
            lq, lk, lv = (t.to(dtype) for t in shard_prefill(q, k, v, mesh, case.cached_len))
            run = functools.partial(
                prefill_attention,
                lq, lk, lv, mesh, case.cached_len, case.new_tokens, case.scheme, kernel,
            )
        else:
            lq = q.to(dtype)
            lk, lv = (t.to(dtype) for t in shard_cache(k, v, mesh, case.layout))
            run = functools.partial(
                decode_attention, lq, lk, lv, mesh, case.cached_len, case.layout, kernel
            )
        del q, k, v  # the global inputs: only the shards stay for timing

        def step(variant: Variant = "full", counter: ByteCounter | None = None) -> None:
            run()

        return Prepared(
            step, (lq, lk, lv), kernel.name, kernel_version(kernel.name),
            kv_cache_bytes=int(lk.nbytes + lv.nbytes),
        )  # fmt: skip

    return StepKind(
        check=lambda: _accuracy(inference_verify.run_inference_case_on_rank(checked, device, kernel)),
        prepare=prepare,
    )
