"""Calibration: fit a hardware profile to measured times by least squares.

The three linear fits (links, kernel, overlap) and their order: docs/cost-model.md section 2."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from cpbench.errors import CpbenchError
from cpbench.model.calibrate.joint import (
    LinkKey,
    ParameterFit,
    fit_joint,
    link_cost,
    link_label,
    link_order,
    set_link_cost,
)
from cpbench.model.calibrate.measurements import Measurement, as_measurements, resolve_prior
from cpbench.model.calibrate.stats import rms
from cpbench.model.cost.breakdown import CommTerm
from cpbench.model.cost.prediction import Prediction
from cpbench.model.hardware.profile import (
    CalibrationInfo,
    EfficiencyCurve,
    HardwareProfile,
    LinkCost,
)
from cpbench.model.hardware.transforms import with_curve, with_table
from cpbench.units import GB

DEFAULT_RIDGE = 1e-4
"""Weight of the pull towards the prior (in squared relative units per parameter)."""
MIN_SCALE = 1e-6
"""Lowest value of an unknown, as a multiple of its prior (keeps every parameter positive)."""
EFFICIENCY_CEILING = 2.0
"""A fitted kernel efficiency may reach this multiple of the prior's peak (the peaks are then
raised so the curve stays in (0, 1]); beyond it the data are explained some other way."""
OVERLAP_RIDGE = 1e-3
"""Pull of the overlap fit towards the prior (squared relative units)."""


# ---------------------------------------------------------------------------- least squares


def solve_relative(
    design: np.ndarray,
    target: np.ndarray,
    prior: np.ndarray,
    ridge: float = DEFAULT_RIDGE,
    lower: np.ndarray | None = None,
) -> np.ndarray:
    """x >= lower minimising sum(((design @ x - target) / target)^2) + ridge * sum((x/prior - 1)^2).

    Solved for z = x / prior, with the ridge rows sqrt(ridge) (z - 1) stacked under the relative
    residuals, as a bounded linear least-squares problem (scipy.optimize.lsq_linear, bounded-
    variable method): z >= MIN_SCALE (positive), raised to lower / prior where `lower` is given.
    """
    scaled = design * prior[None, :] / target[:, None]
    size = len(prior)
    root = math.sqrt(ridge)
    matrix = np.vstack([scaled, root * np.eye(size)])
    rhs = np.concatenate([np.ones(len(target)), np.full(size, root)])
    bound = np.full(size, MIN_SCALE)
    if lower is not None:
        bound = np.maximum(bound, lower / prior)
    solution = lsq_linear(matrix, rhs, bounds=(bound, np.inf), method="bvls")
    return np.maximum(np.asarray(solution.x, dtype=float), bound) * prior


# ------------------------------------------------------------------------------- fit reports


@dataclass(frozen=True)
class FitReport:
    """One least-squares fit: what was fitted on how many points, and how well."""

    target: str
    """Measured quantity: comm_only, compute_only, median (the overlap), or joint (every
    measured time at once, RMS of log errors)."""
    points: int
    """Measurements used."""
    residual_before: float
    """RMS relative error of the prior on those points."""
    residual_after: float
    """RMS relative error after the fit."""
    parameters: tuple[ParameterFit, ...]


@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated profile with the report of its fits."""

    profile: HardwareProfile
    prior: HardwareProfile
    """The profile the fit started from."""
    points: int
    """Measurements used."""
    fits: tuple[FitReport, ...]
    """Links, kernel efficiency, overlap (the linear fits), then the joint fit."""
    residual: float
    """RMS relative error of the predicted step (median) on the points, after the fit."""
    residual_before: float
    """The same with the prior."""
    notes: tuple[str, ...]
    """What could not be fitted, and why."""


# ----------------------------------------------------------------------------------- links


LINK_REFITS = 6
"""At most this many link fits: on a topology which level bounds a call depends on the costs
(a max), so the linear pieces are re-taken at the fitted profile until the fit stops
improving; a flat profile's are linear and the second fit changes nothing."""


def _comm_rows(
    measurements: Sequence[Measurement], profile: HardwareProfile
) -> list[tuple[Measurement, float, Prediction, list[CommTerm]]]:
    rows = []
    for m in measurements:
        if m.comm_only_s is None:
            continue
        p = m.predict(profile)
        terms = [t for t in p.comm_terms if t.phase == "forward" or m.candidate.phase != "fwd"]
        if terms:
            rows.append((m, m.comm_only_s, p, terms))
    return rows


