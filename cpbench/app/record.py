"""The record of one configuration (`ResultRecord`): its base before it runs (`base_record`), and
the measured record (`measured_record`) from the ranks' `RankMeasurement`s, the model's analytic
numbers (bytes, memory, FLOPs) and the machine's state around the run."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Sequence
from typing import Any

from cpbench.bench.environment import machine_state
from cpbench.bench.harness import RankMeasurement
from cpbench.bench.timing import TimingSummary
from cpbench.config.bench import BenchConfig
from cpbench.config.constraints import Feasibility
from cpbench.config.geometry import Packing, rank_pairs, ring_schedule
from cpbench.config.impls import DEFAULT_IMPL
from cpbench.config.vocabulary import PASS_KEYS, PHASE_PASSES, PassKey
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.stats import overlap_estimate
from cpbench.model.flops import FLOPS_CONVENTION, flops_breakdown
from cpbench.model.formulas import comm_volume, same_bytes
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
from cpbench.model.memory import memory_estimate
from cpbench.model.ties import Interval, median_interval
from cpbench.results.scenarios.scenario import Scenario
from cpbench.results.schema import (
    SCHEMA_VERSION,
    AccuracySection,
    CollectiveBytes,
    CommSection,
    ConfigSection,
    EnvironmentSection,
    FlopsSection,
    InferenceSection,
    MachineSection,
    MemorySection,
    ResultRecord,
    TimingSection,
)

NO_VARIANTS_NOTE = (
    "compute-only and communication-only variants exist only for cpbench's own implementation; "
    "an external library is timed as a whole (no overlap figure)"
)
EXTERNAL_COMM_NOTE = (
    "measured at the torch.distributed boundary while the library ran (cpbench.impls.counting); "
    "analytic_bytes is cpbench's model of its own implementation, shown for comparison, so "
    "match is null; model_ratio = max measured over ranks / analytic, per phase"
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


def base_record(
    config: BenchConfig,
    feasibility: Feasibility,
    scenario: Scenario,
    environment: EnvironmentSection,
    equivalent: tuple[str, ...] = (),
) -> ResultRecord:
    """The record of a configuration before it runs (status ok, no measurements yet), with the
    padding its layout adds (null when the layout cannot pack it: the point is skipped)."""
    written = config.to_dict(feasibility.kv_replication if feasibility.ok else 1, None)
    if config.inference is not None:  # its own shards (split_sizes): nothing is padded
        written["padding"], written["run_seq_len"] = 0, config.seq_len
    elif (packing := packing_of(config)) is not None:
        written["padding"], written["run_seq_len"] = packing.padding, packing.seq_len
    else:
        written["padding"] = written["run_seq_len"] = None
    if equivalent:
        written["equivalent"] = list(equivalent)
    return ResultRecord(
        schema_version=SCHEMA_VERSION,
        id=config.key,
        scenario=scenario.name,
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        status="ok",
        error=None,
        config=ConfigSection.model_validate(written),
        environment=environment.model_copy(),
    )


def packing_of(config: BenchConfig) -> Packing | None:
    """The configuration's sequence as it runs on its ring (`CpProblem.packing`): documents,
    padding, each ring rank's positions; None when the layout cannot pack it."""
    try:
        return config.packing
    except CpbenchError:
        return None


