"""Calibration: fit a hardware profile to measured results, and check predictions against them.

Pure Python plus numpy (least squares). A results record (cpbench/io/schema.py) with status
`ok` gives three measured times of one configuration: the step (`timing.median`), the step with
communication removed (`timing.compute_only`) and the communication alone (`timing.comm_only`).
The cost model (cost.py) is linear in its parameters for each of them, so each is a least-squares
fit, done in this order:

1. **links** from `comm_only`: `sum(messages x latency + bytes x sharing / busbw)` over the
   model's `CommTerm`s, unknowns latency and 1/busbw per (tier, collective kind) that occurs;
2. **kernel efficiency** from `compute_only`: `slowest FLOPs / (peak x eff(L/R)) + steps x
   step_overhead + memory-bound merges`, unknowns 1/eff at every measured kernel sequence length
   `L/R` (the fitted curve's points) and the step overhead; when a fitted efficiency exceeds 1
   the dtype peaks are raised by that factor so the curve stays in (0, 1];
3. **overlap** from `median`: the ring step is `max(c, h) + (1 - overlap) min(c, h)`, so the
   part of the step above perfect overlap is linear in `1 - overlap`.

Each fit minimises relative residuals (times span orders of magnitude), with unknowns scaled by
the prior profile and a small ridge term pulling them towards it: a parameter no measurement
constrains keeps its prior value. Parameters are kept positive (active-set least squares).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import numpy as np

from cpbench.errors import CpbenchError
from cpbench.model.cost import (
    MeshCandidate,
    Prediction,
    predict,
    record_devices_per_node,
)
from cpbench.model.flops import FLOPS_CONVENTION, attention_flops
from cpbench.model.formulas import comm_volume
from cpbench.model.hardware import (
    GB,
    CalibrationInfo,
    EfficiencyCurve,
    HardwareProfile,
    LinkCost,
    load_profile,
    with_link_cost,
)
from cpbench.model.memory import memory_estimate

DEFAULT_RIDGE = 1e-4
"""Weight of the pull towards the prior (in squared relative units per parameter)."""
TIE = 1e-6
"""Relative difference under which two predictions are a tie."""
EFFICIENCY_CEILING = 2.0
"""A fitted kernel efficiency may reach this multiple of the prior's peak (the peaks are then
raised so the curve stays in (0, 1]); beyond it the data are explained some other way."""
OVERLAP_RIDGE = 1e-3
"""Pull of the overlap fit towards the prior (squared relative units)."""
Split = Literal["stratified", "random"]
SPLITS: tuple[str, ...] = get_args(Split)
CPU_PRIOR = "cpu-local"
GPU_PRIOR = "h100-sxm"


# ------------------------------------------------------------------------------ measurements


@dataclass(frozen=True)
class Measurement:
    """One `ok` results record reduced to what calibration and validation use."""

    record_id: str
    """The record's id (or a description built from its config)."""
    candidate: MeshCandidate
    """The configuration measured."""
    devices_per_node: int
    """world_size / nodes of the run."""
    median_s: float
    """Measured step time (timing.median)."""
    compute_only_s: float | None
    """Measured step with communication removed, when recorded."""
    comm_only_s: float | None
    """Measured communication alone, when recorded."""
    device: str
    """cpu or cuda."""

    @property
    def key(self) -> tuple[Any, ...]:
        """Identity of the configuration (duplicates keep the last record)."""
        c = self.candidate
        return (c.shape, c.ulysses, c.ring, c.layout, c.dtype, c.causal, c.phase, self.device)

    @property
    def group(self) -> tuple[Any, ...]:
        """Configurations in one group solve the same problem on the same ranks (rankable)."""
        c = self.candidate
        return (c.shape, c.dtype, c.causal, c.phase, c.world, self.device)

    @property
    def label(self) -> str:
        """Short human description: UxR layout L phase."""
        c = self.candidate
        return f"{c.ulysses}x{c.ring} {c.layout} L={c.shape.seq_len} {c.phase}"


def _positive_time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 and math.isfinite(value) else None


