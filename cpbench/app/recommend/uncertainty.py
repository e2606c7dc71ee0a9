"""How sure a recommendation is: the model's sigma and its source (a calibration's residuals,
a probe's stated fit error, or the prior's stated accuracy), every candidate's interval, and
whether the leaders tie (the model's sigma between two predictions; the measured 95% intervals
between two measurements, `results.frame.rank_records`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from cpbench.app.recommend.types import RankedCandidate, TieCall, Uncertainty
from cpbench.model.calibrate import CalibrationResult
from cpbench.model.calibrate.stats import TIE_RULE
from cpbench.model.hardware.profile import HardwareProfile, LinkCost
from cpbench.model.topology import interval, relative_sigma, tied
from cpbench.results.frame import rank_records, record_interval

PROBE_SIGMA_FLOOR = 0.05
"""Least sigma taken from a probe's fit error (the floor `relative_sigma` puts on a
calibration's): a link fit that is exact says nothing about the rest of the model."""
LISTED = 5
"""Tied candidates named in the message (the table and the JSON list them all)."""


def probe_residuals(profile: HardwareProfile) -> tuple[float, ...]:
    """The RMS residuals (fractions) of a probe profile's link fits (`LinkCost.fit_residual`),
    one per distinct fit; empty for a profile no probe wrote."""
    tiers: list[Any] = [profile.intra_node, profile.inter_node]
    if profile.topology is not None:
        tiers.extend(profile.topology.tiers)
    costs: list[LinkCost] = [c for t in tiers for c in (t.all_to_all, t.send_recv)]
    found = {c: c.fit_residual for c in costs if c.fit_residual is not None}
    return tuple(found.values())


def profile_uncertainty(
    profile: HardwareProfile, calibration: CalibrationResult | None
) -> Uncertainty:
    """Sigma of the model's relative step-time error: the calibration's residuals (done on
    `--results`, or recorded in a calibrated TOML), else a probe's largest stated link-fit
    residual (at least `PROBE_SIGMA_FLOOR`), else the prior's stated accuracy."""
    if calibration is not None:
        sigma, text = relative_sigma(calibration.residual, calibration.points)
        return Uncertainty("calibration", sigma, text)
    if profile.calibration is not None:
        info = profile.calibration
        sigma, text = relative_sigma(info.residual, info.points)
        return Uncertainty("calibration", sigma, f"{text}, recorded in {profile.name}")
    residuals = probe_residuals(profile)
    if residuals:
        worst = max(residuals)
        return Uncertainty(
            "probe",
            max(PROBE_SIGMA_FLOOR, worst),
            f"cpbench probe fit error: largest RMS residual {worst:.1%} of {len(residuals)} "
            f"link fit(s)",
        )
    sigma, _ = relative_sigma(None)
    return Uncertainty("prior", sigma, "the uncalibrated prior's stated accuracy, an estimate")


def with_intervals(
    ranked: Sequence[RankedCandidate],
    uncertainty: Uncertainty,
    records: Sequence[Mapping[str, Any]],
) -> list[RankedCandidate]:
    """The candidates with their predicted interval and, when measured, the measured one."""
    by_id = {str(r.get("id")): r for r in records}
    out = []
    for r in ranked:
        record = by_id.get(r.record_id) if r.record_id is not None else None
        out.append(
            replace(
                r,
                interval=interval(r.prediction.step_s, uncertainty.sigma, uncertainty.source),
                measured_interval=record_interval(record) if record is not None else None,
            )
        )
    return out


def call_ties(
    ranked: Sequence[RankedCandidate],
    uncertainty: Uncertainty,
    records: Sequence[Mapping[str, Any]],
) -> tuple[list[RankedCandidate], TieCall | None]:
    """Which candidates tie with the leader, and the ranking (an interleaved re-measurement
    that settled a measured tie puts its winner first).

    Two predictions tie when the slower is within exp(sigma) of the faster (`topology.tied`:
    their errors on one profile are correlated); two measurements tie when their 95%
    intervals overlap (`rank_records`, `TIE_RULE`); a measurement and a prediction tie when
    the measured interval and the predicted one overlap."""
    if not ranked:
        return [], None
    order = list(ranked)
    measured_ids = {r.record_id for r in order if r.measured_s is not None and r.record_id}
    measured_tied: set[str] = set()
    resolved_by = None
    if order[0].measured_s is not None and order[0].record_id in measured_ids:
        own = [r for r in records if str(r.get("id")) in measured_ids]
        group = next(
            (g for g in rank_records(own).values() if order[0].record_id in g.order), None
        )
        if group is not None:
            measured_tied = set(group.tied)
            resolved_by = group.resolved_by
            if resolved_by and group.leader != order[0].record_id:
                first = next(r for r in order if r.record_id == group.leader)
                order = [first] + [r for r in order if r is not first]
    leader = order[0]
    tied_set = [leader] + [r for r in order[1:] if _tied(leader, r, measured_tied)]
    runner_up = next((r for r in order if r not in tied_set), None)
    any_measured = any(r.measured_s is not None for r in tied_set + [runner_up] if r)
    model_rule = (
        f"two predictions tie when the slower is within x e^sigma of the faster, sigma = "
        f"{uncertainty.sigma:.0%} ({uncertainty.source})"
    )
    rule = model_rule + (f"; measured: {TIE_RULE}" if any_measured else "")
    return order, TieCall(
        tuple(tied_set), runner_up, rule, _message(tied_set, runner_up, uncertainty), resolved_by
    )


def _tied(leader: RankedCandidate, other: RankedCandidate, measured_tied: set[str]) -> bool:
    if leader.measured_s is not None and other.measured_s is not None:
        return other.record_id in measured_tied
    if leader.measured_s is None and other.measured_s is None:
        if leader.interval is None or other.interval is None:
            return other.time_s <= leader.time_s
        return tied(leader.interval, other.interval)
    return leader.low_s <= other.high_s and other.low_s <= leader.high_s


def _within(uncertainty: Uncertainty, candidates: Sequence[RankedCandidate]) -> str:
    """What the tie or the margin is measured against, in words."""
    if all(r.measured_s is not None for r in candidates):
        return "their measured 95% intervals overlap"
    return f"within ±{uncertainty.sigma:.0%} ({uncertainty.source})"


def _message(
    tied_set: Sequence[RankedCandidate],
    runner_up: RankedCandidate | None,
    uncertainty: Uncertainty,
) -> str:
    if len(tied_set) > 1:
        labels = ", ".join(r.label for r in tied_set[:LISTED])
        if len(tied_set) > LISTED:
            labels += f" and {len(tied_set) - LISTED} more"
        return (
            f"the top {len(tied_set)} tie {_within(uncertainty, tied_set)}: {labels}; measure "
            f"them with `cpbench sweep` (--write-scenario PATH writes that scenario)"
        )
    leader = tied_set[0]
    if runner_up is None:
        return f"{leader.label} is the only feasible candidate"
    margin = runner_up.time_s / leader.time_s - 1 if leader.time_s > 0 else 0.0
    basis = (
        "measured 95% intervals apart"
        if leader.measured_s is not None and runner_up.measured_s is not None
        else f"beyond ±{uncertainty.sigma:.0%} ({uncertainty.source})"
    )
    return (
        f"{leader.label} is the clear winner: {margin:.0%} ahead of {runner_up.label}, "
        f"{basis}"
    )