def per_rank_work(config: BenchConfig) -> list[float] | None:
    """Predicted attention work of each rank: the attended (query, key) pairs of its ring rank
    (`cpbench.config.geometry.rank_pairs`, continuum convention: a causal diagonal pair counts
    1/2) x B x the query heads it computes (h / U). None when the layout cannot pack it."""
    packing = packing_of(config)
    if packing is None:
        return None
    pairs = rank_pairs(ring_schedule(packing))
    heads = config.batch * config.heads / config.ulysses
    return [pairs[rank // config.ulysses] * heads for rank in range(config.world_size)]


def hideable_share(config: BenchConfig, comm: CommSection, comm_s: float, compute_s: float) -> float:
    """The most overlap the scheme allows: an all-to-all (Ulysses) waits for its data before
    any compute, so only the ring's (or all-gather's) share of the bytes can hide; as a share
    of min(compute, comm), the overlap's denominator. 1 for a pure ring, 0 for Ulysses."""
    if config.ring == 1:
        return 0.0
    if config.ulysses == 1:
        return 1.0
    sent = [(name, b.analytic) for phase in (comm.by_collective or {}).values()
            for name, b in phase.items()]  # fmt: skip
    total = sum(analytic for _, analytic in sent)
    hideable = sum(analytic for name, analytic in sent if not name.startswith("a2a"))
    if total <= 0 or min(compute_s, comm_s) <= 0:
        return 1.0
    return min(1.0, hideable / total * comm_s / min(compute_s, comm_s))


def _slowest(runs: Sequence[Sequence[float]]) -> list[float]:
    """Each iteration's max over the ranks (the step's time: the slowest rank's)."""
    return [max(run[i] for run in runs) for i in range(len(runs[0]))]


def measured_record(
    base: ResultRecord,
    config: BenchConfig,
    per_rank: list[RankMeasurement],
    settings: dict[str, Any],
    snapshots: tuple[dict[str, Any], dict[str, Any]],
) -> ResultRecord:
    """The record of a measured configuration, from every rank's measurement and the host's
    snapshots before and after the run (`environment.host_snapshot`). One assembly for every
    step kind: an inference point (prefill, decode) has no variants and its own bytes, FLOPs
    and `inference` section; an external impl's bytes carry no verdict."""
    record = base.model_copy(deep=True)
    assert record.config is not None and record.environment is not None
    first = per_rank[0]
    step = TimingSummary.of(_slowest([r.full.samples for r in per_rank]))
    compute_iv = comm_iv = None
    if first.compute is not None and first.comm is not None:
        compute_iv = median_interval(_slowest([r.compute.samples for r in per_rank if r.compute]))
        comm_iv = median_interval(_slowest([r.comm.samples for r in per_rank if r.comm]))
    record.comm = _comm_section(config, per_rank, comm_iv.median if comm_iv else None)
    if config.inference is not None:
        variants: dict[str, Any] = {
            "phase": "fwd", "compute_only": None, "comm_only": None, "exposed_comm": None,
            "overlap_note": INFERENCE_NOTE,
        }  # fmt: skip
        record.inference = _inference_section(config, per_rank, step)
    else:
        variants = _variant_timing(config, record.comm, step, per_rank, compute_iv, comm_iv)
    record.timing = TimingSection(**_step_timing(step, per_rank, settings), **variants)
    record.config.kernel = first.kernel
    if config.impl != DEFAULT_IMPL:
        _as_external(record.comm)
    record.memory = _memory_section(config, per_rank)
    record.flops = _flops_section(config, step)
    accuracy = first.accuracy
    if accuracy is not None and first.sampled_rows is not None:
        accuracy = {**accuracy, "sampled_rows": first.sampled_rows}
    record.accuracy = AccuracySection.model_validate(accuracy) if accuracy is not None else None
    _add_environment(record, config, per_rank)
    rows = record.accuracy.sampled_rows if record.accuracy is not None else None
    if record.accuracy is not None and not record.accuracy.passed:
        record.status = "failed"
        record.error = (
            f"result differs from the reference: max abs error "
            f"{record.accuracy.max_abs_error:.3g} > {record.accuracy.tolerance:g}"
        )
        if config.inference is not None and accuracy is not None:
            record.error += (
                f" ({config.inference.phase} {config.inference.how}, checked at P "
                f"{accuracy['check_cached_len']}, T {accuracy['check_new_tokens']})"
            )
    elif rows is not None and not rows.passed:
        record.status = "failed"
        record.error = (
            f"result differs from the reference at the full length ({rows.seq_len} tokens, "
            f"{rows.rows} sampled rows): max abs error {rows.max_abs_error:.3g} > "
            f"{rows.bound:.3g}"
        )
    elif record.comm.match is False:
        record.error = "measured bytes != analytic bytes (see comm.by_collective)"
    _add_machine(record, config, *snapshots, per_rank)
    return record


def _step_timing(
    step: TimingSummary, per_rank: list[RankMeasurement], settings: dict[str, Any]
) -> dict[str, Any]:
    """The `TimingSection` fields of the whole step: its summary over the slowest rank, each
    rank's median, and how sampling stopped against the precision target."""
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


def _variant_timing(
    config: BenchConfig,
    comm_section: CommSection,
    step: TimingSummary,
    per_rank: list[RankMeasurement],
    compute_iv: Interval | None,
    comm_iv: Interval | None,
) -> dict[str, Any]:
    """A training step's `TimingSection` fields of its compute-only and communication-only
    variants and the overlap estimated from them (none for an external impl)."""
    compute = compute_iv.median if compute_iv is not None else None
    step_iv = Interval(step.median, step.ci_low, step.ci_high, len(step.samples), step.interval_method)
    overlap_value = overlap_low = overlap_high = None
    overlap_status: str | None = None
    if compute_iv is not None and comm_iv is not None:
        hideable = hideable_share(config, comm_section, comm_iv.median, compute_iv.median)
        estimate = overlap_estimate(step_iv, compute_iv, comm_iv, hideable, config.scheme)
        overlap_value, overlap_low, overlap_high = estimate.value, estimate.low, estimate.high
        overlap_status, note = estimate.status, estimate.note
    else:
        note = NO_VARIANTS_NOTE
    return {
        "phase": config.phase,
        "compute_only": compute,
        "compute_only_per_rank": (
            [statistics.median(r.compute.samples) for r in per_rank if r.compute]
            if compute_iv is not None
            else None
        ),
        "comm_only": comm_iv.median if comm_iv is not None else None,
        "exposed_comm": max(0.0, step.median - compute) if compute is not None else None,
        "overlap": overlap_value,
        "overlap_note": note,
        "compute_only_ci": [compute_iv.low, compute_iv.high] if compute_iv is not None else None,
        "comm_only_ci": [comm_iv.low, comm_iv.high] if comm_iv is not None else None,
        "overlap_low": overlap_low,
        "overlap_high": overlap_high,
        "overlap_status": overlap_status,
    }


def _memory_section(config: BenchConfig, per_rank: list[RankMeasurement]) -> MemorySection:
    """Each rank's peak; a training step's also the allocator's reserve, NVML's and the RSS
    peaks and the model's estimate (an inference record has only the peak)."""
    memory = [r.memory for r in per_rank]
    first = memory[0]

    training: dict[str, Any] = {}
    if config.inference is None:
        for key in ("reserved_peak_bytes", "nvml_process_peak_bytes", "rss_peak_bytes"):
            values = [getattr(m, key) for m in memory]  # None where no rank measured it
            training[key] = None if all(v is None for v in values) else values
        training["analytic_peak_bytes"] = memory_estimate(config).peak(PHASE_PASSES[config.phase])
    return MemorySection(
        peak_bytes=[m.peak_bytes for m in memory],
        source=first.source,
        sources={  # per field, each rank's source once (ranks agree unless NVML differs)
            key: " | ".join(dict.fromkeys(m.sources[key] for m in memory)) for key in first.sources
        },
        **training,
    )


def _flops_section(config: BenchConfig, step: TimingSummary) -> FlopsSection:
    """The step's FLOPs and the achieved rate: a training step's by `flops_breakdown` (with
    the slowest rank's and each rank's predicted work), an inference step's visible pairs."""
    spec = config.inference
    if spec is None:
        flops = flops_breakdown(config)
        model_phase = PHASE_PASSES[config.phase]
        total = flops.global_flops(model_phase)
        convention = FLOPS_CONVENTION
        training: dict[str, Any] = {
            "slowest_rank": flops.slowest_rank_flops(model_phase),
            "per_rank_work": per_rank_work(config),
        }
    else:
        case = inference_case(config, spec)
        p = case.problem
        total = float(4 * p.batch * p.heads * p.head_dim * visible_pairs(case))
        convention, training = INFERENCE_FLOPS_CONVENTION, {}
    return FlopsSection(
        convention=convention,
        global_flops=total,
        achieved_tflops=total / step.median / 1e12,
        achieved_tflops_per_rank=total / step.median / 1e12 / config.world_size,
        **training,
    )


def analytic_bytes(case: PrefillCase | DecodeCase) -> dict[str, int]:
    """Bytes one rank sends in an inference step, per collective tag (`model.inference`)."""
    if isinstance(case, PrefillCase):
        return prefill_bytes(case)
    p = case.problem
    return decode_bytes(case.new_tokens, p.ring, p.heads, p.head_dim, p.dtype, p.batch)


def visible_pairs(case: PrefillCase | DecodeCase) -> int:
    """(query, key) pairs an inference step attends over all ranks (every pair whole)."""
    if isinstance(case, PrefillCase):
        return sum(prefill_pairs_per_rank(case.cached_len, case.new_tokens, case.world))
    return sum(case.cached_len + i + 1 for i in range(case.new_tokens))


def _inference_section(
    config: BenchConfig, per_rank: list[RankMeasurement], step: TimingSummary
) -> InferenceSection:
    """TTFT or per-token latency, tokens/s, and the KV-cache bytes per rank measured against
    `kv_cache_bytes_per_rank` (prefill: `prefill_kv_bytes_per_rank`)."""
    spec = config.inference
    assert spec is not None
    case = inference_case(config, spec)
    p = case.problem
    analytic_cache = (
        prefill_kv_bytes_per_rank(case) if isinstance(case, PrefillCase)
        else kv_cache_bytes_per_rank(
            spec.total, config.world_size, p.kv_heads, p.head_dim, p.dtype, p.batch
        )
    )  # fmt: skip
    measured_cache = [r.kv_cache_bytes or 0 for r in per_rank]
    return InferenceSection(
        phase=spec.phase,
        ttft_s=step.median if spec.phase == "prefill" else None,
        step_latency_s=step.median if spec.phase == "decode" else None,
        per_token_latency_s=step.median / spec.new_tokens if spec.phase == "decode" else None,
        tokens_per_s=p.batch * spec.new_tokens / step.median,
        kv_cache_bytes_analytic=analytic_cache,
        kv_cache_bytes_measured=measured_cache,
        kv_cache_ratio=max(measured_cache) / analytic_cache,
        convention=INFERENCE_CONVENTION,
    )


def _add_environment(
    record: ResultRecord, config: BenchConfig, per_rank: list[RankMeasurement]
) -> None:
    """The hosts, devices, threads and versions the ranks reported."""
    environment, first = record.environment, per_rank[0]
    assert environment is not None
    environment.hostnames = sorted({r.host.hostname for r in per_rank})
    environment.devices = [r.host.device for r in per_rank]
    environment.torch_threads_per_rank = first.host.torch_threads
    if config.impl != DEFAULT_IMPL:
        environment.impl_version = first.impl_version
    environment.kernel_version = first.kernel_version


def _as_external(comm: CommSection) -> None:
    """Measured bytes of an external library next to cpbench's model, without a verdict."""
    comm.match = None
    comm.note = EXTERNAL_COMM_NOTE
    comm.model_ratio = {
        phase: (max(measured) / comm.analytic_bytes[phase])
        if comm.analytic_bytes.get(phase)
        else None
        for phase, measured in comm.measured_bytes.items()
    }


def _expected_bytes(config: BenchConfig) -> dict[PassKey, dict[str, int]]:
    """The bytes one rank sends, by phase and collective: cpbench's model of the scheme
    (`comm_volume`), or an inference step's (`analytic_bytes`, all "fwd")."""
    if config.inference is not None:
        return {"fwd": analytic_bytes(inference_case(config, config.inference))}
    volume = comm_volume(config)
    phases: tuple[PassKey, ...] = ("fwd", "bwd") if config.phase == "fwd+bwd" else ("fwd",)
    return {
        phase: {c.name: c.bytes_sent for c in volume.collectives(PASS_KEYS[phase])}
        for phase in phases
    }


def _comm_section(
    config: BenchConfig, per_rank: list[RankMeasurement], comm_seconds: float | None
) -> CommSection:
    by_collective: dict[PassKey, dict[str, CollectiveBytes]] = {}
    analytic: dict[PassKey, int] = {}
    measured: dict[PassKey, list[int]] = {}
    match = True
    for phase, expected in _expected_bytes(config).items():
        counted = [r.bytes.get(phase, {}) for r in per_rank]
        names = sorted(set(expected) | {n for c in counted for n in c})
        by_collective[phase] = {
            n: CollectiveBytes(analytic=expected.get(n, 0), measured=[c.get(n, 0) for c in counted])
            for n in names
        }
        analytic[phase] = sum(expected.values())
        measured[phase] = [sum(c.values()) for c in counted]
        match = match and all(same_bytes(c, expected) for c in counted)
    busbw: dict[str, Any] = {}  # a training step's bus bandwidth of its comm-only variant
    if config.inference is None:
        per_rank_bytes = max(sum(m) for m in zip(*measured.values(), strict=True)) if measured else 0
        busbw["achieved_busbw_GBps"] = (
            per_rank_bytes / comm_seconds / 1e9
            if comm_seconds and comm_seconds > 0 and per_rank_bytes
            else None
        )
    return CommSection(
        analytic_bytes=analytic,
        measured_bytes=measured,
        by_collective=by_collective,
        match=match,
        counted_at="torch.distributed",
        **busbw,
    )


def _add_machine(
    record: ResultRecord,
    config: BenchConfig,
    before: dict[str, Any],
    after: dict[str, Any],
    per_rank: list[RankMeasurement],
) -> None:
    """`environment.machine` of a measured record, and a warning when its precision target
    was not met."""
    assert record.environment is not None
    threads = record.environment.torch_threads_per_rank or 1
    gpus = [r.gpu for r in per_rank if r.gpu] or None
    ranks_cpu = [r.cpu for r in per_rank]
    state = machine_state(
        before, after, config.world_size, threads, config.device, config.nodes, gpus, ranks_cpu
    )
    timing = record.timing
    if timing is not None and timing.target_met is False:
        width = timing.relative_width or float("nan")
        cause = " on an oversubscribed machine" if state["oversubscribed"] else ""
        state["warnings"].append(
            f"precision target not met{cause}: 95% interval {width:.1%} of the median > "
            f"{timing.precision_target:.0%} after {timing.iterations} iterations "
            f"({timing.stop_reason})"
        )
    record.environment.machine = MachineSection.model_validate(state)
