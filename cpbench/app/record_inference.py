"""The measured record of an inference point (prefill, decode): timing (the step whole), counted
bytes against `prefill_bytes` / `decode_bytes`, FLOPs, the check, and the `inference` section
(TTFT or per-token latency, tokens/s, KV-cache bytes against `kv_cache_bytes_per_rank`)."""

from __future__ import annotations

import statistics
from typing import Any

from cpbench.bench.measurement import RankMeasurement
from cpbench.bench.timing import TimingSummary
from cpbench.config.bench import BenchConfig
from cpbench.model.inference import (
    DecodeCase,
    PrefillCase,
    decode_bytes,
    inference_case,
    kv_cache_bytes_per_rank,
    prefill_bytes,
    prefill_kv_bytes_per_rank,
    prefill_pairs_per_rank,
)
from cpbench.results.schema import (
    AccuracySection,
    CollectiveBytes,
    CommSection,
    FlopsSection,
    InferenceSection,
    MemorySection,
    ResultRecord,
    TimingSection,
)

INFERENCE_FLOPS_CONVENTION = (
    "inference forward: 4*B*h*d_h FLOPs per visible (query, key) pair (Q K^T and P V), every "
    "visible pair counted whole (no diagonal half): prefill T*P + T*(T+1)/2 pairs, decode "
    "sum over the T new queries of (P + i + 1) keys"
)
INFERENCE_NOTE = (
    "an inference step is timed whole: its schemes have no compute-only or "
    "communication-only variants (no overlap figure)"
)
INFERENCE_CONVENTION = (
    "seconds are the step median, max over ranks of each iteration; ttft_s = seconds per "
    "prefill of T tokens on P cached; step_latency_s = seconds per decode step (the "
    "inter-token latency of one sequence at T = 1); per_token_latency_s = step / T; "
    "tokens_per_s = B*T / step; KV-cache bytes of one layer per rank (K and V; prefill: "
    "the cache shard plus the new-token shard a rank holds before the exchange)"
)


def analytic_bytes(case: PrefillCase | DecodeCase) -> dict[str, int]:
    """Bytes one rank sends in the step, per collective tag (`cpbench.model.inference`)."""
    if isinstance(case, PrefillCase):
        return prefill_bytes(case)
    p = case.problem
    return decode_bytes(case.new_tokens, p.ring, p.heads, p.head_dim, p.dtype, p.batch)


def visible_pairs(case: PrefillCase | DecodeCase) -> int:
    """(query, key) pairs the step attends over all ranks (every pair whole)."""
    if isinstance(case, PrefillCase):
        return sum(prefill_pairs_per_rank(case.cached_len, case.new_tokens, case.world))
    return sum(case.cached_len + i + 1 for i in range(case.new_tokens))


def _comm(expected: dict[str, int], per_rank: list[RankMeasurement]) -> CommSection:
    counted = [r.bytes.get("fwd", {}) for r in per_rank]
    names = sorted(set(expected) | {n for c in counted for n in c})
    return CommSection(
        analytic_bytes={"fwd": sum(expected.values())},
        measured_bytes={"fwd": [sum(c.values()) for c in counted]},
        by_collective={
            "fwd": {
                n: CollectiveBytes(
                    analytic=expected.get(n, 0), measured=[c.get(n, 0) for c in counted]
                )
                for n in names
            }
        },
        match=all(c == expected for c in counted),
        counted_at="torch.distributed",
    )


def step_timing_fields(
    step: TimingSummary, per_rank: list[RankMeasurement], settings: dict[str, Any]
) -> dict[str, Any]:
    """The `TimingSection` fields of the whole step that training and inference records fill
    alike: its summary over the slowest rank, each rank's median, and how sampling stopped
    against the precision target."""
    first = per_rank[0]
    precision = settings.get("precision")
    return {
        "median": step.median,
        "p10": step.p10,
        "p90": step.p90,
        "samples": list(step.samples),
        "per_rank_median": [statistics.median(r.full.samples) for r in per_rank],
        "ci_low": step.ci_low,
        "ci_high": step.ci_high,
        "interval_method": step.interval_method,
        "iterations": len(step.samples),
        "warmup_iterations": first.full.warmup,
        "precision_target": precision,
        "relative_width": step.relative_width,
        "target_met": None if precision is None else step.relative_width <= precision,
        "stop_reason": first.full.stop,
    }


def inference_record(
    record: ResultRecord,
    config: BenchConfig,
    per_rank: list[RankMeasurement],
    step: TimingSummary,
    settings: dict[str, Any],
) -> ResultRecord:
    """Fill `record` (a deep copy of the base) with an inference point's measurements."""
    spec = config.inference
    if spec is None or record.config is None:
        raise ValueError("inference_record needs an inference point's record")  # caller's bug
    case = inference_case(config, spec)
    first = per_rank[0]
    record.timing = TimingSection(
        **step_timing_fields(step, per_rank, settings),
        phase="fwd",
        compute_only=None,
        comm_only=None,
        exposed_comm=None,
        overlap_note=INFERENCE_NOTE,
    )
    record.comm = _comm(analytic_bytes(case), per_rank)
    record.config.kernel = first.kernel
    memory = [r.memory for r in per_rank]
    record.memory = MemorySection(
        peak_bytes=[m.peak_bytes for m in memory],
        source=first.memory.source,
        sources={k: " | ".join(dict.fromkeys(m.sources[k] for m in memory))
                 for k in first.memory.sources},
    )
    p = case.problem
    total = 4 * p.batch * p.heads * p.head_dim * visible_pairs(case)
    record.flops = FlopsSection(
        convention=INFERENCE_FLOPS_CONVENTION,
        global_flops=float(total),
        achieved_tflops=total / step.median / 1e12,
        achieved_tflops_per_rank=total / step.median / 1e12 / config.world_size,
    )
    analytic_cache = (
        prefill_kv_bytes_per_rank(case) if isinstance(case, PrefillCase)
        else kv_cache_bytes_per_rank(
            spec.total, config.world_size, p.kv_heads, p.head_dim, p.dtype, p.batch
        )
    )  # fmt: skip
    measured_cache = [r.kv_cache_bytes or 0 for r in per_rank]
    tokens = p.batch * spec.new_tokens
    record.inference = InferenceSection(
        phase=spec.phase,
        ttft_s=step.median if spec.phase == "prefill" else None,
        step_latency_s=step.median if spec.phase == "decode" else None,
        per_token_latency_s=step.median / spec.new_tokens if spec.phase == "decode" else None,
        tokens_per_s=tokens / step.median,
        kv_cache_bytes_analytic=analytic_cache,
        kv_cache_bytes_measured=measured_cache,
        kv_cache_ratio=max(measured_cache) / analytic_cache,
        convention=INFERENCE_CONVENTION,
    )
    checked = first.accuracy
    if checked is not None:
        record.accuracy = AccuracySection.model_validate(checked)
    if checked is not None and record.accuracy is not None and not record.accuracy.passed:
        record.status = "failed"
        record.error = (
            f"result differs from the reference: max abs error "
            f"{record.accuracy.max_abs_error:.3g} > {record.accuracy.tolerance:g} "
            f"({spec.phase} {spec.how}, checked at P {checked['check_cached_len']}, "
            f"T {checked['check_new_tokens']})"
        )
    elif record.comm.match is False:
        record.error = "measured bytes != analytic bytes (see comm.by_collective)"
    return record
