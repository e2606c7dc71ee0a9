"""`cpbench tune`: the closed loop (`cpbench.model.tune`) on `recommend`'s candidates, measured
by an oracle file (a replay) or by measuring; and the replay of the published tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpbench.app.recommend.frameworks import framework_settings
from cpbench.app.recommend.ranking import matching_measurement, recommend_mesh
from cpbench.app.recommend.types import FrameworkSetting, Recommendation, RecommendRequest
from cpbench.app.schema import ReportModel, Versioned
from cpbench.errors import CpbenchError
from cpbench.model.calibrate import (
    Measurement,
    default_prior,
    fit_profile,
    measurements_from_records,
)
from cpbench.model.calibrate.published import out_of_sample_table, published_table
from cpbench.model.calibrate.table import measurements_from_table, read_table_rows
from cpbench.model.hardware.file_schema import save_profile
from cpbench.model.hardware.loading import load_profile
from cpbench.model.tune import (
    DEFAULT_SETTINGS,
    Measured,
    TuneCandidate,
    TuneOutcome,
    TuneSettings,
    as_measurement,
    tune_loop,
)
from cpbench.results.store import read_records, status_summary


def read_oracle(path: str | Path) -> list[Measurement]:
    """The measured step times of an oracle file: a cpbench results JSONL (its `ok` training
    records) or a table (CSV / JSONL in the columns of `cpbench/data/published/*.csv`)."""
    path = Path(path)
    if path.suffix == ".csv":
        measurements = measurements_from_table(path)
    else:
        records = read_records([path])
        measurements = measurements_from_records(records)
        if not measurements and records:
            raise CpbenchError(
                f"oracle {path}: no usable record ({status_summary(records)}); it needs status "
                f"'ok' training records with a feasible config and timing.median"
            )
    if not measurements:
        raise CpbenchError(f"oracle {path} has no measured step time")
    return measurements


@dataclass(frozen=True)
class TuneRun:
    """A tune of `recommend`'s candidates."""

    recommendation: Recommendation
    """What the model alone says (the candidates, the profile, the rejections)."""
    candidates: tuple[TuneCandidate, ...]
    """The candidates tuned over, in the model's order."""
    outcome: TuneOutcome
    """The loop's result."""
    oracle: str | None
    """The oracle file replayed (None: measured)."""
    oracle_rows: tuple[Measurement | None, ...] = ()
    """Each candidate's row of the oracle (None: it has none)."""


@dataclass(frozen=True)
class TunedProfile:
    """The profile a tune wrote (-o) and what its fit found wrong with the model."""

    path: Path
    misfits: tuple[str, ...]
    """The joint fit's misfit lines (`ParameterFit.misfit`): physical parameters it moved out of
    their range."""


def write_tuned_profile(run: TuneRun, path: str | Path) -> TunedProfile:
    """The profile calibrated (the joint fit) on what the tune measured, as a TOML file that
    `recommend --hardware FILE` reads; CpbenchError when nothing was measured."""
    measured = [
        as_measurement(c, s.measured_s, s.index)
        for c, s in zip(run.candidates, run.outcome.candidates, strict=True)
        if s.measured_s is not None
    ]
    if not measured:
        raise CpbenchError(f"--output {path}: the tune measured nothing to calibrate a profile on")
    result = fit_profile(measured, run.recommendation.profile)
    misfits = tuple(p.misfit for fit in result.fits for p in fit.parameters if p.misfit)
    header = "\n".join(
        (f"calibrated by `cpbench tune` on {len(measured)} measured candidates", *misfits)
    )
    inputs = [run.oracle] if run.oracle else []
    return TunedProfile(save_profile(result.profile, path, header, inputs), misfits)


def tune_with_oracle(
    request: RecommendRequest, oracle: str | Path, settings: TuneSettings = DEFAULT_SETTINGS
) -> TuneRun:
    """Tune `request`'s candidates, each measurement taken from `oracle`'s matching row (a
    candidate it lacks is not measurable, and said so)."""
    rec = recommend_mesh(replace(request, top=0))
    rows = read_oracle(oracle)
    candidates = _tune_candidates(rec, "cuda")
    matched = [matching_measurement(c.candidate, rows) for c in candidates]
    if not any(matched):
        raise CpbenchError(
            f"oracle {oracle}: none of its {len(rows)} rows is one of the {len(candidates)} "
            f"candidates of this problem (seq_len {request.seq_len}, heads "
            f"{request.heads}/{request.kv_heads}, head_dim {request.head_dim}, batch "
            f"{request.batch}, phase {request.phase}, {request.gpus} GPUs)"
        )

    def measure(i: int) -> Measured | None:
        m = matched[i]
        return None if m is None else Measured(m.median_s, m.median_s)

    outcome = tune_loop(candidates, measure, rec.profile, settings)
    return TuneRun(rec, candidates, outcome, str(oracle), tuple(matched))


