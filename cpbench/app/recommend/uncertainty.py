"""How sure a recommendation is: the model's sigma and its source, its common / per-candidate
split, every candidate's interval, whether the leaders tie and which tied candidate is the pick
(`TIE_BREAK_RULES`): docs/cost-model.md section 1."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from cpbench.app.recommend.types import (
    LAYOUT_PREFERENCE,
    RankedCandidate,
    TieBreak,
    TieCall,
    Uncertainty,
    rank_key,
)
from cpbench.model.calibrate import CalibrationResult, Measurement
from cpbench.model.calibrate.error_split import ErrorSplit, prior_split, split_residuals
from cpbench.model.hardware.profile import HardwareProfile, LinkCost
from cpbench.model.ties import TIE_RULE, prediction_interval, ratio_tied, relative_sigma
from cpbench.results.frame import rank_records, record_interval

PROBE_SIGMA_FLOOR = 0.05
"""Least sigma taken from a probe's fit error (the floor `relative_sigma` puts on a
calibration's): a link fit that is exact says nothing about the rest of the model."""
LISTED = 5
"""Tied candidates named in the message (the table and the JSON list them all)."""
MEMORY_BINDS = 0.10
"""Memory decides only where it binds: a candidate whose longest sequence is within 10% of the
requested length (its memory at that length within 10% of the budget) gives way."""
EQUAL = 0.001
"""Predictions within 0.1% of each other are equal (striped and zigzag price alike): the
simpler setting names the pick among them."""


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
    profile: HardwareProfile,
    calibration: CalibrationResult | None,
    measurements: Sequence[Measurement] = (),
) -> Uncertainty:
    """Sigma of the model's relative step-time error: the calibration's residuals (done on
    `--results`, or recorded in a calibrated TOML), else a probe's largest stated link-fit
    residual (at least `PROBE_SIGMA_FLOOR`), else the prior's stated accuracy. Its split
    (`ErrorSplit`) comes from the calibration's residuals on `measurements` when given
    (within-problem spread = the per-candidate part), else the stated prior split."""
    if calibration is not None:
        sigma, text = relative_sigma(calibration.residual, calibration.points)
        split = _split_from(calibration, measurements, sigma)
        return Uncertainty("calibration", sigma, text, split)
    if profile.calibration is not None:
        info = profile.calibration
        sigma, text = relative_sigma(info.residual, info.points)
        text = f"{text}, recorded in {profile.name}"
        return Uncertainty("calibration", sigma, text, prior_split(sigma))
    residuals = probe_residuals(profile)
    if residuals:
        worst = max(residuals)
        sigma = max(PROBE_SIGMA_FLOOR, worst)
        text = f"cpbench probe fit error: largest RMS residual {worst:.1%} of {len(residuals)}"
        return Uncertainty("probe", sigma, f"{text} link fit(s)", prior_split(sigma))
    sigma, _ = relative_sigma(None)
    text = "the uncalibrated prior's stated accuracy, an estimate"
    return Uncertainty("prior", sigma, text, prior_split(sigma))


def _split_from(
    calibration: CalibrationResult, measurements: Sequence[Measurement], sigma: float
) -> ErrorSplit:
    """The split of `sigma` by the calibrated profile's residuals on the measurements: the
    within-problem spread gives the per-candidate part (at most sigma), the rest is common."""
    residuals = [
        (m.group, math.log(m.predict(calibration.profile).step_s / m.median_s))
        for m in measurements
        if m.median_s > 0
    ]
    estimated = split_residuals(residuals)
    if not residuals:
        return prior_split(sigma)
    candidate = min(sigma, estimated.candidate_sigma)
    common = math.sqrt(max(0.0, sigma**2 - candidate**2))
    return replace(estimated, common_sigma=common, candidate_sigma=candidate)


def with_intervals(
    ranked: Sequence[RankedCandidate],
    uncertainty: Uncertainty,
    records: Sequence[Mapping[str, Any]],
) -> list[RankedCandidate]:
    """The candidates with their predicted interval and, when measured, the measured one."""
    by_id = {str(r.get("id")): r for r in records}
    sigma, source = uncertainty.sigma, uncertainty.source
    return [
        replace(
            r,
            interval=prediction_interval(r.prediction.step_s, sigma, source),
            measured_interval=record_interval(by_id[r.record_id]) if r.record_id in by_id else None,
        )
        for r in ranked
    ]


