"""`cpbench calibrate` and `cpbench validate`: fit a hardware profile to results files, and
compare the model's predictions with measurements (in sample or on a holdout)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpbench.app.recommend import load_results
from cpbench.errors import CpbenchError
from cpbench.model.calibrate import (
    Measurement,
    Split,
    calibrate,
    calibration_summary,
    holdout_evaluation,
    measurements_from_records,
    validate,
)
from cpbench.model.calibrate.measurements import PriorChoice, default_prior
from cpbench.model.hardware import HardwareProfile, load_profile, save_profile


def _measurements_and_prior(
    paths: Sequence[str], hardware: str | None, job: str
) -> tuple[list[Measurement], HardwareProfile, dict[str, Any]]:
    """The usable measurements of `paths`, the profile to start from (given, or the built-in
    profile of the GPU the records name) and how it was chosen (`prior_choice` of the report:
    name, reason, warning); CpbenchError when no record is usable."""
    measurements = measurements_from_records(load_results(paths))
    if not measurements:
        raise CpbenchError(
            f"no usable records in {', '.join(paths)}: {job} needs status 'ok' records "
            f"with a feasible config and timing.median"
        )
    choice = (
        PriorChoice(hardware, "given with --hardware") if hardware else default_prior(measurements)
    )
    chosen = {"name": choice.name, "reason": choice.reason, "warning": choice.warning}
    return measurements, load_profile(choice.name), chosen


def calibrate_results(
    paths: Sequence[str],
    hardware: str | None = None,
    output: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Fit a profile to results files and optionally write it as TOML; the report dict."""
    measurements, prior, chosen = _measurements_and_prior(paths, hardware, "calibration")
    result = calibrate(measurements, prior, name=name, files=tuple(paths))
    written = None
    if output:
        header = (
            f"Calibrated by `cpbench calibrate` from {', '.join(paths)} "
            f"({result.points} measurements, prior {prior.name}).\n"
            f"RMS relative step-time error {result.residual:.1%} on those points "
            f"(prior: {result.residual_before:.1%}). Load with --hardware {output}"
        )
        written = str(save_profile(result.profile, output, header))
    return {
        **calibration_summary(result),
        "output": written,
        "prior_choice": chosen,
        "warnings": [chosen["warning"]] if chosen["warning"] else [],
    }


def validate_results(
    paths: Sequence[str],
    hardware: str | None = None,
    holdout: bool = False,
    fraction: float = 0.5,
    seed: int = 0,
    split: Split = "stratified",
    calibrate_first: bool = False,
) -> dict[str, Any]:
    """Predicted vs measured per configuration (or a holdout evaluation); the report dict."""
    measurements, prior, chosen = _measurements_and_prior(paths, hardware, "validation")
    extra: dict[str, Any] = {
        "prior_choice": chosen,
        "warnings": [chosen["warning"]] if chosen["warning"] else [],
    }
    if holdout:
        result = holdout_evaluation(
            measurements,
            seed,
            prior=prior,
            fraction=fraction,
            split=split,
        )
        return {"mode": "holdout", "profile": prior.name, **result, **extra}
    profile = prior
    calibration = None
    if calibrate_first:
        fitted = calibrate(measurements, prior, files=tuple(paths))
        profile, calibration = fitted.profile, calibration_summary(fitted)
    report = validate(measurements, profile)
    mode = "in-sample (calibrated on the same results)" if calibrate_first else "as given"
    return {"mode": mode, **report, "calibration": calibration, **extra}