def tune_by_measuring(
    request: RecommendRequest,
    out: Path | None,
    resume: bool = False,
    settings: TuneSettings = DEFAULT_SETTINGS,
) -> tuple[TuneRun, list[dict[str, Any]]]:
    """Tune `request`'s candidates by measuring each the loop asks for here, as `cpbench sweep`
    does (checked against the reference, timed, bytes counted), its record appended to `out`
    (default results/tune-<time>.jsonl); with `resume` a candidate `out` already measured is
    taken from it. Every measurement runs on one pool of ranks, started once (a launched world:
    on the launched ranks). Returns the run and the records written now (the CLI judges them)."""
    from cpbench.app.recommend.scenario import candidates_scenario  # noqa: PLC0415
    from cpbench.app.sweep import run_sweep  # noqa: PLC0415
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415
    from cpbench.bench.world import launched_by_torchrun  # noqa: PLC0415
    from cpbench.results.scenarios.loading import parse_scenario  # noqa: PLC0415

    rec = recommend_mesh(replace(request, top=0))
    device = "cuda" if rec.profile.device_kind == "cuda" else "cpu"
    if out is None:
        out = Path("results") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    if _has_records(out) and not resume:
        raise CpbenchError(
            f"output {out} already has records: pass --resume to continue that tune, or give "
            f"another --out"
        )
    candidates = _tune_candidates(rec, device)
    written: list[dict[str, Any]] = []
    # what an earlier run of this tune measured (--resume), read once
    before = measurements_from_records(read_records([out])) if _has_records(out) else []
    # started by the first measurement (none when --resume has them all), closed at the end
    pool = None if launched_by_torchrun() else WorkerPool(WorldSpec(rec.sizes.cp, device))

    def measure(i: int) -> Measured | None:
        done = matching_measurement(candidates[i].candidate, before)
        if done is not None:
            return Measured(done.median_s, 0.0)  # measured before this run: free now
        scenario = parse_scenario(candidates_scenario(rec, [rec.ranked[i]]), "<cpbench tune>")
        result = run_sweep(scenario, device, rec.sizes.cp, out, resume=_has_records(out),
                           pool=pool)
        written.extend(result.records)
        if result.interrupted:
            raise KeyboardInterrupt  # every record so far is in `out`: --resume continues
        m = matching_measurement(candidates[i].candidate, measurements_from_records(result.records))
        return None if m is None else Measured(m.median_s, result.wall_seconds)

    try:
        outcome = tune_loop(candidates, measure, rec.profile, settings)
    except BaseException:  # Ctrl-C in a measurement: its ranks may be mid-task
        if pool is not None:
            pool.close(force=True)
        raise
    if pool is not None:
        pool.close()
    return TuneRun(rec, candidates, outcome, None), written


def _tune_candidates(rec: Recommendation, device: str) -> tuple[TuneCandidate, ...]:
    """The tune's candidates: every feasible candidate of `rec`, in its order."""
    return tuple(
        TuneCandidate(r.label, r.prediction.candidate, rec.gpus_per_node, rec.sizes.tp, device)
        for r in rec.ranked
    )


