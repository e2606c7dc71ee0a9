"""`cpbench sweep` / `cpbench run`: run every configuration of a scenario and append one record
per configuration to a JSONL file as soon as it ends.

Locally the ranks are a persistent `WorkerPool` (spawned once per sweep, re-spawned only after
a failure that may have left ranks stuck). Under torchrun (or SLURM) the processes already form
the world: every process runs this same loop in place (`InProcessWorld`), rank 0 writes.
A configuration that raises, runs out of memory or hangs is recorded as failed/timeout and the
sweep goes on; Ctrl-C stops it, keeping every record already written. (A launched world whose
rank cannot be interrupted ends the job instead, with that record written; `--resume` goes on:
see `cpbench.bench.world`.)

Each distinct configuration is measured once (`Scenario.distinct`: every layout at ring degree
1 is the contiguous one; the other names are listed in `config.equivalent`), to a stated
precision (`cpbench.bench.timing.time_to_precision`), with the machine's state around it
(`environment.machine`). With `separate_ties`, the records of a block of consecutive points
of one problem are held until the block ends; the tied leaders of each of its groups are then
re-measured interleaved (`cpbench.bench.measure.measure_interleaved`) and the records written
with that `timing.tiebreak`.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cpbench.bench.timing import TimingSummary
from cpbench.bench.world import InProcessWorld, World, launched_by_torchrun
from cpbench.config.bench import BenchConfig
from cpbench.config.constraints import Feasibility
from cpbench.config.geometry import Packing, pack, rank_pairs, ring_schedule
from cpbench.config.impls import DEFAULT_IMPL
from cpbench.config.vocabulary import PHASE_PASSES, Pass
from cpbench.errors import CpbenchError, RunFailure
from cpbench.model.calibrate.stats import (
    Interval,
    median_interval,
    overlap_estimate,
    rank_with_ties,
)
from cpbench.model.flops import FLOPS_CONVENTION, flops_breakdown
from cpbench.model.formulas import comm_volume
from cpbench.model.memory import memory_estimate
from cpbench.results.frame import rank_group
from cpbench.results.scenarios.scenario import Scenario
from cpbench.results.schema import (
    SCHEMA_VERSION,
    AccuracySection,
    CollectiveBytes,
    CommSection,
    ConfigSection,
    Direction,
    EnvironmentSection,
    FlopsSection,
    MachineSection,
    MemorySection,
    ResultRecord,
    TimingSection,
    dump_record,
)
from cpbench.results.store import (
    append_record,
    clear_inflight,
    completed_ids,
    mark_inflight,
    take_inflight,
)

PHASE_KEYS: dict[Direction, Pass] = {"fwd": "forward", "bwd": "backward"}
NO_VARIANTS_NOTE = (
    "compute-only and communication-only variants exist only for cpbench's own implementation; "
    "an external library is timed as a whole (no overlap figure)"
)


@dataclass
class SweepResult:
    """What a sweep did; the records are also in `path`."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0
    interrupted: bool = False
    wall_seconds: float = 0.0
    spawns: int = 0
    duplicates: int = 0
    """Points of the scenario that were the same computation as another (measured once)."""
    points: int = 0
    """Distinct configurations of the scenario."""

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def default_output(scenario: Scenario, results_dir: Path = Path("results")) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return results_dir / f"{scenario.name}-{stamp}.jsonl"