def measurement_from_record(record: Mapping[str, Any]) -> Measurement | None:
    """A Measurement from an `ok` record with a usable config and timing.median; else None.
    Records of external implementations (config.impl other than cpbench) are left out: the
    cost model describes cpbench's own implementation."""
    if record.get("status") != "ok":
        return None
    config, timing = record.get("config"), record.get("timing")
    if not isinstance(config, Mapping) or not isinstance(timing, Mapping):
        return None
    if config.get("impl", "cpbench") != "cpbench":
        return None
    median = _positive_time(timing.get("median"))
    if median is None:
        return None
    try:
        candidate = MeshCandidate.from_config(config)
        candidate.cp_config()
    except (CpbenchError, TypeError, ValueError):
        return None
    return Measurement(
        str(record.get("id") or ""),
        candidate,
        record_devices_per_node(config),
        median,
        _positive_time(timing.get("compute_only")),
        _positive_time(timing.get("comm_only")),
        str(config.get("device", "cpu")),
    )


def measurements_from_records(records: Iterable[Mapping[str, Any]]) -> list[Measurement]:
    """Usable measurements, one per configuration (a repeated configuration keeps its last)."""
    by_key: dict[tuple[Any, ...], Measurement] = {}
    for record in records:
        m = measurement_from_record(record)
        if m is not None:
            by_key.pop(m.key, None)
            by_key[m.key] = m
    result = []
    for m in by_key.values():
        result.append(m if m.record_id else replace(m, record_id=m.label))
    return result


def default_prior_name(measurements: Sequence[Measurement]) -> str:
    """cpu-local for CPU measurements, else h100-sxm."""
    if measurements and all(m.device == "cpu" for m in measurements):
        return CPU_PRIOR
    return GPU_PRIOR


def _predict(m: Measurement, profile: HardwareProfile) -> Prediction:
    return predict(m.candidate, profile, m.devices_per_node)


# ---------------------------------------------------------------------------- least squares


def solve_relative(
    design: np.ndarray,
    target: np.ndarray,
    prior: np.ndarray,
    ridge: float = DEFAULT_RIDGE,
    lower: np.ndarray | None = None,
) -> np.ndarray:
    """x >= lower minimising sum(((design @ x - target) / target)^2) + ridge * sum((x/prior - 1)^2).

    Active set: unknowns that come out below their bound (default 1e-6 x prior, i.e. positive)
    are pinned at it and the rest re-solved.
    """
    scaled = design * prior[None, :] / target[:, None]
    size = len(prior)
    matrix = np.vstack([scaled, math.sqrt(ridge) * np.eye(size)])
    rhs = np.concatenate([np.ones(len(target)), math.sqrt(ridge) * np.ones(size)])
    bound = np.full(size, 1e-6)
    if lower is not None:
        bound = np.maximum(bound, lower / prior)
    pinned = np.zeros(size, dtype=bool)
    z = bound.copy()
    for _ in range(size + 1):
        free = ~pinned
        residual_rhs = rhs - matrix[:, pinned] @ z[pinned]
        solution, *_ = np.linalg.lstsq(matrix[:, free], residual_rhs, rcond=None)
        z[free] = solution
        below = free & (z < bound)
        if not below.any():
            break
        pinned |= below
        z[pinned] = bound[pinned]
    return z * prior


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


# ------------------------------------------------------------------------------- fit reports


@dataclass(frozen=True)
class ParameterFit:
    """One fitted parameter, before and after."""

    name: str
    """e.g. `intra_node all_to_all busbw`."""
    unit: str
    """Unit of prior and fitted."""
    prior: float
    """Value in the prior profile."""
    fitted: float
    """Value after the fit."""
    points: int
    """Measurements that constrain it (0: kept at the prior)."""


@dataclass(frozen=True)
class FitReport:
    """One least-squares fit: what was fitted on how many points, and how well."""

    target: str
    """Measured quantity: comm_only, compute_only or median."""
    points: int
    """Measurements used."""
    residual_before: float
    """RMS relative error of the prior on those points."""
    residual_after: float
    """RMS relative error after the fit."""
    parameters: tuple[ParameterFit, ...]
    """The fitted parameters."""


