"""`cpbench sweep` / `cpbench run`: run every configuration of a scenario and append one record
per configuration to a JSONL file as soon as it ends: docs/internals.md, "The sweep loop"."""

from __future__ import annotations

import contextlib
import datetime
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cpbench.app.record import base_record, measured_record
from cpbench.bench.harness import RankMeasurement
from cpbench.bench.world import InProcessWorld, World, launched_by_torchrun
from cpbench.config.bench import BenchConfig
from cpbench.config.impls import DEFAULT_IMPL
from cpbench.errors import CpbenchError, RunFailure
from cpbench.model.dynamic.schedule import Policy
from cpbench.model.ties import median_interval, rank_with_ties
from cpbench.results.frame import rank_group
from cpbench.results.lock import ResultsLock
from cpbench.results.scenarios.dynamic import DynamicStudy
from cpbench.results.scenarios.scenario import Scenario
from cpbench.results.schema import SCHEMA_VERSION, EnvironmentSection, ResultRecord, dump_record
from cpbench.results.store import (
    append_record,
    clear_inflight,
    completed_ids,
    mark_inflight,
    take_inflight,
)


@dataclass
class SweepResult:
    """What a sweep did; the records are also in `path`."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    """This invocation's records as written (`schema.dump_record`), in order."""
    results: list[ResultRecord] = field(default_factory=list)
    """The same records, typed: what the terminal tables read."""
    resumed: int = 0
    interrupted: bool = False
    signal: int = signal.SIGINT
    """The signal that interrupted it (SIGINT: Ctrl-C, SIGTERM: a scheduler); exit 128 + it."""
    wall_seconds: float = 0.0
    spawns: int = 0
    duplicates: int = 0
    """Points of the scenario that were the same computation as another (measured once)."""
    points: int = 0
    """Distinct configurations of the scenario."""

    def counts(self) -> dict[str, int]:
        return dict(Counter(r["status"] for r in self.records))


def default_output(scenario: Scenario, results_dir: Path = Path("results")) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return results_dir / f"{scenario.name}-{stamp}.jsonl"


def impl_skip_reason(config: BenchConfig) -> str | None:
    """Why an external impl cannot run a (mesh-feasible) configuration, or why cpbench's own
    named kernel cannot run its head dimension (the kernel's rule; `auto` picks one that can);
    None for a supported one."""
    if config.impl == DEFAULT_IMPL:
        from cpbench.attention.kernels.limits import head_dim_unsupported  # noqa: PLC0415

        if config.kernel == "auto":
            return None
        reason = head_dim_unsupported(
            config.kernel, config.head_dim, config.device, config.dtype
        )
        return None if reason is None else f"kernel {config.kernel!r} {reason}"
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


class Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers send) in the middle of a sweep: handled as Ctrl-C is."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While it is open, SIGTERM raises `Terminated` in the main thread (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _prepare_output(out: Path, resume: bool, launched: bool = False) -> set[str]:
    """Check that `out` can take the sweep (fail before anything is measured); return the ids
    already recorded in it when resuming. In a launched world, a configuration that was in
    flight when an earlier job died (its marker) is recorded as failed first."""
    if out.is_dir():
        raise CpbenchError(f"output {out} is a directory: give --out a file name (a .jsonl)")
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
    on_start: Callable[[BenchConfig | DynamicStudy], None] | None = None,
    respawn_each: bool = False,
    task: Callable[..., RankMeasurement] | None = None,
    precision: float | None | Literal["scenario"] = "scenario",
    separate_ties: bool = False,
    pool: World | None = None,
) -> SweepResult:
    """Run the scenario; append a record per configuration to `out` as soon as it ends.

    `respawn_each` re-spawns the ranks for every configuration (to measure what the persistent
    pool saves); `task` replaces `measure_config` (tests inject failures through it). `pool`:
    the ranks to run on, left open for the caller's next sweep (`cpbench tune` measures its
    candidates one sweep each on one pool); None: the sweep starts its own and closes them.

    In a launched world (torchrun, srun) every rank runs this loop; rank 0 writes, and before
    each configuration it writes an in-flight marker (`<out>.inflight`): should the job die
    while that configuration runs, the next `--resume` records it as failed and goes on.

    The writer holds `ResultsLock(out)` from before it reads `out` to the end: a second sweep
    on the same file is refused at once. SIGTERM is handled as Ctrl-C (`terminate_as_interrupt`):
    what was measured is kept and `interrupted` set."""
    from cpbench.bench.environment import host_snapshot, process_environment  # noqa: PLC0415
    from cpbench.bench.measure import measure_config, measure_interleaved  # noqa: PLC0415
    from cpbench.bench.pool import TaskError, TaskTimeout, WorkerPool, WorldSpec  # noqa: PLC0415

    lock = ResultsLock(out)
    with terminate_as_interrupt(), contextlib.ExitStack() as stack:
        stack.callback(lock.release)

        points = scenario.distinct(device, world_size)
        limit = timeout if timeout is not None else scenario.timeout
        settings = sweep_settings(scenario, precision)
        environment = EnvironmentSection.model_validate(process_environment())
        world: World
        writer, launched = True, launched_by_torchrun()
        duplicates = len(scenario.expand(device, world_size)) - len(points)
        result = SweepResult(path=out, duplicates=duplicates, points=len(points))
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
                def prepare() -> set[str]:
                    lock.acquire()  # where the file is written: rank 0
                    return _prepare_output(out, resume, True)

                done = in_process.broadcast_from_rank0(prepare)
            except CpbenchError:
                in_process.close()
                raise
        else:
            lock.acquire()
            done = _prepare_output(out, resume)
            world = pool if pool is not None else WorkerPool(WorldSpec(world_size, device))
        owned = launched or pool is None
        # a lent pool's earlier spawns are not this sweep's (a launched world counts its own
        # start, made before this point)
        spawned_before = 0 if owned else getattr(world, "spawns", 0)

        held: list[ResultRecord] = []
        block: list[Any] = [None]

        def flush(settle: bool = True) -> None:
            if held and settle:
                settle_ties(held, lambda dicts: world.run(
                    measure_interleaved, dicts, settings, timeout=limit * len(dicts)
                ))
            for record in held:
                write(record)
            held.clear()

        def finish(record: ResultRecord) -> None:
            assert record.config is not None
            if not separate_ties or record.config.inference is not None:  # no ties re-measured
                write(record)
                return
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
            result.results.append(record)
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
                record = base_record(config, feasibility, scenario, environment, point.equivalent)
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
                        snapshots = (before, host_snapshot())
                        record = measured_record(record, config, per_rank, settings, snapshots)
                    except (TaskTimeout, TaskError) as exc:
                        record_failure(record, exc)
                    if respawn_each:
                        world.close()
                finish(record)
            flush()
            study = scenario.dynamic_study(device, world_size)
            if study is not None:
                pending = [p for p in study.policies if study.record_id(p) not in done]
                result.resumed += len(study.policies) - len(pending)
                if pending:
                    if on_start:
                        on_start(study)
                    if launched and writer:  # should the job die, --resume records the first
                        dead = _study_base(study, scenario, environment, pending[0])
                        dead.status = "failed"
                        dead.error = INFLIGHT_ERROR.format(started=dead.timestamp, timeout=limit)
                        mark_inflight(out, dead)
                    world.start()
                    for record in run_study(study, pending, world, settings, limit,
                                            lambda p: _study_base(study, scenario, environment, p)):
                        write(record)
        except KeyboardInterrupt as exc:
            result.interrupted = True
            result.signal = getattr(exc, "signum", signal.SIGINT)
            flush(settle=False)  # measured: keep them, without the tie-break
            # Ctrl-C is on purpose: --resume measures it again. A launcher's SIGTERM may follow
            # another rank's death (torchrun stops the rest): the marker stays, and --resume
            # records the configuration as failed (INFLIGHT_ERROR), as if the job had died.
            if launched and writer and result.signal == signal.SIGINT:
                clear_inflight(out)
            if owned:
                world.close(force=True)
        finally:
            if owned:
                world.close()
            result.wall_seconds = time.perf_counter() - started
            result.spawns = getattr(world, "spawns", 0) - spawned_before
        return result


def _study_base(
    study: DynamicStudy, scenario: Scenario, environment: EnvironmentSection, policy: Policy
) -> ResultRecord:
    """A study's policy record before it runs (status ok, no measurement yet)."""
    from cpbench.app.dynamic import study_config  # noqa: PLC0415

    return ResultRecord(
        schema_version=SCHEMA_VERSION,
        id=study.record_id(policy),
        scenario=scenario.name,
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        status="ok",
        config=study_config(study, scenario.nodes),
        environment=environment.model_copy(),
    )


