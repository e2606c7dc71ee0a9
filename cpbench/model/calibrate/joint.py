"""One joint fit of kernel, link and overlap parameters to any set of measured times.

The objective, the prior and what the data determine: docs/cost-model.md section 2."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.optimize import least_squares

from cpbench.errors import CpbenchError
from cpbench.model.calibrate.measurements import Measurement
from cpbench.model.calibrate.stats import rms
from cpbench.model.cost.prediction import Prediction, predict
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.profile import HardwareProfile, LinkBasis, LinkCost, LinkTier
from cpbench.model.hardware.transforms import with_link_cost, with_table, with_tier_cost
from cpbench.units import GB

PRIOR_LOG_SD = {
    "kernel throughput": 0.5,
    "step overhead": 1.0,
    "latency": 1.0,
    "busbw": 0.7,
    "1 - overlap": 0.7,
}
"""Prior sd of each parameter's log (0.5 = a factor e^0.5 = 1.65 at one sd). Choices, wide
enough for the prior errors issue 24 reports (a PCIe all-to-all 4.4x slower than its line
rate, a kernel at head dim 32 1.6-3.9x slower), so the data decide where they can. The busbw
sd is that of a link number that only a specification or an estimate supports."""
MEASURED_BUSBW_LOG_SD = 0.35
"""Prior sd of the log busbw of a link measured on this kind of machine (`LinkCost.basis`
'measured': nccl-tests rows, `cpbench probe`): half the spec / estimate one (0.7), a choice:
nccl-tests results of one machine type spread by tens of percent (NIC firmware, BIOS, PCIe
ACS / IOMMU settings), not by factors."""
NOISE_START = 0.05
"""Noise (sd of log time) the first pass assumes; the second pass uses the residuals'."""
NOISE_FLOOR = 0.01
"""Least noise of the second pass (a fit that explains its data exactly still has noise)."""
DETERMINED_SD = 0.05
"""A parameter is determined when the posterior sd of its log is at most 0.05 (the data fix
it to +-5% at one sd)."""
CONSTRAINED_RATIO = 0.5
"""A parameter not determined is constrained when its posterior sd is below half its prior
sd (the data moved it, but not to +-5%); else it stays at the prior."""
FIT_TOLERANCE = 1e-4
"""least_squares' ftol / xtol / gtol: a log-time residual settled to 1e-4 (0.01%) is far below
any measurement's noise (on the shipped published table 1e-6 gave the same scores to 0.02
points at 2.4x the time; the default 1e-8 only costs iterations)."""
MAX_EVALUATIONS = 60
"""At most this many evaluations per pass (each also costs a numerical Jacobian)."""
LOWEST_U = 0.02
"""Least 1 - overlap of the reference (the log of 0 is not a parameter)."""
MISFIT_FACTOR = 2.0
"""A physical parameter (a link's busbw or latency, the step overhead) the data move more than
this factor from its prior is reported as the model's misfit: links and launches do not miss
their rates by 2x, so the fit is putting there an error of the model's structure."""
SPEC_MARGIN = 1.1
"""A busbw fitted more than 10% above a specification's (basis `spec`) is no link's."""
PHYSICAL_KINDS = ("busbw", "latency", "step overhead")
"""The parameters with a physical range (kernel throughput and overlap have no such bound)."""


LinkKey = tuple[LinkTier, CollectiveKind, "int | None"]
"""What a comm term prices: (link tier, collective kind, topology node tier or None)."""
ParameterStatus = Literal["determined", "constrained", "undetermined"]
"""How well the data pin a parameter down (`parameter_status`)."""


@dataclass(frozen=True)
class ParameterFit:
    """One fitted parameter, before and after (of a linear fit, or of the joint fit with its
    prior and posterior sd and how well the data pin it down)."""

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
    prior_sd: float | None = None
    """Joint fit: the prior sd of its log (None: a linear fit's parameter)."""
    posterior_sd: float | None = None
    """Joint fit: the posterior sd of its log ((J^T J)^-1 at the optimum)."""
    status: ParameterStatus | None = None
    """Joint fit: `parameter_status`."""
    misfit: str | None = None
    """Joint fit: why its fitted value is outside the physical range, the model's misfit
    (`MISFIT_FACTOR`, `SPEC_MARGIN`); None when it is inside or the data do not pin it."""