def _fit_links(
    measurements: Sequence[Measurement], profile: HardwareProfile, ridge: float
) -> tuple[HardwareProfile, FitReport | None]:
    rows = _comm_rows(measurements, profile)
    if not rows:
        return profile, None
    prior_profile = profile
    before = [(p.comm_only_s - comm) / comm for _, comm, p, _ in rows]
    residual = rms(before)
    points: dict[LinkKey, int] = {}
    for _ in range(LINK_REFITS):
        fitted_profile, fitted_points = _fit_links_once(rows, profile, prior_profile.name, ridge)
        after = [(m.predict(fitted_profile).comm_only_s - comm) / comm for m, comm, _, _ in rows]
        if rms(after) >= residual * 0.999:
            break
        profile, residual = fitted_profile, rms(after)
        points.update(fitted_points)
        rows = _comm_rows(measurements, profile)
    parameters = []
    for key, count in sorted(points.items(), key=lambda kv: link_order(kv[0])):
        old, new = link_cost(prior_profile, key), link_cost(profile, key)
        label = link_label(profile, key)
        parameters += [
            ParameterFit(f"{label} latency", "us", old.latency_s * 1e6, new.latency_s * 1e6, count),
            ParameterFit(f"{label} busbw", "GB/s", old.busbw / GB, new.busbw / GB, count),
        ]
    report = FitReport("comm_only", len(rows), rms(before), residual, tuple(parameters))
    return profile, report


def _fit_links_once(
    rows: Sequence[tuple[Measurement, float, Prediction, list[CommTerm]]],
    profile: HardwareProfile,
    prior_name: str,
    ridge: float,
) -> tuple[HardwareProfile, dict[LinkKey, int]]:
    """One linear fit of the link costs the rows' terms price (linearised at `profile`)."""
    keys = sorted({(t.tier, t.kind, t.level) for *_, terms in rows for t in terms}, key=link_order)
    column = {key: 2 * i for i, key in enumerate(keys)}
    design = np.zeros((len(rows), 2 * len(keys)))
    for i, (*_, terms) in enumerate(rows):
        for t in terms:
            design[i, column[(t.tier, t.kind, t.level)]] += t.messages
            design[i, column[(t.tier, t.kind, t.level)] + 1] += t.bytes
    costs = [link_cost(profile, key) for key in keys]
    prior = np.array([v for c in costs for v in (max(c.latency_s, 1e-7), 1.0 / c.busbw)])
    target = np.array([comm for _, comm, _, _ in rows])
    fitted = solve_relative(design, target, prior, ridge)
    points: dict[LinkKey, int] = {}
    for key in keys:
        col = column[key]
        points[key] = int(np.count_nonzero(design[:, col] + design[:, col + 1]))
        cost = LinkCost(
            float(fitted[col]),
            float(1.0 / fitted[col + 1]),
            f"calibrated on {points[key]} comm-only measurements (prior {prior_name})",
        )
        profile = set_link_cost(profile, key, cost)
    return profile, points


# -------------------------------------------------------------------------------- compute


def _fit_compute(
    measurements: Sequence[Measurement], profile: HardwareProfile, ridge: float
) -> tuple[HardwareProfile, FitReport | None, list[str]]:
    """Fit 1/eff at every measured kernel sequence length n = L/R and the step overhead to the
    compute-only times of the measurements with one document's kernel calls:
    `slowest FLOPs / peak x (1/eff(n)) + steps x overhead`; then, with those, the call overhead
    to the rest (packed documents, windows: calls beyond one document's, `work.extra_calls`),
    whose pieces are smaller than the shard the curve is read at (so they do not shape it)."""
    rows = [
        (m, m.compute_only_s, m.predict(profile))
        for m in measurements
        if m.compute_only_s is not None
    ]
    if not rows:
        return profile, None, ["no compute_only times: kernel efficiency kept from the prior"]
    plain = [row for row in rows if not row[2].phase_time.calls]
    called = [row for row in rows if row[2].phase_time.calls]
    new: HardwareProfile = profile
    parameters: list[ParameterFit] = []
    notes: list[str] = []
    if plain:
        new, parameters, notes = _fit_curve(plain, profile, ridge)
    if called:
        call_overhead = _fit_call_overhead(called, new, ridge)
        new = with_table(new, "overheads", call_overhead_s=call_overhead)
        parameters.append(ParameterFit("call overhead", "us", profile.call_overhead_s * 1e6,
                                       call_overhead * 1e6, len(called)))
    before = [(p.compute_only_s - compute) / compute for _, compute, p in rows]
    after = [(m.predict(new).compute_only_s - compute) / compute for m, compute, _ in rows]
    report = FitReport("compute_only", len(rows), rms(before), rms(after), tuple(parameters))
    return new, report, notes