def _has_records(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


@dataclass(frozen=True)
class GroupReplay:
    """The loop replayed on one group of a published table (one problem on one machine)."""

    machine: str
    """The rows' hardware."""
    problem: str
    """The group's problem, in words."""
    candidates: int
    """Configurations the table measured for it."""
    runs: int
    """Measured by the loop."""
    regret: float
    """Measured time of the pick / the group's best - 1."""
    share: float
    """The measured candidates' step times over all of the group's (the cost of measuring
    everything, by the same convention)."""
    stop: str
    """Why the loop stopped."""
    pick: str
    best: str
    """The measured best."""


def replay_published(
    paths: Sequence[Path] | None = None, settings: TuneSettings = DEFAULT_SETTINGS
) -> list[GroupReplay]:
    """The loop on every group of two or more rows of the published tables (the shipped ones
    unless `paths`), each from its machine's prior, the rows as the oracle."""
    out: list[GroupReplay] = []
    for path in paths or (published_table(), out_of_sample_table()):
        by_machine: dict[str, list[tuple[Measurement, str]]] = {}
        for row_id, row in read_table_rows(path):
            by_machine.setdefault(row.hardware or row.gpu, []).append(
                (row.measurement(row_id), row.profile)
            )
        for machine, items in by_machine.items():
            measurements = [m for m, _ in items]
            named = {p for _, p in items if p}
            prior = load_profile(named.pop() if named else default_prior(measurements).name)
            groups: dict[Any, list[Measurement]] = {}
            for m in measurements:
                groups.setdefault(m.group, []).append(m)
            for members in groups.values():
                if len(members) > 1:
                    out.append(_replay_group(machine, members, prior, settings))
    return out


def _replay_group(
    machine: str, members: Sequence[Measurement], prior: Any, settings: TuneSettings
) -> GroupReplay:
    candidates = [
        TuneCandidate(m.label, m.candidate, m.devices_per_node, 1, m.device) for m in members
    ]
    outcome = tune_loop(candidates, lambda i: Measured(members[i].median_s, members[i].median_s),
                   prior, settings)  # fmt: skip
    times = [m.median_s for m in members]
    best = min(range(len(members)), key=times.__getitem__)
    spent = sum(times[c.index] for c in outcome.candidates if c.status == "measured")
    c = members[0].candidate
    problem = f"L={c.shape.seq_len} {c.shape.heads}/{c.shape.kv_heads} {c.phase} world {c.world}"
    return GroupReplay(
        machine, problem, len(members), outcome.runs, times[outcome.pick] / times[best] - 1,
        spent / sum(times), outcome.stop, members[outcome.pick].label, members[best].label,
    )  # fmt: skip


class TunedCandidate(ReportModel):
    """One candidate at the end of a tune."""

    label: str
    """`U x R layout` (and the exchange)."""
    status: str
    """measured, predicted, ruled out (by the model: less than 1% likely faster than the
    pick) or not measurable (the oracle has no row for it)."""
    predicted_ms: float
    """The corrected model's step time, ms per step."""
    measured_ms: float | None
    """The measured step time, ms per step (median), when measured."""
    p_fastest: float
    """Probability that it is the fastest (the model's uncertainty and the measurements')."""
    p_faster_than_pick: float
    """Probability that it is faster than the pick."""


class TuneReport(Versioned):
    """`cpbench tune --json`."""

    pick: str
    """The picked candidate."""
    pick_measured: bool
    """Whether the pick was measured (acting on a measured pick is the point)."""
    p_pick_fastest: float
    """Probability that the pick is the fastest."""
    p_beaten: float
    """Probability that some candidate is more than `margin` faster than the pick."""
    margin: float
    """The margin of "faster" (a share of the step time)."""
    stop: str
    """Why the loop stopped: known (p_beaten below the risk), measured (every candidate that
    could beat the pick is measured), budget."""
    runs: int
    """Candidates measured."""
    measured_seconds: float
    """What they cost: seconds of measurement (an oracle: their step times summed)."""
    exhaustive_share: float | None
    """That over measuring every measurable candidate the same way (an oracle only)."""
    oracle: str | None
    """The oracle file replayed; None: measured here."""
    profile: str
    """The profile the model started from."""
    scale: float
    """Measured / predicted: the correction the measurements applied to every prediction."""
    frameworks: list[FrameworkSetting]
    """The pick's settings for Megatron-LM, DeepSpeed, yunchang, torchtitan (as recommend's)."""
    candidates: list[TunedCandidate]
    """Every candidate, in the model's first order."""
    profile_written: str | None
    """The calibrated profile written (-o), or None."""
    misfit: str | None
    """Said when the measurements put the model's times more than `MISFIT_SCALE` off (the
    profile's links or kernel are not this machine's: calibrate it, or probe), so the pick
    leans on the measured candidates; and, with -o, the misfits of its joint fit."""


MISFIT_SCALE = 2.0
"""Measured / predicted beyond this factor (either way) is reported as the model's misfit."""


def _misfit(run: TuneRun) -> str | None:
    scale = run.outcome.scale
    if 1 / MISFIT_SCALE <= scale <= MISFIT_SCALE:
        return None
    return (
        f"the measured steps are x{scale:.2f} the model's ({run.recommendation.profile.name}): "
        f"its links or kernel are not this machine's; the ranking rests on the measured "
        f"candidates (`cpbench calibrate` on the records, or `cpbench probe`, fixes the profile)"
    )


def tune_report(run: TuneRun, written: TunedProfile | None = None) -> TuneReport:
    """The typed report of a tune."""
    out = run.outcome
    last = out.steps[-1]
    ranked = run.recommendation.ranked
    pick = ranked[out.pick]
    spent = out.cost_s
    everything = sum(m.median_s for m in run.oracle_rows if m is not None)
    frameworks = framework_settings([pick, *(r for r in ranked if r is not pick)],
                                    run.recommendation.sizes)  # fmt: skip
    return TuneReport(
        pick=pick.label,
        pick_measured=out.candidates[out.pick].status == "measured",
        p_pick_fastest=last.p_pick_fastest,
        p_beaten=last.p_beaten,
        margin=out.settings.margin,
        stop=out.stop,
        runs=out.runs,
        measured_seconds=spent,
        exhaustive_share=spent / everything if everything > 0 else None,
        oracle=run.oracle,
        profile=run.recommendation.profile.name,
        scale=out.scale,
        frameworks=list(frameworks),
        profile_written=None if written is None else str(written.path),
        misfit="; ".join(m for m in (_misfit(run), *(written.misfits if written else ())) if m)
        or None,
        candidates=[
            TunedCandidate(
                label=c.label, status=s.status, predicted_ms=s.predicted_s * 1e3,
                measured_ms=None if s.measured_s is None else s.measured_s * 1e3,
                p_fastest=s.p_fastest, p_faster_than_pick=s.p_faster_than_pick,
            )  # fmt: skip
            for c, s in zip(run.candidates, out.candidates, strict=True)
        ],
    )