def _parameter_misfit(spec: _Spec, fitted: float, status: ParameterStatus) -> str | None:
    """The misfit a fitted value shows (`ParameterFit.misfit`), naming what absorbed it."""
    if status == "undetermined" or spec.kind not in PHYSICAL_KINDS:
        return None
    ratio = fitted / spec.value
    if spec.kind == "busbw" and spec.basis == "spec" and ratio > SPEC_MARGIN:
        off = f"above its specification ({spec.value:.3g} {spec.unit})"
    elif 1 / MISFIT_FACTOR <= ratio <= MISFIT_FACTOR:
        return None
    else:
        off = f"{ratio:.2g}x its prior ({spec.value:.3g} {spec.unit})"
    thing = "launch" if spec.kind == "step overhead" else "link"
    return (
        f"model misfit: {spec.name} fitted {fitted:.3g} {spec.unit}, {off}; no {thing} is that "
        f"far from its rate: the prior is not this machine's (--hardware), or the fit put an "
        f"error of the model's structure (kernel time, overlap) into it; trust measurements "
        f"over predictions that lean on it"
    )


def parameter_status(prior_sd: float, posterior_sd: float) -> ParameterStatus:
    """determined, constrained or undetermined (docs/cost-model.md section 2)."""
    if posterior_sd <= DETERMINED_SD:
        return "determined"
    if posterior_sd < CONSTRAINED_RATIO * prior_sd:
        return "constrained"
    return "undetermined"


@dataclass(frozen=True)
class JointFit:
    """The result of a joint fit."""

    profile: HardwareProfile
    parameters: tuple[ParameterFit, ...]
    """Every parameter, fitted or kept at the prior (points: the rows, 0 when undetermined)."""
    rows: int
    """Measured times fitted (steps, compute-only and comm-only times)."""
    residual_before: float
    """RMS of log(predicted / measured) over the rows on the reference profile."""
    residual_after: float
    """The same after the fit."""
    noise: float
    """Noise (sd of log time) of the final pass."""


@dataclass(frozen=True)
class _Spec:
    name: str
    unit: str
    kind: str
    value: float
    apply: Callable[[HardwareProfile, float], HardwareProfile]
    basis: LinkBasis | None = None
    """A link parameter's `LinkCost.basis` (None: not a link's)."""


def link_cost(profile: HardwareProfile, key: LinkKey) -> LinkCost:
    """The LinkCost a comm term prices: a node tier of the topology, or a link tier."""
    tier, kind, level = key
    if level is None:
        return profile.link(tier).cost(kind)
    return profile.node_tiers()[level].cost(kind)


def set_link_cost(profile: HardwareProfile, key: LinkKey, cost: LinkCost) -> HardwareProfile:
    """`profile` with the link a comm term prices set to `cost`."""
    tier, kind, level = key
    if level is None:
        return with_link_cost(profile, tier, kind, cost)
    return with_tier_cost(profile, level, kind, cost)


def link_label(profile: HardwareProfile, key: LinkKey) -> str:
    """The link in words: `intra_node all_to_all`, or `topology tier 1 (nvlink) send_recv`."""
    tier, kind, level = key
    if level is None:
        return f"{tier} {kind}"
    return f"topology tier {level} ({profile.node_tiers()[level].kind}) {kind}"


def link_order(key: LinkKey) -> tuple[str, str, int]:
    """Sort key of the links: tier, kind, then node tier (the link tier's own first)."""
    tier, kind, level = key
    return (tier, kind, -1 if level is None else level)


def _specs(reference: HardwareProfile, keys: Sequence[LinkKey], ring: bool) -> list[_Spec]:
    """The parameters and how each sets its value on a profile."""

    def throughput(p: HardwareProfile, factor: float) -> HardwareProfile:
        return with_table(p, "peaks", **{k: v * factor for k, v in p.peak_tflops.items()})

    def overhead(p: HardwareProfile, value: float) -> HardwareProfile:
        return with_table(p, "overheads", step_overhead_s=value)

    specs = [
        _Spec("kernel throughput", "x prior", "kernel throughput", 1.0, throughput),
        _Spec("step overhead", "us", "step overhead", max(reference.step_overhead_s, 1e-6) * 1e6,
              lambda p, v: overhead(p, v * 1e-6)),
    ]  # fmt: skip
    for key in keys:
        label = link_label(reference, key)
        cost = link_cost(reference, key)

        def latency(p: HardwareProfile, v: float, key: LinkKey = key) -> HardwareProfile:
            old = link_cost(p, key)
            return set_link_cost(p, key, replace(old, latency_s=v * 1e-6))

        def busbw(p: HardwareProfile, v: float, key: LinkKey = key) -> HardwareProfile:
            old = link_cost(p, key)
            return set_link_cost(p, key, replace(old, busbw=v * GB))

        specs += [
            _Spec(f"{label} latency", "us", "latency", max(cost.latency_s, 1e-7) * 1e6, latency),
            _Spec(f"{label} busbw", "GB/s", "busbw", cost.busbw / GB, busbw, cost.basis),
        ]
    if ring:
        specs.append(
            _Spec("1 - overlap", "", "1 - overlap", max(1.0 - reference.overlap, LOWEST_U),
                  lambda p, v: with_table(p, "overheads", overlap=max(0.0, 1.0 - v)))
        )  # fmt: skip
    return specs