_Row = tuple[Measurement, float, Prediction]
CALL_FIT_ROUNDS = 4
"""Rounds of the call-overhead fit (each recounts the calls with the last value)."""


def _fit_curve(
    rows: Sequence[_Row], profile: HardwareProfile, ridge: float
) -> tuple[HardwareProfile, list[ParameterFit], list[str]]:
    """The kernel efficiency curve and the step overhead (`_fit_compute`)."""
    lengths = sorted({p.kernel_seq_len for *_, p in rows})
    column = {n: i for i, n in enumerate(lengths)}
    overhead_col = len(lengths)
    design = np.zeros((len(rows), len(lengths) + 1))
    target = np.zeros(len(rows))
    for i, (_, compute, p) in enumerate(rows):
        t = p.phase_time
        design[i, column[p.kernel_seq_len]] = t.slowest_flops / profile.peak_flops(p.candidate.dtype)
        design[i, overhead_col] = t.steps
        target[i] = max(compute - t.memory_bound_s, 0.1 * compute)
    prior = np.array(
        [1.0 / profile.efficiency.at(n) for n in lengths] + [max(profile.step_overhead_s, 1e-6)]
    )
    lower = np.array([1.0 / EFFICIENCY_CEILING] * len(lengths) + [0.0])
    fitted = solve_relative(design, target, prior, ridge, lower)
    efficiency = [float(1.0 / x) for x in fitted[:overhead_col]]
    overhead = float(fitted[overhead_col])
    scale = max(1.0, max(efficiency))
    notes = []
    peaks = {k: v * scale for k, v in profile.peak_tflops.items()}
    if scale > 1.0:
        notes.append(
            f"a fitted kernel efficiency reached {scale:.2f} of the prior peak: every dtype's peak "
            f"raised x{scale:.2f} so the curve stays in (0, 1]"
        )
    notes.append(
        f"kernel efficiency fitted at L/R = {', '.join(str(n) for n in lengths)}; "
        f"interpolated between them, constant outside"
    )
    curve = EfficiencyCurve(
        tuple(lengths),
        tuple(min(1.0, e / scale) for e in efficiency),
        f"calibrated on {len(rows)} compute-only measurements (prior {profile.name})",
    )
    new = with_table(with_curve(profile, profile.default_kernel, curve), "peaks", **peaks)
    new = with_table(new, "overheads", step_overhead_s=overhead)
    parameters = [
        ParameterFit(f"kernel efficiency at L/R={n}", "", profile.efficiency.at(n),
                     new.efficiency.at(n), int(np.count_nonzero(design[:, column[n]])))
        for n in lengths
    ]
    parameters.append(ParameterFit("step overhead", "us", profile.step_overhead_s * 1e6,
                                   overhead * 1e6, len(rows)))
    return new, parameters, notes


def _fit_call_overhead(rows: Sequence[_Row], profile: HardwareProfile, ridge: float) -> float:
    """Seconds per extra kernel call: what the rows' compute-only times leave over the rest of
    the profile's prediction, per call (relative least squares, ridge to the prior). Iterated:
    where ranks share compute slots, the calls counted depend on which rank sets each step,
    and that on the call overhead."""
    value = max(profile.call_overhead_s, 1e-6)
    for _ in range(CALL_FIT_ROUNDS):
        trial = with_table(profile, "overheads", call_overhead_s=value)
        design = np.zeros((len(rows), 1))
        target = np.zeros(len(rows))
        for i, (m, compute, _) in enumerate(rows):
            p = m.predict(trial)
            calls = p.phase_time.calls
            design[i, 0] = calls
            target[i] = max(compute - (p.compute_only_s - calls * value), 0.1 * compute)
        # a prior without a call overhead (0) says nothing to pull towards: no ridge
        pull = ridge if profile.call_overhead_s else 0.0
        prior = np.array([max(profile.call_overhead_s, 1e-6)])
        value = float(solve_relative(design, target, prior, pull, np.zeros(1))[0])
    return value


# -------------------------------------------------------------------------------- overlap