def _base_record(
    config: BenchConfig,
    feasibility: Feasibility,
    scenario: Scenario,
    environment: EnvironmentSection,
    equivalent: tuple[str, ...] = (),
) -> ResultRecord:
    """The record of a configuration before it runs (status ok, no measurements yet), with the
    padding its layout adds (null when the layout cannot pack it: the point is skipped)."""
    packing = packing_of(config)
    written = config.to_dict(feasibility.kv_replication if feasibility.ok else 1, None)
    written["padding"] = packing.padding if packing is not None else None
    written["run_seq_len"] = packing.seq_len if packing is not None else None
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
    """The configuration's sequence as it runs on its ring (`cpbench.config.geometry.pack`):
    documents, padding, each ring rank's positions; None when the layout cannot pack it."""
    try:
        return pack(config.mask, config.seq_len, config.ulysses, config.ring, config.layout)
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
    total = sum(b.analytic for phase in (comm.by_collective or {}).values() for b in phase.values())
    hideable = sum(
        b.analytic
        for phase in (comm.by_collective or {}).values()
        for name, b in phase.items()
        if not name.startswith("a2a")
    )
    if total <= 0 or min(compute_s, comm_s) <= 0:
        return 1.0
    return min(1.0, hideable / total * comm_s / min(compute_s, comm_s))