def call_ties(
    ranked: Sequence[RankedCandidate],
    uncertainty: Uncertainty,
    records: Sequence[Mapping[str, Any]],
) -> tuple[list[RankedCandidate], TieCall | None]:
    """Which candidates tie with the leader, the one pick among them, and the ranking with
    the pick first.

    Two predictions tie when the interval of their ratio contains 1: |log(slow / fast)| <=
    the ratio's sigma (`ties.ratio_tied` on `ErrorSplit.ratio_sigma`: the error common to the
    candidates of one problem cancels in a ratio); two measurements tie when their 95%
    intervals overlap (`rank_records`, `TIE_RULE`); a measurement and a prediction tie when
    the measured interval and the predicted one overlap. An interleaved re-measurement that
    settled a measured tie names the pick; else `TIE_BREAK_RULES` do."""
    if not ranked:
        return [], None
    order = sorted(ranked, key=rank_key)
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
    split = uncertainty.split
    tied_set = [leader] + [r for r in order[1:] if _tied(leader, r, measured_tied, split)]
    runner_up = next((r for r in order if r not in tied_set), None)
    decided_by: TieBreak
    if len(tied_set) == 1:
        pick, decided_by, decision = leader, "clear", ""
    elif resolved_by or leader.measured_s is not None:
        pick, decided_by = leader, "measured"
        decision = (
            f"{leader.label} is faster when re-measured ({resolved_by})"
            if resolved_by
            else f"{leader.label} has the fastest measured median"
        )
    else:
        ratio_sigma = split.ratio_sigma if split else math.sqrt(2.0) * uncertainty.sigma
        pick, decided_by, decision = break_tie(tied_set, ratio_sigma)
    tied_set = [pick] + [r for r in tied_set if r is not pick]
    order = [pick] + [r for r in order if r is not pick]
    any_measured = any(r.measured_s is not None for r in tied_set + [runner_up] if r)
    rule = _model_rule(uncertainty) + (f"; measured: {TIE_RULE}" if any_measured else "")
    message = _message(tied_set, runner_up, uncertainty, decision)
    return order, TieCall(
        tuple(tied_set), runner_up, rule, message, resolved_by, decided_by, decision
    )


def _model_rule(uncertainty: Uncertainty) -> str:
    split = uncertainty.split
    if split is None:
        return (
            f"two predictions tie when the slower is within x e^sigma of the faster, sigma = "
            f"{uncertainty.sigma:.0%} ({uncertainty.source})"
        )
    return (
        f"two predictions tie when the interval of their ratio contains 1: the slower within "
        f"x e^(sqrt 2 x sigma_candidate) = x{math.exp(split.ratio_sigma):.2f} of the faster; "
        f"sigma {uncertainty.sigma:.0%} ({uncertainty.source}) = common "
        f"{split.common_sigma:.0%} + per-candidate {split.candidate_sigma:.0%} in quadrature "
        f"({split.source})"
    )


def _tied(
    leader: RankedCandidate,
    other: RankedCandidate,
    measured_tied: set[str],
    split: ErrorSplit | None,
) -> bool:
    if leader.measured_s is not None and other.measured_s is not None:
        return other.record_id in measured_tied
    if leader.measured_s is None and other.measured_s is None:
        fast, slow = leader.prediction.step_s, other.prediction.step_s
        if split is not None:
            return ratio_tied(fast, slow, split.ratio_sigma)
        if leader.interval is None:
            return slow <= fast
        return ratio_tied(fast, slow, leader.interval.relative_sigma)
    return leader.low_s <= other.high_s and other.low_s <= leader.high_s


def setting_complexity(r: RankedCandidate) -> tuple[int, int, int, int]:
    """How much a framework has to be told: all-gather over p2p, a head stride, two CP axes
    over one, then the layout (`LAYOUT_PREFERENCE`)."""
    c = r.prediction.candidate
    return (
        int(c.ring > 1 and c.all_gather),
        int(c.ring > 1 and c.all_gather and c.heads_k_stride is not None),
        int(c.ulysses > 1 and c.ring > 1),
        LAYOUT_PREFERENCE[c.layout] if c.ring > 1 and c.causal else 0,
    )


def faster_probability(fast_s: float, slow_s: float, ratio_sigma: float) -> float:
    """P(the candidate predicted at `fast_s` is faster than the one at `slow_s`): their log
    ratio is normal around the predicted one with sigma `ratio_sigma`."""
    if ratio_sigma <= 0:
        return 1.0 if fast_s < slow_s else 0.5 if fast_s == slow_s else 0.0
    return 0.5 * math.erfc(-math.log(slow_s / fast_s) / (ratio_sigma * math.sqrt(2.0)))