def _fit_overlap(
    measurements: Sequence[Measurement], profile: HardwareProfile
) -> tuple[HardwareProfile, FitReport | None]:
    """Fit u = 1 - overlap: median - step(overlap = 1) = u x overlappable, relative residuals,
    with OVERLAP_RIDGE pulling u towards the prior (the signal is small when the ring's
    communication is short next to its compute)."""
    full = with_table(profile, "overheads", overlap=1.0)
    predictions = [(m, m.predict(full)) for m in measurements]
    rows = [(m, p) for m, p in predictions if p.phase_time.overlappable_s > 0]
    if not rows:
        return profile, None
    prior_u = 1.0 - profile.overlap
    num = OVERLAP_RIDGE * prior_u
    den = OVERLAP_RIDGE
    for m, p in rows:
        s = p.phase_time.overlappable_s / m.median_s
        num += s * (m.median_s - p.step_s) / m.median_s
        den += s * s
    overlap = float(min(1.0, max(0.0, 1.0 - num / den)))
    new = with_table(profile, "overheads", overlap=overlap)
    before = [relative_error(m, profile) for m, _ in rows]
    after = [relative_error(m, new) for m, _ in rows]
    parameter = ParameterFit("ring overlap", "", profile.overlap, overlap, len(rows))
    return new, FitReport("median", len(rows), rms(before), rms(after), (parameter,))


# ------------------------------------------------------------------------------- calibrate


def relative_error(m: Measurement, profile: HardwareProfile) -> float:
    """(predicted - measured) / measured step time of `m` on `profile`."""
    return (m.predict(profile).step_s - m.median_s) / m.median_s


def fit_profile(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement],
    prior: HardwareProfile | str | None = None,
    *,
    name: str | None = None,
    files: Sequence[str] = (),
    ridge: float = DEFAULT_RIDGE,
) -> CalibrationResult:
    """Fit a profile to measurements (records or Measurement objects); see the module doc."""
    measurements = as_measurements(records)
    if not measurements:
        raise CpbenchError(
            "no usable measurements: calibration needs records with status 'ok', a feasible "
            "config and a positive timing.median"
        )
    base = resolve_prior(prior, measurements)
    profile, links = _fit_links(measurements, base, ridge)
    profile, compute, notes = _fit_compute(measurements, profile, ridge)
    overlap = None
    if links is not None and compute is not None:
        # from step times the overlap is the only unknown left only once the links and the
        # kernel are fitted from their own times; else it would absorb their errors, and the
        # joint fit takes it with them
        profile, overlap = _fit_overlap(measurements, profile)
    # the joint fit of every measured time, regularised toward the profile the linear fits
    # left (the prior itself where no compute-only / comm-only time fitted it)
    fitted = fit_joint(measurements, profile)
    profile = fitted.profile
    joint = FitReport(
        "joint", fitted.rows, fitted.residual_before, fitted.residual_after, fitted.parameters
    )
    if links is None:
        notes.insert(0, "no comm_only times with communication: links kept from the prior")
    if overlap is None:
        notes.append(
            "overlap not fitted alone (no ring configuration, or links / kernel without their "
            "own times): the joint fit takes it with the other parameters"
        )
    notes.append(
        "joint fit of every measured time (log, Gaussian prior in log-parameter space): "
        + "; ".join(f"{p.name} {p.status}" for p in joint.parameters)
    )
    residual = rms([relative_error(m, profile) for m in measurements])
    info = CalibrationInfo(base.name, len(measurements), residual, tuple(files))
    profile = replace(
        profile,
        name=name or f"{base.name}-calibrated",
        description=f"{base.description} (calibrated on {len(measurements)} measurements)",
        calibration=info,
        origin="calibrated",
    )
    profile = with_table(
        profile, "overheads", source=f"step overhead and overlap calibrated (prior {base.name})"
    )
    fits = tuple(f for f in (links, compute, overlap, joint) if f is not None)
    before = rms([relative_error(m, base) for m in measurements])
    return CalibrationResult(profile, base, len(measurements), fits, residual, before, tuple(notes))


def calibration_summary(result: CalibrationResult) -> dict[str, Any]:
    """JSON-serialisable summary of a calibration."""
    return {
        "prior": result.prior.name,
        "profile": result.profile.name,
        "points": result.points,
        "residual_before": result.residual_before,
        "residual": result.residual,
        "fits": [
            {**asdict(f), "parameters": [asdict(p) for p in f.parameters]} for f in result.fits
        ],
        "notes": list(result.notes),
    }