@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated profile with the report of its fits."""

    profile: HardwareProfile
    """The fitted profile."""
    prior: HardwareProfile
    """The profile the fit started from."""
    points: int
    """Measurements used."""
    fits: tuple[FitReport, ...]
    """Links, kernel efficiency, overlap."""
    residual: float
    """RMS relative error of the predicted step (median) on the points, after the fit."""
    residual_before: float
    """The same with the prior."""
    notes: tuple[str, ...]
    """What could not be fitted, and why."""


# ----------------------------------------------------------------------------------- links


def _fit_links(
    measurements: Sequence[Measurement], profile: HardwareProfile, ridge: float
) -> tuple[HardwareProfile, FitReport | None]:
    rows = []
    for m in measurements:
        if m.comm_only_s is None:
            continue
        p = _predict(m, profile)
        terms = [t for t in p.comm_terms if t.phase == "forward" or m.candidate.phase != "fwd"]
        if terms:
            rows.append((m, p, terms))
    if not rows:
        return profile, None
    keys = sorted({(t.tier, t.kind) for _, _, terms in rows for t in terms})
    column = {key: 2 * i for i, key in enumerate(keys)}
    design = np.zeros((len(rows), 2 * len(keys)))
    for i, (_, _, terms) in enumerate(rows):
        for t in terms:
            design[i, column[(t.tier, t.kind)]] += t.messages
            design[i, column[(t.tier, t.kind)] + 1] += t.bytes
    prior = np.array(
        [
            value
            for tier, kind in keys
            for value in (
                max(profile.link(tier).cost(kind).latency_s, 1e-7),
                1.0 / profile.link(tier).cost(kind).busbw,
            )
        ]
    )
    target = np.array([m.comm_only_s for m, _, _ in rows])
    fitted = solve_relative(design, target, prior, ridge)
    before = [(p.comm_only_s - m.comm_only_s) / m.comm_only_s for m, p, _ in rows]
    parameters = []
    for tier, kind in keys:
        col = column[(tier, kind)]
        old = profile.link(tier).cost(kind)
        points = int(np.count_nonzero(design[:, col] + design[:, col + 1]))
        cost = LinkCost(
            float(fitted[col]),
            float(1.0 / fitted[col + 1]),
            f"calibrated on {points} comm-only measurements (prior {profile.name})",
        )
        profile = with_link_cost(profile, tier, kind, cost)
        parameters += [
            ParameterFit(
                f"{tier} {kind} latency", "us", old.latency_s * 1e6, cost.latency_s * 1e6, points
            ),
            ParameterFit(f"{tier} {kind} busbw", "GB/s", old.busbw / GB, cost.busbw / GB, points),
        ]
    after = [(_predict(m, profile).comm_only_s - m.comm_only_s) / m.comm_only_s for m, _, _ in rows]
    report = FitReport("comm_only", len(rows), _rms(before), _rms(after), tuple(parameters))
    return profile, report


# -------------------------------------------------------------------------------- compute


def _fit_compute(
    measurements: Sequence[Measurement], profile: HardwareProfile, ridge: float
) -> tuple[HardwareProfile, FitReport | None, list[str]]:
    """Fit 1/eff at every measured kernel sequence length n = L/R, and the step overhead, to
    the compute-only times: `slowest FLOPs / peak x (1/eff(n)) + steps x overhead`."""
    rows = [(m, _predict(m, profile)) for m in measurements if m.compute_only_s is not None]
    if not rows:
        return profile, None, ["no compute_only times: kernel efficiency kept from the prior"]
    lengths = sorted({p.kernel_seq_len for _, p in rows})
    column = {n: i for i, n in enumerate(lengths)}
    overhead_col = len(lengths)
    design = np.zeros((len(rows), len(lengths) + 1))
    target = np.zeros(len(rows))
    for i, (m, p) in enumerate(rows):
        t = p.phase_time
        design[i, column[p.kernel_seq_len]] = t.slowest_flops / profile.peak_flops(p.config.dtype)
        design[i, overhead_col] = t.steps
        assert m.compute_only_s is not None
        target[i] = max(m.compute_only_s - t.memory_bound_s, 0.1 * m.compute_only_s)
    prior = np.array(
        [1.0 / profile.efficiency.at(n) for n in lengths] + [max(profile.step_overhead_s, 1e-6)]
    )
    lower = np.array([1.0 / EFFICIENCY_CEILING] * len(lengths) + [0.0])
    fitted = solve_relative(design, target, prior, ridge, lower)
    efficiency = [float(1.0 / x) for x in fitted[:overhead_col]]
    overhead = float(fitted[overhead_col])
    scale = max(1.0, max(efficiency))
    notes = []
    peaks = dict(profile.peak_tflops)
    if scale > 1.0:
        peaks = {k: v * scale for k, v in peaks.items()}
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
    new = replace(profile, peak_tflops=peaks, efficiency=curve, step_overhead_s=overhead)
    before = [_compute_error(m, p) for m, p in rows]
    after = [_compute_error(m, _predict(m, new)) for m, _ in rows]
    parameters = [
        ParameterFit(
            f"kernel efficiency at L/R={n}",
            "",
            profile.efficiency.at(n),
            new.efficiency.at(n),
            int(np.count_nonzero(design[:, column[n]])),
        )
        for n in lengths
    ]
    parameters.append(
        ParameterFit(
            "step overhead", "us", profile.step_overhead_s * 1e6, overhead * 1e6, len(rows)
        )
    )
    report = FitReport("compute_only", len(rows), _rms(before), _rms(after), tuple(parameters))
    return new, report, notes


def _compute_error(m: Measurement, p: Prediction) -> float:
    assert m.compute_only_s is not None
    return (p.compute_only_s - m.compute_only_s) / m.compute_only_s


# -------------------------------------------------------------------------------- overlap


def _fit_overlap(
    measurements: Sequence[Measurement], profile: HardwareProfile
) -> tuple[HardwareProfile, FitReport | None]:
    """Fit u = 1 - overlap: median - step(overlap = 1) = u x overlappable, relative residuals,
    with OVERLAP_RIDGE pulling u towards the prior (the signal is small when the ring's
    communication is short next to its compute)."""
    full = replace(profile, overlap=1.0)
    rows = []
    for m in measurements:
        p = _predict(m, full)
        if p.phase_time.overlappable_s > 0:
            rows.append((m, p))
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
    new = replace(profile, overlap=overlap)
    before = [(_predict(m, profile).step_s - m.median_s) / m.median_s for m, _ in rows]
    after = [(_predict(m, new).step_s - m.median_s) / m.median_s for m, _ in rows]
    parameter = ParameterFit("ring overlap", "", profile.overlap, overlap, len(rows))
    return new, FitReport("median", len(rows), _rms(before), _rms(after), (parameter,))


# ------------------------------------------------------------------------------- calibrate


def calibrate(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement],
    prior: HardwareProfile | str | None = None,
    *,
    name: str | None = None,
    files: Sequence[str] = (),
    ridge: float = DEFAULT_RIDGE,
) -> CalibrationResult:
    """Fit a profile to measurements (records or Measurement objects); see the module doc."""
    measurements = _as_measurements(records)
    if not measurements:
        raise CpbenchError(
            "no usable measurements: calibration needs records with status 'ok', a feasible "
            "config and a positive timing.median"
        )
    base = _resolve_prior(prior, measurements)
    profile, links = _fit_links(measurements, base, ridge)
    profile, compute, notes = _fit_compute(measurements, profile, ridge)
    profile, overlap = _fit_overlap(measurements, profile)
    if links is None:
        notes.insert(0, "no comm_only times with communication: links kept from the prior")
    if overlap is None:
        notes.append("no ring configuration measured: overlap kept from the prior")
    residual = _rms([_relative_error(m, profile) for m in measurements])
    info = CalibrationInfo(base.name, len(measurements), residual, tuple(files))
    profile = replace(
        profile,
        name=name or f"{base.name}-calibrated",
        description=f"{base.description} (calibrated on {len(measurements)} measurements)",
        calibration=info,
        origin="calibrated",
        overheads_source=f"step overhead and overlap calibrated (prior {base.name})",
    )
    fits = tuple(f for f in (links, compute, overlap) if f is not None)
    before = _rms([_relative_error(m, base) for m in measurements])
    return CalibrationResult(profile, base, len(measurements), fits, residual, before, tuple(notes))


def _as_measurements(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement],
) -> list[Measurement]:
    items = list(records)
    if all(isinstance(r, Measurement) for r in items):
        return items  # type: ignore[return-value]
    return measurements_from_records(items)  # type: ignore[arg-type]


def _resolve_prior(
    prior: HardwareProfile | str | None, measurements: Sequence[Measurement]
) -> HardwareProfile:
    if isinstance(prior, HardwareProfile):
        return prior
    return load_profile(prior or default_prior_name(measurements))


def _relative_error(m: Measurement, profile: HardwareProfile) -> float:
    return (_predict(m, profile).step_s - m.median_s) / m.median_s


# ------------------------------------------------------------------------------ validation


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None with < 2 points or no spread."""
    if len(x) != len(y):
        raise CpbenchError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / math.sqrt(vx * vy)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def validation_rows(
    measurements: Sequence[Measurement], profile: HardwareProfile
) -> list[dict[str, Any]]:
    """Predicted vs measured per configuration: error = predicted / measured - 1."""
    rows = []
    for m in measurements:
        p = _predict(m, profile)
        rows.append(
            {
                "id": m.record_id,
                "config": m.label,
                "ulysses": m.candidate.ulysses,
                "ring": m.candidate.ring,
                "layout": m.candidate.layout,
                "seq_len": m.candidate.shape.seq_len,
                "phase": m.candidate.phase,
                "measured_s": m.median_s,
                "predicted_s": p.step_s,
                "error": p.step_s / m.median_s - 1,
                "measured_compute_only_s": m.compute_only_s,
                "predicted_compute_only_s": p.compute_only_s,
                "measured_comm_only_s": m.comm_only_s,
                "predicted_comm_only_s": p.comm_only_s,
            }
        )
    return rows