def _prior_sd(spec: _Spec) -> float:
    """A parameter's prior sd: a measured link's busbw gets `MEASURED_BUSBW_LOG_SD`, everything
    else `PRIOR_LOG_SD` of its kind."""
    if spec.kind == "busbw" and spec.basis == "measured":
        return MEASURED_BUSBW_LOG_SD
    return PRIOR_LOG_SD[spec.kind]


def _times(m: Measurement) -> list[tuple[str, float]]:
    """(the `Prediction` property predicting it, the time) of each time measured in `m`."""
    times = {"step_s": m.median_s, "compute_only_s": m.compute_only_s, "comm_only_s": m.comm_only_s}
    return [(what, t) for what, t in times.items() if t is not None]


JACOBIAN_STEP = 1e-4
"""Step in log-parameter space of the forward-difference Jacobian at the start."""


def _jacobian(
    function: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """Forward differences of `function` at `theta` (`at` = function(theta))."""
    columns = []
    for k in range(len(theta)):
        moved = theta.copy()
        moved[k] += JACOBIAN_STEP
        columns.append((function(moved) - at) / JACOBIAN_STEP)
    return np.stack(columns, axis=1)


def fit_joint(measurements: Sequence[Measurement], reference: HardwareProfile) -> JointFit:
    """The joint fit of docs/cost-model.md section 2, regularised toward `reference`."""
    if not measurements:
        raise CpbenchError("a joint fit needs at least one measurement")
    base = [predict(m.candidate, reference, m.devices_per_node, memory=False) for m in measurements]
    keys = sorted({(t.tier, t.kind, t.level) for p in base for t in p.comm_terms}, key=link_order)
    ring = any(p.phase_time.overlappable_s > 0 for p in base)
    specs = _specs(reference, keys, ring)
    prior_sds = np.array([_prior_sd(s) for s in specs])
    rows = [(m, what, math.log(t)) for m in measurements for what, t in _times(m)]

    def profile_at(theta: np.ndarray) -> HardwareProfile:
        profile = reference
        for spec, x in zip(specs, theta, strict=True):
            profile = spec.apply(profile, spec.value * math.exp(float(x)))
        return profile

    def log_errors(theta: np.ndarray) -> np.ndarray:
        profile = profile_at(theta)
        cache: dict[int, Prediction] = {}
        out = np.empty(len(rows))
        for i, (m, what, measured) in enumerate(rows):
            key = id(m)
            if key not in cache:
                cache[key] = predict(m.candidate, profile, m.devices_per_node, memory=False)
            out[i] = math.log(max(getattr(cache[key], what), 1e-15)) - measured
        return out

    def residuals(theta: np.ndarray, noise: float) -> np.ndarray:
        return np.concatenate([log_errors(theta) / noise, theta / prior_sds])

    theta = np.zeros(len(specs))
    start = log_errors(theta)
    before = rms(start)
    dof = max(1, len(rows) - len(specs))
    if before < NOISE_FLOOR:
        # the reference explains every time to below the noise floor (the linear fits did):
        # the optimum is the start; only the posterior is computed, at the floor's noise
        noise = NOISE_FLOOR
        jac = _jacobian(lambda t: residuals(t, noise), theta, residuals(theta, noise))
    else:
        noise = NOISE_START
        for final in (False, True):
            # the second pass re-weighs the prior by the noise the first pass found
            solution = least_squares(
                residuals, theta, args=(noise,), method="trf", x_scale=prior_sds,
                ftol=FIT_TOLERANCE, xtol=FIT_TOLERANCE, gtol=FIT_TOLERANCE,
                max_nfev=MAX_EVALUATIONS,
            )  # fmt: skip
            theta = np.asarray(solution.x, dtype=float)
            if final:
                break
            noise = max(NOISE_FLOOR, float(np.sqrt(np.sum(log_errors(theta) ** 2) / dof)))
        jac = np.asarray(solution.jac, dtype=float)
    posterior = np.sqrt(np.diag(np.linalg.pinv(jac.T @ jac)))
    fitted = profile_at(theta)
    parameters = []
    for spec, x, sd, ps in zip(specs, theta, prior_sds, posterior, strict=True):
        status = parameter_status(float(sd), float(ps))
        points = len(rows) if status != "undetermined" else 0
        fitted_value = spec.value * math.exp(float(x))
        parameters.append(ParameterFit(
            spec.name, spec.unit, spec.value, fitted_value, points, float(sd), float(ps), status,
            _parameter_misfit(spec, fitted_value, status),
        ))
    after = rms(log_errors(theta))
    return JointFit(fitted, tuple(parameters), len(rows), before, after, noise)
