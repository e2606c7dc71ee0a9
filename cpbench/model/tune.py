"""The closed loop of `cpbench tune`: predict every candidate, measure the one most likely to
change the pick, refit, stop when the pick is known: docs/tune.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from cpbench.config.problem import MeshCandidate
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.error_split import prior_split
from cpbench.model.calibrate.fit import fit_profile
from cpbench.model.calibrate.measurements import Measurement
from cpbench.model.cost.prediction import predict
from cpbench.model.hardware.profile import HardwareProfile

Refit = Literal["scale", "joint"]
"""How measurements correct the model: `scale` multiplies every prediction by the geometric
mean of measured / predicted (the error common to one problem's candidates), `joint` refits
the profile's parameters on them (`cpbench.model.calibrate.fit_profile`)."""
TuneStop = Literal["known", "measured", "budget"]
"""Why the loop stopped: the pick is known (no other candidate is more than the margin faster
with the risk's probability), every candidate that could be is measured, or the budget."""
CandidateStatus = Literal["measured", "predicted", "ruled out", "not measurable"]


@dataclass(frozen=True)
class TuneCandidate:
    """One configuration the loop may pick."""

    label: str
    """How it is named (`U x R layout`)."""
    candidate: MeshCandidate
    """The configuration."""
    devices_per_node: int
    """GPUs per node of the mesh (placement of the ranks)."""
    rank_stride: int = 1
    """Distance between the ranks of one CP group (TP inside a node)."""
    device: str = "cuda"
    """cpu or cuda: what the measurements of a joint refit are taken on."""


@dataclass(frozen=True)
class Measured:
    """What measuring one candidate gave."""

    median_s: float
    """Its step time (median)."""
    cost_s: float
    """What measuring it cost: seconds of measurement (a replay: its step time)."""


Measure = Callable[[int], Measured | None]
"""Measure candidate i; None when it cannot be (an oracle file without it)."""


@dataclass(frozen=True)
class TuneSettings:
    """How the loop decides and when it stops."""

    margin: float = 0.03
    """A candidate counts as faster than the pick when more than this share faster."""
    risk: float = 0.05
    """Stop once the probability that some candidate is `margin` faster is below this."""
    max_runs: int | None = None
    """Measurements at most (None: no limit)."""
    budget_s: float | None = None
    """Seconds of measurement at most (None: no limit); a run that starts under it finishes."""
    candidate_sigma: float | None = None
    """Sigma of one unmeasured candidate's log error once the common part is removed; None:
    the prior split's (`cpbench.model.calibrate.error_split.prior_split`, 0.115)."""
    measured_sigma: float = 0.02
    """Sigma of a measured step's log (its run-to-run spread on a GPU)."""
    ruled_out_below: float = 0.01
    """An unmeasured candidate less likely than this to be faster than the pick is ruled out."""
    refit: Refit = "scale"
    """How measurements correct the model (`Refit`)."""
    learn_sigma: bool = True
    """Update `candidate_sigma` by the spread the measured candidates show around the
    corrected model, once two are measured (`prior_weight`)."""
    prior_weight: float = 3.0
    """How many residuals the prior sigma is worth against the measured ones."""
    samples: int = 20000
    """Monte Carlo draws of the posterior per decision."""
    seed: int = 0
    """Seed of the draws (a tune is reproducible)."""


DEFAULT_SETTINGS = TuneSettings()
"""The settings `cpbench tune` runs with unless told otherwise."""


@dataclass(frozen=True)
class TuneStep:
    """The loop's state after one measurement (the first: before any)."""

    measured: tuple[int, ...]
    """Candidates measured so far, in order."""
    pick: int
    """The pick at this point."""
    p_pick_fastest: float
    """Probability that the pick is the fastest."""
    p_beaten: float
    """Probability that some candidate is more than `margin` faster than the pick."""


@dataclass(frozen=True)
class CandidateState:
    """A candidate at the end."""

    index: int
    """Its position in the candidates given."""
    predicted_s: float
    """The corrected model's step time."""
    measured_s: float | None
    """Its measured step time, when measured."""
    p_fastest: float
    """Probability that it is the fastest."""
    p_faster_than_pick: float
    """Probability that it is faster than the pick (0 for the pick)."""
    status: CandidateStatus
    """measured, predicted, ruled out (by the model) or not measurable."""


@dataclass(frozen=True)
class TuneOutcome:
    """What the loop found."""

    pick: int
    """The candidate picked."""
    stop: TuneStop
    """Why it stopped."""
    candidates: tuple[CandidateState, ...]
    """Every candidate, in the order given."""
    steps: tuple[TuneStep, ...]
    """The loop's trace."""
    cost_s: float
    """Seconds the measurements cost."""
    profile: HardwareProfile
    """The profile the predictions come from (calibrated when `refit` is joint)."""
    scale: float
    """Measured / predicted, the correction applied to every prediction (1 when none)."""
    settings: TuneSettings = field(default_factory=TuneSettings)

    @property
    def runs(self) -> int:
        """Measurements made."""
        return sum(c.status == "measured" for c in self.candidates)


def _check(settings: TuneSettings, candidates: Sequence[TuneCandidate]) -> None:
    if not candidates:
        raise CpbenchError("tune: no feasible candidate to choose from")
    if not 0 <= settings.margin < 1:
        raise CpbenchError(f"tune: margin ({settings.margin}) must be in [0, 1)")
    if not 0 < settings.risk < 1:
        raise CpbenchError(f"tune: risk ({settings.risk}) must be in (0, 1)")
    if settings.max_runs is not None and settings.max_runs < 0:
        raise CpbenchError(f"tune: max runs ({settings.max_runs}) must be >= 0")
    if settings.budget_s is not None and not settings.budget_s >= 0:
        raise CpbenchError(f"tune: budget ({settings.budget_s} s) must be >= 0 seconds")


def as_measurement(c: TuneCandidate, median_s: float, index: int) -> Measurement:
    """Candidate `index` measured at `median_s`, as calibration takes it."""
    return Measurement(
        f"tune-{index}", c.candidate, c.devices_per_node, median_s, None, None, c.device
    )


class _Posterior:
    """Independent log-normal times: measured ones at their measurement, the others at the
    corrected prediction, each with its sigma; probabilities by Monte Carlo."""

    def __init__(self, mu: Sequence[float], sigma: Sequence[float], settings: TuneSettings):
        import numpy as np  # noqa: PLC0415 - only where it computes

        rng = np.random.default_rng(settings.seed)
        draws = rng.standard_normal((settings.samples, len(mu)))
        self.times = np.exp(np.asarray(mu) + draws * np.asarray(sigma))
        best = self.times.argmin(axis=1)
        self.p_fastest = np.bincount(best, minlength=len(mu)) / settings.samples
        self.margin = settings.margin

    def pick(self, mu: Sequence[float]) -> int:
        """The candidate most likely fastest (the lower prediction on equal probability)."""
        return min(range(len(mu)), key=lambda i: (-self.p_fastest[i], mu[i]))

    def beats(self, j: int, pick: int, margin: float) -> float:
        """P(candidate j is more than `margin` faster than the pick)."""
        return float((self.times[:, j] * (1 + margin) < self.times[:, pick]).mean())

    def beaten(self, pick: int) -> float:
        """P(some other candidate is more than the margin faster than the pick)."""
        import numpy as np  # noqa: PLC0415

        others = np.delete(self.times, pick, axis=1)
        if others.shape[1] == 0:
            return 0.0
        return float((others.min(axis=1) * (1 + self.margin) < self.times[:, pick]).mean())


def tune_loop(
    candidates: Sequence[TuneCandidate],
    measure: Measure,
    prior: HardwareProfile,
    settings: TuneSettings = DEFAULT_SETTINGS,
    on_step: Callable[[TuneStep], None] | None = None,
) -> TuneOutcome:
    """Run the loop (docs/tune.md): rank by the model, measure the unmeasured candidate most
    likely to beat the pick by the margin (the pick itself first while unmeasured), correct
    the model, stop when the pick is known, nothing left could beat it, or the budget."""
    _check(settings, candidates)
    n = len(candidates)
    sigma_c = settings.candidate_sigma
    if sigma_c is None:
        sigma_c = prior_split().candidate_sigma
    measured: dict[int, float] = {}
    unmeasurable: set[int] = set()
    order: list[int] = []
    cost = 0.0
    steps: list[TuneStep] = []
    # the prior's predictions, once: a scale refit only multiplies them
    at_prior = _predictions(candidates, prior)
    while True:
        profile, scale, base = _corrected(candidates, measured, prior, settings.refit, at_prior)
        predicted = [t * scale for t in base]
        mu = [math.log(measured.get(i, predicted[i])) for i in range(n)]
        sigma_open = _learned_sigma(sigma_c, measured, predicted, settings)
        sigma = [settings.measured_sigma if i in measured else sigma_open for i in range(n)]
        posterior = _Posterior(mu, sigma, settings)
        pick = posterior.pick(mu)
        p_beaten = posterior.beaten(pick)
        step = TuneStep(tuple(order), pick, float(posterior.p_fastest[pick]), p_beaten)
        steps.append(step)
        if on_step:
            on_step(step)
        open_ = [i for i in range(n) if i not in measured and i not in unmeasurable]
        threats = [
            j for j in open_
            if j == pick or posterior.beats(j, pick, settings.margin) >= settings.risk / n
        ]  # fmt: skip
        stop: TuneStop | None = None
        if pick in measured and p_beaten < settings.risk:
            stop = "known"
        elif not threats:
            stop = "measured"
        elif (settings.max_runs is not None and len(order) >= settings.max_runs) or (
            settings.budget_s is not None and cost >= settings.budget_s
        ):
            stop = "budget"
        if stop is not None:
            states = _states(candidates, predicted, measured, unmeasurable, posterior, pick,
                             settings)  # fmt: skip
            return TuneOutcome(pick, stop, states, tuple(steps), cost, profile, scale, settings)
        # the pick first, until it is measured: acting on it is what the loop is for
        next_ = pick if pick in threats else max(
            threats, key=lambda j: (posterior.beats(j, pick, settings.margin), -mu[j])
        )
        result = measure(next_)
        if result is None:
            unmeasurable.add(next_)
            continue
        if not (result.median_s > 0 and math.isfinite(result.median_s)):
            raise CpbenchError(
                f"tune: {candidates[next_].label} measured {result.median_s} s (a step time is "
                f"a positive number)"
            )
        measured[next_] = result.median_s
        order.append(next_)
        cost += max(0.0, result.cost_s)


def _learned_sigma(
    prior_sigma: float,
    measured: dict[int, float],
    predicted: Sequence[float],
    settings: TuneSettings,
) -> float:
    """Sigma of an unmeasured candidate given how the measured ones sat around the corrected
    model: the conjugate (scaled inverse chi-squared) update of the prior sigma, worth
    `prior_weight` residuals, by the measured residuals' sample variance. A model that keeps
    being right is trusted more, one that is wrong about this problem less."""
    logs = [math.log(t / predicted[i]) for i, t in measured.items()]
    if not settings.learn_sigma or len(logs) < 2:
        return prior_sigma
    mean = sum(logs) / len(logs)
    squares = sum((x - mean) ** 2 for x in logs)
    weight = settings.prior_weight
    variance = (weight * prior_sigma**2 + squares) / (weight + len(logs) - 1)
    return max(settings.measured_sigma, math.sqrt(variance))


def _predictions(candidates: Sequence[TuneCandidate], profile: HardwareProfile) -> list[float]:
    """Every candidate's predicted step time on `profile` (seconds)."""
    out = [
        predict(c.candidate, profile, c.devices_per_node, rank_stride=c.rank_stride).step_s
        for c in candidates
    ]
    if any(not (t > 0 and math.isfinite(t)) for t in out):
        raise CpbenchError("tune: the model predicts a non-positive step time")
    return out


def _corrected(
    candidates: Sequence[TuneCandidate],
    measured: dict[int, float],
    prior: HardwareProfile,
    refit: Refit,
    at_prior: Sequence[float],
) -> tuple[HardwareProfile, float, Sequence[float]]:
    """The profile, its predictions and the scale they are corrected by, from the
    measurements (`at_prior`: the predictions on `prior`)."""
    if not measured:
        return prior, 1.0, at_prior
    profile, base = prior, at_prior
    if refit == "joint":
        points = [as_measurement(candidates[i], t, i) for i, t in measured.items()]
        profile = fit_profile(points, prior).profile
        base = _predictions(candidates, profile)
    logs = [math.log(t / base[i]) for i, t in measured.items()]
    return profile, math.exp(sum(logs) / len(logs)), base


def _states(
    candidates: Sequence[TuneCandidate],
    predicted: Sequence[float],
    measured: dict[int, float],
    unmeasurable: set[int],
    posterior: _Posterior,
    pick: int,
    settings: TuneSettings,
) -> tuple[CandidateState, ...]:
    out = []
    for i in range(len(candidates)):
        faster = 0.0 if i == pick else posterior.beats(i, pick, 0.0)
        status: CandidateStatus
        if i in measured:
            status = "measured"
        elif i in unmeasurable:
            status = "not measurable"
        elif i != pick and faster < settings.ruled_out_below:
            status = "ruled out"
        else:
            status = "predicted"
        out.append(CandidateState(
            i, predicted[i], measured.get(i), float(posterior.p_fastest[i]), faster, status
        ))  # fmt: skip
    return tuple(out)