def validation_summary(
    measurements: Sequence[Measurement], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Median/max absolute error, Spearman over all rows, and regret per comparable group.

    Regret of a group (same problem, dtype, mask, phase, ranks): measured time of the
    configuration the model ranks fastest / the measured fastest - 1; `regret` is the largest.
    Configurations the model cannot tell apart (within TIE, e.g. the layouts of a U x 1 mesh,
    which run the same computation) count with their mean measured time.
    """
    if not rows:
        raise CpbenchError("nothing to validate: no measurements")
    errors = [abs(r["error"]) for r in rows]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, m in enumerate(measurements):
        groups.setdefault(m.group, []).append(i)
    details = []
    for members in groups.values():
        fastest = min(rows[i]["predicted_s"] for i in members)
        chosen = [i for i in members if rows[i]["predicted_s"] <= fastest * (1 + TIE)]
        best = min(members, key=lambda i: rows[i]["measured_s"])
        chosen_s = statistics.fmean(rows[i]["measured_s"] for i in chosen)
        details.append(
            {
                "configurations": len(members),
                "chosen": " = ".join(rows[i]["config"] for i in chosen),
                "best": rows[best]["config"],
                "regret": chosen_s / rows[best]["measured_s"] - 1,
                "spearman": spearman(
                    [rows[i]["predicted_s"] for i in members],
                    [rows[i]["measured_s"] for i in members],
                ),
            }
        )
    rankable = [d for d in details if d["configurations"] > 1]
    return {
        "n": len(rows),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "spearman": spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
        "regret": max((d["regret"] for d in rankable), default=None),
        "regret_mean": (statistics.fmean(d["regret"] for d in rankable) if rankable else None),
        "groups": details,
    }


def validate(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement], profile: HardwareProfile
) -> dict[str, Any]:
    """Predicted vs measured for every usable record, with the summary metrics."""
    measurements = _as_measurements(records)
    if not measurements:
        raise CpbenchError("nothing to validate: no records with status 'ok' and a timing.median")
    rows = validation_rows(measurements, profile)
    return {"profile": profile.name, "rows": rows, **validation_summary(measurements, rows)}


# -------------------------------------------------------------------------------- holdout


def split_measurements(
    measurements: Sequence[Measurement],
    fraction: float = 0.5,
    seed: int = 0,
    split: Split = "stratified",
) -> tuple[list[Measurement], list[Measurement]]:
    """(train, test): `fraction` of the configurations held out, at least one on each side.

    `stratified` orders the configurations by mesh (U x R), shuffled inside each mesh, and holds
    out every 1/fraction-th one (systematic sampling from a random offset), so each mesh with
    several configurations lands on both sides; `random` shuffles them all.
    """
    if split not in SPLITS:
        raise CpbenchError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    if not 0 < fraction < 1:
        raise CpbenchError(f"holdout fraction must be between 0 and 1 (exclusive), got {fraction}")
    n = len(measurements)
    if n < 2:
        raise CpbenchError(f"a holdout split needs at least 2 measured configurations, got {n}")
    rng = random.Random(seed)
    items = list(measurements)
    rng.shuffle(items)
    n_test = min(n - 1, max(1, round(n * fraction)))
    if split == "random":
        return items[n_test:], items[:n_test]
    items.sort(key=lambda m: (m.candidate.ulysses, m.candidate.ring))  # stable: shuffled inside
    offset = rng.random()
    test_index = {min(n - 1, math.floor((k + offset) * n / n_test)) for k in range(n_test)}
    train = [m for i, m in enumerate(items) if i not in test_index]
    test = [m for i, m in enumerate(items) if i in test_index]
    return train, test


def holdout_evaluation(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement],
    seed: int = 0,
    *,
    prior: HardwareProfile | str | None = None,
    fraction: float = 0.5,
    split: Split = "stratified",
) -> dict[str, Any]:
    """Calibrate on part of the configurations, predict the rest.

    Returns median_abs_error, max_abs_error, spearman, regret (measured time of the held-out
    configuration the calibrated model ranks fastest vs the measured fastest held-out one, per
    comparable group, the largest), n_train, n_test, the rows and the calibration summary.
    """
    measurements = _as_measurements(records)
    train, test = split_measurements(measurements, fraction, seed, split)
    result = calibrate(train, prior)
    rows = validation_rows(test, result.profile)
    summary = validation_summary(test, rows)
    return {
        "n_train": len(train),
        "n_test": len(test),
        "median_abs_error": summary["median_abs_error"],
        "max_abs_error": summary["max_abs_error"],
        "spearman": summary["spearman"],
        "regret": summary["regret"],
        "regret_mean": summary["regret_mean"],
        "groups": summary["groups"],
        "split": split,
        "fraction": fraction,
        "seed": seed,
        "prior": result.prior.name,
        "train": [m.label for m in train],
        "rows": rows,
        "calibration": calibration_summary(result),
    }


def calibration_summary(result: CalibrationResult) -> dict[str, Any]:
    """JSON-serialisable summary of a calibration."""
    return {
        "prior": result.prior.name,
        "profile": result.profile.name,
        "points": result.points,
        "residual_before": result.residual_before,
        "residual": result.residual,
        "fits": [
            {
                "target": f.target,
                "points": f.points,
                "residual_before": f.residual_before,
                "residual_after": f.residual_after,
                "parameters": [
                    {
                        "name": p.name,
                        "unit": p.unit,
                        "prior": p.prior,
                        "fitted": p.fitted,
                        "points": p.points,
                    }
                    for p in f.parameters
                ],
            }
            for f in result.fits
        ],
        "notes": list(result.notes),
    }


# -------------------------------------------------------------------------- synthetic data


def synthetic_record(
    candidate: MeshCandidate,
    profile: HardwareProfile,
    devices_per_node: int | None = None,
    noise: float = 0.0,
    rng: random.Random | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """A results record (schema.py) whose times are the cost model's on `profile`, each times
    (1 + noise x N(0, 1)): ground truth for testing calibration and validation."""
    rng = rng or random.Random(0)
    per_node = devices_per_node or profile.devices_per_node
    p = predict(candidate, profile, per_node)
    c = p.config

    def noisy(value: float) -> float:
        return max(value * (1.0 + noise * rng.gauss(0.0, 1.0)), 1e-9)

    median, compute, comm = noisy(p.step_s), noisy(p.compute_only_s), noisy(p.comm_only_s)
    world = c.world
    nodes = max(1, -(-world // per_node))
    volume = comm_volume(c)
    causal = "causal" if candidate.causal else "full"
    s = c.shape
    record_id = (
        f"L{s.seq_len}-B{s.batch}-h{s.heads}-kv{s.kv_heads}-d{s.head_dim}-{c.dtype}-{causal}-"
        f"U{c.ulysses}xR{c.ring}-{c.layout}-rep{c.kv_replication}-auto-{candidate.phase}-"
        f"{device}-w{world}"
    )
    flops = attention_flops(
        s, candidate.causal, "forward" if candidate.phase == "fwd" else "forward_backward"
    )
    return {
        "schema_version": 1,
        "id": record_id,
        "scenario": "synthetic",
        "status": "ok",
        "error": None,
        "config": {
            "seq_len": s.seq_len,
            "batch": s.batch,
            "heads": s.heads,
            "kv_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "dtype": c.dtype,
            "causal": candidate.causal,
            "ulysses": c.ulysses,
            "ring": c.ring,
            "layout": c.layout,
            "kv_replication": c.kv_replication,
            "backend": "auto",
            "kernel": "synthetic",
            "device": device,
            "world_size": world,
            "nodes": nodes,
            "phase": candidate.phase,
            "scheme": c.scheme,
        },
        "timing": {
            "phase": candidate.phase,
            "median": median,
            "p10": median,
            "p90": median,
            "samples": [median],
            "compute_only": compute,
            "comm_only": comm,
            "exposed_comm": max(0.0, median - compute),
        },
        "comm": {
            "analytic_bytes": {
                "fwd": volume.bytes_sent("forward"),
                "bwd": volume.bytes_sent("backward"),
            },
            "measured_bytes": {
                "fwd": [volume.bytes_sent("forward")] * world,
                "bwd": [volume.bytes_sent("backward")] * world,
            },
            "match": True,
        },
        "memory": {"analytic_peak_bytes": memory_estimate(c).peak("forward_backward")},
        "flops": {
            "convention": FLOPS_CONVENTION,
            "global": flops,
            "achieved_tflops": flops / median / 1e12,
        },
    }