def assemble_record(
    base: ResultRecord,
    config: BenchConfig,
    per_rank: list[dict[str, Any]],
    settings: dict[str, Any] | None = None,
) -> ResultRecord:
    """The record of a measured configuration, from every rank's `measure_config` answer."""
    record = base.model_copy(deep=True)
    assert record.config is not None and record.environment is not None
    iters = len(per_rank[0]["samples"])

    def max_over_ranks(key: str) -> list[float]:
        return [max(r[key][i] for r in per_rank) for i in range(iters)]

    def max_over_ranks_of(key: str) -> list[float]:
        n = len(per_rank[0][key])
        return [max(r[key][i] for r in per_rank) for i in range(n)]

    step = TimingSummary.of(max_over_ranks("samples"))
    variants = per_rank[0]["compute_samples"] is not None
    compute_iv = median_interval(max_over_ranks_of("compute_samples")) if variants else None
    comm_iv = median_interval(max_over_ranks_of("comm_samples")) if variants else None
    compute = compute_iv.median if compute_iv is not None else None
    comm = comm_iv.median if comm_iv is not None else None
    record.comm = _comm_section(config, per_rank, comm)
    step_iv = Interval(step.median, step.ci_low, step.ci_high, len(step.samples), step.interval_method)
    overlap_value = overlap_low = overlap_high = None
    overlap_status: str | None = None
    if compute_iv is not None and comm_iv is not None:
        hideable = hideable_share(config, record.comm, comm_iv.median, compute_iv.median)
        estimate = overlap_estimate(step_iv, compute_iv, comm_iv, hideable, config.scheme)
        overlap_value, overlap_low, overlap_high = estimate.value, estimate.low, estimate.high
        overlap_status, note = estimate.status, estimate.note
    else:
        note = NO_VARIANTS_NOTE
    precision = settings.get("precision") if settings else None
    stops = per_rank[0].get("stop") or {}
    warm = per_rank[0].get("warmup_iterations") or {}
    record.timing = TimingSection(
        phase=config.phase,
        median=step.median,
        p10=step.p10,
        p90=step.p90,
        samples=list(step.samples),
        per_rank_median=[statistics.median(r["samples"]) for r in per_rank],
        compute_only=compute,
        compute_only_per_rank=(
            [statistics.median(r["compute_samples"]) for r in per_rank] if variants else None
        ),
        comm_only=comm,
        exposed_comm=max(0.0, step.median - compute) if compute is not None else None,
        overlap=overlap_value,
        overlap_note=note,
        ci_low=step.ci_low,
        ci_high=step.ci_high,
        interval_method=step.interval_method,
        iterations=len(step.samples),
        warmup_iterations=warm.get("full"),
        precision_target=precision,
        relative_width=step.relative_width,
        target_met=None if precision is None else step.relative_width <= precision,
        stop_reason=stops.get("full", "fixed count"),
        compute_only_ci=[compute_iv.low, compute_iv.high] if compute_iv is not None else None,
        comm_only_ci=[comm_iv.low, comm_iv.high] if comm_iv is not None else None,
        overlap_low=overlap_low,
        overlap_high=overlap_high,
        overlap_status=overlap_status,
    )
    record.config.kernel = per_rank[0]["kernel"]
    if config.impl != DEFAULT_IMPL:
        _as_external(record.comm)
    model_phase = PHASE_PASSES[config.phase]
    analytic_memory = memory_estimate(_model_config(config)).peak(model_phase)
    record.memory = MemorySection(
        peak_bytes=[r["memory"]["peak_bytes"] for r in per_rank],
        source=per_rank[0]["memory"]["source"],
        reserved_peak_bytes=_per_rank_or_none(per_rank, "reserved_peak_bytes"),
        nvml_process_peak_bytes=_per_rank_or_none(per_rank, "nvml_process_peak_bytes"),
        rss_peak_bytes=_per_rank_or_none(per_rank, "rss_peak_bytes"),
        sources={  # per field, each rank's source once (ranks agree unless NVML differs)
            key: " | ".join(dict.fromkeys(r["memory"]["sources"][key] for r in per_rank))
            for key in per_rank[0]["memory"]["sources"]
        },
        analytic_peak_bytes=analytic_memory,
    )
    flops = flops_breakdown(config)
    total = flops.global_flops(model_phase)
    record.flops = FlopsSection(
        convention=FLOPS_CONVENTION,
        global_flops=total,
        slowest_rank=flops.slowest_rank_flops(model_phase),
        achieved_tflops=total / step.median / 1e12,
        achieved_tflops_per_rank=total / step.median / 1e12 / config.world_size,
        per_rank_work=per_rank_work(config),
    )
    accuracy = per_rank[0]["accuracy"]
    sampled = per_rank[0].get("sampled_rows")
    if accuracy is not None and sampled is not None:
        accuracy = {**accuracy, "sampled_rows": sampled}
    record.accuracy = AccuracySection.model_validate(accuracy) if accuracy is not None else None
    environment = record.environment
    environment.hostnames = sorted({r["host"]["hostname"] for r in per_rank})
    environment.devices = [r["host"]["device"] for r in per_rank]
    environment.torch_threads_per_rank = per_rank[0]["host"]["torch_threads"]
    if config.impl != DEFAULT_IMPL:
        environment.impl_version = per_rank[0].get("impl_version")
    environment.kernel_version = per_rank[0].get("kernel_version")
    rows = record.accuracy.sampled_rows if record.accuracy is not None else None
    if record.accuracy is not None and not record.accuracy.passed:
        record.status = "failed"
        record.error = (
            f"result differs from the reference: max abs error "
            f"{record.accuracy.max_abs_error:.3g} > {record.accuracy.tolerance:g}"
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
    return record


EXTERNAL_COMM_NOTE = (
    "measured at the torch.distributed boundary while the library ran (cpbench.impls.counting); "
    "analytic_bytes is cpbench's model of its own implementation, shown for comparison, so "
    "match is null; model_ratio = max measured over ranks / analytic, per phase"
)


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


def _per_rank_or_none(per_rank: list[dict[str, Any]], key: str) -> list[int | None] | None:
    values = [r["memory"][key] for r in per_rank]
    return None if all(v is None for v in values) else values


def _model_config(config: BenchConfig) -> BenchConfig:
    """The model's view of the point: the point itself (a `CpProblem`)."""
    return config


def _comm_section(
    config: BenchConfig,
    per_rank: list[dict[str, Any]],
    comm_seconds: float | None,
) -> CommSection:
    volume = comm_volume(_model_config(config))
    phases: tuple[Direction, ...] = ("fwd", "bwd") if config.phase == "fwd+bwd" else ("fwd",)
    by_collective: dict[Direction, dict[str, CollectiveBytes]] = {}
    analytic: dict[Direction, int] = {}
    measured: dict[Direction, list[int]] = {}
    match = True
    for phase in phases:
        expected = {c.name: c.bytes_sent for c in volume.collectives(PHASE_KEYS[phase])}
        counted = [r["bytes"].get(phase, {}) for r in per_rank]
        names = sorted(set(expected) | {n for c in counted for n in c})
        by_collective[phase] = {
            n: CollectiveBytes(analytic=expected.get(n, 0), measured=[c.get(n, 0) for c in counted])
            for n in names
        }
        analytic[phase] = sum(expected.values())
        measured[phase] = [sum(c.values()) for c in counted]
        match = match and all(c == expected for c in counted)
    per_rank_bytes = max(sum(m) for m in zip(*measured.values(), strict=True)) if measured else 0
    return CommSection(
        analytic_bytes=analytic,
        measured_bytes=measured,
        by_collective=by_collective,
        match=match,
        achieved_busbw_GBps=per_rank_bytes / comm_seconds / 1e9
        if comm_seconds and comm_seconds > 0 and per_rank_bytes
        else None,
    )


def impl_skip_reason(config: BenchConfig) -> str | None:
    """Why an external impl cannot run a (mesh-feasible) configuration; None for cpbench's
    own or a supported one."""
    if config.impl == DEFAULT_IMPL:
        return None
    if config.cp_comm == "all_gather":
        return (
            "cp_comm all_gather is cpbench's own scheme; "
            f"the {config.impl} impl runs its own exchange"
        )
    from cpbench.impls import skip_reason  # noqa: PLC0415

    return skip_reason(config)


def _task_config(record: ResultRecord) -> dict[str, Any]:
    """The record's config as the ranks' task takes it (`BenchConfig.from_dict`)."""
    assert record.config is not None
    return record.config.model_dump(mode="json")


def _failure_message(exc: BaseException) -> str:
    text = str(exc)
    if "out of memory" in text.lower():
        return f"out of memory: {text}"
    return text


INFLIGHT_ERROR = (
    "the job ended while this configuration ran (started {started}, timeout {timeout:g} s): a "
    "rank was killed, hung where it could not be stopped, or the job was cancelled; see the "
    "job's log. Recorded by --resume; delete this line to measure it again."
)
"""The error of a configuration found in flight by `--resume` (`cpbench.results.store`)."""


def _prepare_output(out: Path, resume: bool, launched: bool = False) -> set[str]:
    """Check that `out` can take the sweep (fail before anything is measured); return the ids
    already recorded in it when resuming. In a launched world, a configuration that was in
    flight when an earlier job died (its marker) is recorded as failed first."""
    if out.exists() and out.stat().st_size > 0 and not resume:
        raise CpbenchError(
            f"output {out} already has records: pass --resume to continue it, "
            f"or --out for a new file"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise CpbenchError(f"cannot write results to {out}: {exc.strerror or exc}") from None
    if not resume:
        clear_inflight(out)
        return set()
    done = completed_ids(out)
    dead = take_inflight(out) if launched else None
    if dead is not None and dead["id"] not in done:
        append_record(out, dead)
        done.add(dead["id"])
    if launched:
        clear_inflight(out)  # after the append: a crash in between keeps the marker
    return done


def run_sweep(
    scenario: Scenario,
    device: str,
    world_size: int,
    out: Path,
    resume: bool = False,
    timeout: float | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[BenchConfig], None] | None = None,
    respawn_each: bool = False,
    task: Callable[..., dict[str, Any]] | None = None,
    precision: float | None | Literal["scenario"] = "scenario",
    separate_ties: bool = False,
) -> SweepResult:
    """Run the scenario; append a record per configuration to `out` as soon as it ends.

    `respawn_each` re-spawns the ranks for every configuration (to measure what the persistent
    pool saves); `task` replaces `measure_config` (tests inject failures through it).

    In a launched world (torchrun, srun) every rank runs this loop; rank 0 writes, and before
    each configuration it writes an in-flight marker (`<out>.inflight`): should the job die
    while that configuration runs, the next `--resume` records it as failed and goes on."""
    from cpbench.bench.environment import host_snapshot, process_environment  # noqa: PLC0415
    from cpbench.bench.measure import measure_config, measure_interleaved  # noqa: PLC0415
    from cpbench.bench.pool import TaskError, TaskTimeout, WorkerPool, WorldSpec  # noqa: PLC0415

    points = scenario.distinct(device, world_size)
    limit = timeout if timeout is not None else scenario.timeout
    settings = sweep_settings(scenario, precision)
    environment = EnvironmentSection.model_validate(process_environment())
    world: World
    writer, launched = True, launched_by_torchrun()
    result = SweepResult(path=out)
    result.points = len(points)
    result.duplicates = len(scenario.expand(device, world_size)) - len(points)
    if launched:
        in_process = InProcessWorld(device, limit)
        if in_process.world_size != world_size:
            in_process.close()
            raise CpbenchError(
                f"scenario world_size ({world_size}) != launched world size "
                f"({in_process.world_size})"
            )
        world, writer = in_process, in_process.rank == 0
        # Only rank 0 reads and writes the file (nodes may not share a disk); every rank must
        # skip the same configurations, so the answer is broadcast.
        try:
            done = in_process.broadcast_from_rank0(lambda: _prepare_output(out, resume, True))
        except CpbenchError:
            in_process.close()
            raise
    else:
        done = _prepare_output(out, resume)
        world = WorkerPool(WorldSpec(world_size, device))

    held: list[ResultRecord] = []
    block: list[Any] = [None]

    def flush() -> None:
        if held:
            settle_ties(held, lambda dicts: world.run(
                measure_interleaved, dicts, settings, timeout=limit * len(dicts)
            ))
        for record in held:
            write(record)
        held.clear()

    def finish(record: ResultRecord) -> None:
        if not separate_ties:
            write(record)
            return
        assert record.config is not None
        key = rank_group(record.config.model_dump())[:-3]  # the problem and mask
        if key != block[0]:
            flush()
            block[0] = key
        held.append(record)

    def write(record: ResultRecord) -> None:
        if writer:
            append_record(out, record)
            if launched:
                clear_inflight(out)
        written = dump_record(record)
        result.records.append(written)
        if on_record:
            on_record(written)

    def record_failure(record: ResultRecord, exc: BaseException) -> None:
        if isinstance(exc, TaskTimeout):
            record.status, record.error = "timeout", str(exc)
        else:
            record.status, record.error = "failed", _failure_message(exc)

    started = time.perf_counter()
    try:
        for point in points:
            config, feasibility = point.config, point.feasibility
            if config.key in done or any(e in done for e in point.equivalent):
                result.resumed += 1
                continue
            record = _base_record(config, feasibility, scenario, environment, point.equivalent)
            reason = feasibility.reason if not feasibility.ok else impl_skip_reason(config)
            if reason:
                record.status, record.error = "skipped", reason
            else:
                if on_start:
                    on_start(config)
                if launched:
                    if writer:
                        dead = record.model_copy()
                        dead.status = "failed"
                        dead.error = INFLIGHT_ERROR.format(started=record.timestamp, timeout=limit)
                        mark_inflight(out, dead)

                    def abandon(exc: RunFailure, record: ResultRecord = record) -> None:
                        record_failure(record, exc)  # the process exits after this
                        finish(record)

                    in_process.on_abandon = abandon
                try:
                    world.start()  # a (re)spawn is not the configuration's CPU time
                    before = host_snapshot()
                    per_rank = world.run(
                        task or measure_config, _task_config(record), settings, timeout=limit
                    )
                    record = assemble_record(record, config, per_rank, settings)
                    _add_machine(record, config, before, host_snapshot(), per_rank)
                except (TaskTimeout, TaskError) as exc:
                    record_failure(record, exc)
                if respawn_each:
                    world.close()
            finish(record)
        flush()
    except KeyboardInterrupt:
        result.interrupted = True
        for record in held:  # measured: keep them, without the tie-break
            write(record)
        held.clear()
        if launched and writer:
            clear_inflight(out)  # stopped on purpose: --resume measures it again
        world.close(force=True)
    finally:
        world.close()
        result.wall_seconds = time.perf_counter() - started
        result.spawns = getattr(world, "spawns", 0)
    return result


def sweep_settings(
    scenario: Scenario, precision: float | None | Literal["scenario"] = "scenario"
) -> dict[str, Any]:
    """The ranks' settings of a scenario (`cpbench.bench.measure.measure_config`)."""
    return {
        "warmup": scenario.warmup,
        "iters": scenario.iters,
        "max_iters": scenario.max_iters,
        "precision": scenario.precision if precision == "scenario" else precision,
        "budget": scenario.budget,
        "check_max_seq_len": scenario.check_max_seq_len,
        "check_rows": scenario.check_rows,
    }


def _add_machine(
    record: ResultRecord,
    config: BenchConfig,
    before: dict[str, Any],
    after: dict[str, Any],
    per_rank: list[dict[str, Any]],
) -> None:
    """`environment.machine` of a measured record, and a warning when its precision target
    was not met."""
    from cpbench.bench.environment import machine_state  # noqa: PLC0415

    assert record.environment is not None
    threads = record.environment.torch_threads_per_rank or 1
    gpus = [r["gpu"] for r in per_rank if r.get("gpu")] or None
    ranks_cpu = [r.get("cpu") for r in per_rank]
    state = machine_state(
        before, after, config.world_size, threads, config.device, config.nodes, gpus, ranks_cpu
    )
    timing = record.timing
    if timing is not None and timing.target_met is False:
        width = timing.relative_width or float("nan")
        cause = (
            " on an oversubscribed machine" if state["oversubscribed"] else ""
        )
        state["warnings"].append(
            f"precision target not met{cause}: 95% interval {width:.1%} of the median > "
            f"{timing.precision_target:.0%} after {timing.iterations} iterations "
            f"({timing.stop_reason})"
        )
    record.environment.machine = MachineSection.model_validate(state)


def settle_ties(
    records: list[ResultRecord], remeasure: Callable[[list[dict[str, Any]]], list[float]]
) -> None:
    """For every group of `records` (`rank_group`) whose leaders tie, re-measure the tied
    leaders interleaved (`remeasure` gives the flattened round-by-round samples) and set each
    one's `timing.tiebreak`. A failed re-measurement leaves the tie as it is."""
    from cpbench.bench.pool import TaskError, TaskTimeout  # noqa: PLC0415

    groups: dict[tuple[Any, ...], list[ResultRecord]] = {}
    for record in records:
        if record.status == "ok" and record.timing is not None and record.config is not None:
            groups.setdefault(rank_group(record.config.model_dump()), []).append(record)
    for members in groups.values():
        if len(members) < 2:
            continue
        by_id = {r.id: r for r in members}
        ranked = rank_with_ties({r.id: r.timing.interval() for r in members if r.timing})
        if ranked.clear:
            continue
        tied = [by_id[i] for i in ranked.tied]
        try:
            flat = remeasure([_task_config(r) for r in tied])
        except (TaskError, TaskTimeout):
            continue
        k = len(tied)
        intervals = {r.id: median_interval(flat[i::k]) for i, r in enumerate(tied)}
        again = rank_with_ties(intervals)
        for r in tied:
            assert r.timing is not None
            iv = intervals[r.id]
            r.timing.tiebreak = {
                "method": "interleaved A B A B, one full step of each per round",
                "median": iv.median,
                "ci_low": iv.low,
                "ci_high": iv.high,
                "iterations": iv.n,
                "with": [t.id for t in tied if t.id != r.id],
                "separated": again.clear,
                "leader": again.leader if again.clear else None,
            }