def run_study(
    study: DynamicStudy, pending: list[Policy], world: Any, settings: dict[str, Any],
    timeout: float, base: Callable[[Policy], ResultRecord],
) -> list[ResultRecord]:  # fmt: skip
    """The `pending` policies of a dynamic-CP study measured on the sweep's ranks (`world`),
    interleaved over the study's rounds (`app.dynamic.measure_routed`): one record per policy,
    skipped when its rule cannot plan the batch, failed when a routed group's check failed (or
    the ranks failed: every policy of the run then), timeout when they ran past `timeout`
    seconds per policy and round."""
    from cpbench.app.dynamic import measure_routed, policy_record  # noqa: PLC0415
    from cpbench.bench.pool import TaskError, TaskTimeout  # noqa: PLC0415
    from cpbench.model.dynamic import POLICIES, plan_policies  # noqa: PLC0415
    from cpbench.model.hardware.loading import load_profile  # noqa: PLC0415

    profile = load_profile(study.hardware)
    refused: dict[Policy, str] = {}
    plans = plan_policies(study.problem, profile, POLICIES, refused)
    static = plans.get("static")
    runnable = {p: plans[p] for p in pending if p in plans}
    measured: dict[Policy, Any] = {}
    failure: BaseException | None = None
    if runnable:
        try:
            measured = measure_routed(
                study.problem, profile, runnable, {**settings, "rounds": study.rounds},
                study.device, study.backend, pool=world, timeout=timeout,
            )  # fmt: skip
        except (TaskTimeout, TaskError) as exc:
            failure = exc
    records = []
    for policy in pending:
        plan = plans.get(policy)
        reason = refused.get(policy) or (_failure_message(failure) if failure else None)
        record = policy_record(study, policy, base(policy), plan, static,
                               measured.get(policy), reason)  # fmt: skip
        if isinstance(failure, TaskTimeout) and plan is not None:
            record.status = "timeout"
        records.append(record)
    return records


CONFIRM_ABOVE = 1000
"""A sweep run from a terminal with more configurations to measure than this asks first
(`cpbench sweep --yes` does not; a run that is not in a terminal never asks)."""


@dataclass(frozen=True)
class SweepEstimate:
    """What a sweep is about to do, told before it starts (`cpbench sweep`)."""

    measured: int
    """Configurations it measures (feasible and runnable; those already in --out included)."""
    skipped: int
    """Configurations recorded as skipped without running (infeasible, or no impl runs them)."""
    timed_seconds: float | None
    """Seconds of timed steps at the scenario's time budget; None with precision off (a fixed
    count of steps, whose time nothing knows before they run)."""
    timeout: float

    def line(self) -> str:
        n = f"{self.measured:,} configuration{'s' if self.measured != 1 else ''} to measure"
        skipped = f" ({self.skipped:,} more recorded as skipped)" if self.skipped else ""
        cap = _duration(self.measured * self.timeout)
        most = f"each cut at its {self.timeout:g} s timeout, {cap} at most"
        if self.timed_seconds is None:
            return (
                f"{n}{skipped}: a fixed count of timed steps each (precision off: no time "
                f"budget to estimate from); {most}"
            )
        return (
            f"{n}{skipped}, about {_duration(self.timed_seconds)} at the scenario's time budget "
            "(its timed steps only: warm-up, the checks and rank start-up add to it, a "
            f"precision reached early takes less); {most}"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_sweep(
    scenario: Scenario,
    points: list[Any],
    precision: float | None | Literal["scenario"] = "scenario",
    timeout: float | None = None,
    study: DynamicStudy | None = None,
) -> SweepEstimate:
    """The count of `points` (`Scenario.distinct`) a sweep measures, and the seconds of timed
    steps the scenario's time budget allows them: a training configuration times its full
    step for `budget` seconds and its compute and comm variants for half of it each (2 x
    budget), an inference one its step alone (1 x budget); timing stops sooner at the
    precision or `max_iters` (`cpbench.bench.timing`). A dynamic-CP `study` adds its policies,
    each timing its whole step for `budget` seconds in each of its rounds."""
    measured = [p.config for p in points if p.feasibility.ok and not impl_skip_reason(p.config)]
    settings = sweep_settings(scenario, precision)
    policies = len(study.policies) if study is not None else 0
    timed = None
    if settings["precision"] is not None:
        shares = sum(1.0 if config.inference is not None else 2.0 for config in measured)
        shares += policies * (study.rounds if study is not None else 0)
        timed = settings["budget"] * shares
    limit = timeout if timeout is not None else scenario.timeout
    return SweepEstimate(len(measured) + policies, len(points) - len(measured), timed, limit)


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
