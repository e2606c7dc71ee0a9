"""What the cost model adds to a report, given a hardware profile: the predicted step time and
the fraction of peak of each record, and the recommendation (`cost_model`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.app.report.data import NO_PROFILE_NOTE, ReportRecommendation
from cpbench.app.report.recommendation import measured_recommendation, service_recommendation
from cpbench.errors import CpbenchError
from cpbench.model.cost.records import prediction_for_record
from cpbench.model.hardware.loading import choose_profile, load_profile
from cpbench.results.frame import ok_rows


@dataclass
class ModelResult:
    """What the cost model adds to a report."""

    profile_name: str | None = None
    profile_line: str = NO_PROFILE_NOTE
    predicted_s: dict[int, float] = field(default_factory=dict)
    """Frame index -> predicted step time (seconds)."""
    peak_fraction: dict[int, float] = field(default_factory=dict)
    """Frame index -> achieved TFLOP/s / peak TFLOP/s of all ranks."""
    prediction_note: str | None = None
    peak_note: str | None = None
    recommendation: ReportRecommendation | None = None
    recommendation_note: str | None = None
    notes: list[str] = field(default_factory=list)


def default_hardware(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The profile when none is given (the model's `choose_profile` without its fallback):
    'cpu-local' for CPU records, else the built-in profile describing every device, or None."""
    kinds = {
        str(r["config"].get("device"))
        for r in records
        if isinstance(r.get("config"), Mapping) and r["config"].get("device")
    }
    names = [
        str(d)
        for r in records
        if isinstance(r.get("environment"), Mapping)
        for d in (r["environment"].get("devices") or [])
    ]
    choice = choose_profile(names, cpu=kinds == {"cpu"})
    return None if choice.warning else choice.name


def cost_model(
    records: Sequence[Mapping[str, Any]],
    frame: pd.DataFrame,
    hardware: str | None,
    paths: Sequence[Path] = (),
) -> ModelResult:
    """Predictions, peak fractions and the recommendation for `hardware` (a profile name or
    file; None = `default_hardware`). Every part missing from the model is a note, never an
    error, except an explicitly named profile that does not load."""
    result = ModelResult()
    result.recommendation, result.recommendation_note = measured_recommendation(frame)
    name = hardware or default_hardware(records)
    if name is None:
        result.prediction_note = f"{NO_PROFILE_NOTE}: pass --hardware NAME|PATH"
        result.notes.append(result.prediction_note)
        return result
    try:
        profile = load_profile(name)
    except CpbenchError:
        if hardware is not None:
            raise
        result.prediction_note = f"{NO_PROFILE_NOTE} (no built-in profile {name!r})"
        result.notes.append(result.prediction_note)
        return result
    result.profile_name = str(profile.name)
    described = f"{profile.name}: {profile.description}"
    if profile.calibration is not None:
        cal = profile.calibration
        described += (
            f" (calibrated from {cal.prior} on {cal.points} measurements, "
            f"rms error {cal.residual:.0%})"
        )
    result.profile_line = described + ("" if hardware else " (default for these records)")
    _add_peak_fractions(frame, profile, result)
    _add_predictions(records, profile, result)
    if result.recommendation is not None and paths:
        result.recommendation, result.recommendation_note = service_recommendation(
            frame, paths, hardware or name, result.recommendation
        )
    return result


def _peak_tflops(profile: Any, dtype: str) -> float | None:
    """Peak dense TFLOP/s of one device for a dtype (None when the profile has none)."""
    try:
        return float(profile.peak_flops(dtype)) / 1e12
    except (CpbenchError, AttributeError, TypeError, ValueError):
        return None


def _add_peak_fractions(frame: pd.DataFrame, profile: Any, result: ModelResult) -> None:
    rows = ok_rows(frame, "achieved_tflops", "world_size")
    for idx, row in rows.iterrows():
        peak = _peak_tflops(profile, str(row["dtype"]))
        if peak and peak > 0:
            result.peak_fraction[idx] = float(row["achieved_tflops"]) / (
                peak * int(row["world_size"])
            )
    if not result.peak_fraction:
        result.peak_note = f"profile {result.profile_name} gives no peak TFLOP/s for these dtypes"


def _add_predictions(
    records: Sequence[Mapping[str, Any]], profile: Any, result: ModelResult
) -> None:
    for idx, record in enumerate(records):
        if record.get("status") != "ok":
            continue
        config = record.get("config")
        if isinstance(config, Mapping) and config.get("impl", "cpbench") != "cpbench":
            continue  # the cost model describes cpbench's own implementation
        try:
            prediction = prediction_for_record(dict(record), profile)
        except CpbenchError:
            continue
        seconds = _predicted_seconds(prediction)
        if seconds is not None:
            result.predicted_s[idx] = seconds
    if not result.predicted_s:
        result.prediction_note = (
            f"the cost model predicts none of these records ({result.profile_name})"
        )


def _predicted_seconds(prediction: Any) -> float | None:
    """`Prediction.step_s` (the record's phase), when finite and positive."""
    value = getattr(prediction, "step_s", None) if prediction is not None else None
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        return float(value)
    return None