def break_tie(
    tied: Sequence[RankedCandidate], ratio_sigma: float
) -> tuple[RankedCandidate, TieBreak, str]:
    """The pick among tied candidates (fastest first), the rule that named it and why in
    words (`TIE_BREAK_RULES`): memory only where it binds, then the likeliest fastest, then,
    between equal predictions, the simpler setting."""
    left = sorted(tied, key=rank_key)
    requested = left[0].prediction.candidate.shape.seq_len
    roomy = [r for r in left if r.prediction.max_seq_len * (1 - MEMORY_BINDS) >= requested]
    if roomy and len(roomy) < len(left):
        tight = next(r for r in left if r not in roomy)
        if roomy[0] is not left[0] or len(roomy) == 1:
            pick = roomy[0]
            return pick, "memory", (
                f"{tight.label} holds at most {tight.prediction.max_seq_len:,} tokens, within "
                f"{MEMORY_BINDS:.0%} of the {requested:,} asked for; {pick.label} holds "
                f"{pick.prediction.max_seq_len:,}"
            )
        left = roomy
    fastest = min(r.prediction.step_s for r in left)
    equal = [r for r in left if r.prediction.step_s <= fastest * (1 + EQUAL)]
    pick = min(equal, key=lambda r: (setting_complexity(r), rank_key(r)))
    variants = [r for r in equal if r is not pick and _candidate_mesh(r) == _candidate_mesh(pick)]
    if any(_candidate_mesh(r) != _candidate_mesh(pick) for r in equal) and len(
        {setting_complexity(r) for r in equal}
    ) > 1:
        return pick, "simpler_setting", (
            f"{pick.label} is the simpler framework setting of equal predictions ("
            + ", ".join(r.label for r in equal if r is not pick)
            + f", within {EQUAL:.1%})"
        )
    # against the next other mesh: variants of the pick's own mesh (layouts, exchanges) are
    # settings of one choice, the mesh is the choice
    others = [r for r in left if r is not pick]
    rival = next((r for r in others if _candidate_mesh(r) != _candidate_mesh(pick)), None) or others[0]
    p = faster_probability(pick.prediction.step_s, rival.prediction.step_s, ratio_sigma)
    simpler = (
        f"; of its variants priced equal ({', '.join(r.label for r in variants)}) the simpler "
        f"setting" if variants else ""
    )
    return pick, "likeliest", (
        f"{pick.label} is faster than {rival.label} with probability {p:.2f} (predicted "
        f"{rival.prediction.step_s / pick.prediction.step_s - 1:.1%} apart, the ratio's sigma "
        f"{ratio_sigma:.0%}){simpler}"
    )


def _candidate_mesh(r: RankedCandidate) -> tuple[int, int]:
    c = r.prediction.candidate
    return c.ulysses, c.ring


def _against(uncertainty: Uncertainty, measured: bool, tie: bool) -> str:
    """What a tie (or a clear winner's margin) is measured against, in words."""
    split, source = uncertainty.split, uncertainty.source
    if measured:
        return "their measured 95% intervals overlap" if tie else "measured 95% intervals apart"
    if split is None:
        return f"{'within' if tie else 'beyond'} ±{uncertainty.sigma:.0%} ({source})"
    ratio = "one sigma of a ratio of two predictions"
    if tie:
        return (
            f"within x{math.exp(split.ratio_sigma):.2f} of the leader ({ratio}, "
            f"{split.ratio_sigma:.0%}; {source})"
        )
    return f"beyond the ratio's ±{split.ratio_sigma:.0%} ({ratio}; {source})"


def _message(
    tied_set: Sequence[RankedCandidate],
    runner_up: RankedCandidate | None,
    uncertainty: Uncertainty,
    decision: str,
) -> str:
    if len(tied_set) > 1:
        labels = ", ".join(r.label for r in tied_set[:LISTED])
        if len(tied_set) > LISTED:
            labels += f" and {len(tied_set) - LISTED} more"
        measured = all(r.measured_s is not None for r in tied_set)
        return (
            f"the top {len(tied_set)} tie {_against(uncertainty, measured, True)}: {labels}; "
            f"pick {tied_set[0].label}: {decision}; to separate them measure them with `cpbench "
            f"sweep` (--write-scenario PATH writes that scenario)"
        )
    leader = tied_set[0]
    if runner_up is None:
        return f"{leader.label} is the only feasible candidate"
    margin = runner_up.time_s / leader.time_s - 1 if leader.time_s > 0 else 0.0
    measured = leader.measured_s is not None and runner_up.measured_s is not None
    return (
        f"{leader.label} is the clear winner: {margin:.0%} ahead of {runner_up.label}, "
        f"{_against(uncertainty, measured, False)}"
    )
