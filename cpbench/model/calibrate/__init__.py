"""Calibration: fit a hardware profile to measured results, and check predictions against them.

One module per job (pure math: numpy, scipy); the method: docs/cost-model.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and readers
    from cpbench.model.calibrate.fit import (
        DEFAULT_RIDGE,
        EFFICIENCY_CEILING,
        OVERLAP_RIDGE,
        CalibrationResult,
        FitReport,
        ParameterFit,
        calibration_summary,
        fit_profile,
        solve_relative,
    )
    from cpbench.model.calibrate.measurements import (
        Measurement,
        default_prior,
        default_prior_name,
        measurement_from_record,
        measurements_from_records,
    )
    from cpbench.model.calibrate.stats import spearman
    from cpbench.model.calibrate.validation import (
        SPLITS,
        TIE,
        Split,
        holdout_evaluation,
        split_measurements,
        validate_profile,
        validation_rows,
        validation_summary,
    )

_WHERE = {
    "CalibrationResult": "cpbench.model.calibrate.fit",
    "DEFAULT_RIDGE": "cpbench.model.calibrate.fit",
    "EFFICIENCY_CEILING": "cpbench.model.calibrate.fit",
    "FitReport": "cpbench.model.calibrate.fit",
    "Measurement": "cpbench.model.calibrate.measurements",
    "OVERLAP_RIDGE": "cpbench.model.calibrate.fit",
    "ParameterFit": "cpbench.model.calibrate.fit",
    "SPLITS": "cpbench.model.calibrate.validation",
    "Split": "cpbench.model.calibrate.validation",
    "TIE": "cpbench.model.calibrate.validation",
    "calibration_summary": "cpbench.model.calibrate.fit",
    "default_prior": "cpbench.model.calibrate.measurements",
    "default_prior_name": "cpbench.model.calibrate.measurements",
    "fit_profile": "cpbench.model.calibrate.fit",
    "holdout_evaluation": "cpbench.model.calibrate.validation",
    "measurement_from_record": "cpbench.model.calibrate.measurements",
    "measurements_from_records": "cpbench.model.calibrate.measurements",
    "solve_relative": "cpbench.model.calibrate.fit",
    "spearman": "cpbench.model.calibrate.stats",
    "split_measurements": "cpbench.model.calibrate.validation",
    "validate_profile": "cpbench.model.calibrate.validation",
    "validation_rows": "cpbench.model.calibrate.validation",
    "validation_summary": "cpbench.model.calibrate.validation",
}
"""Where each exported name lives: the package imports a submodule on first use, so a rank
that only needs `stats` (the timing's intervals) does not import scipy.optimize with `fit`."""


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)

__all__ = [
    "DEFAULT_RIDGE",
    "EFFICIENCY_CEILING",
    "OVERLAP_RIDGE",
    "SPLITS",
    "TIE",
    "CalibrationResult",
    "FitReport",
    "Measurement",
    "ParameterFit",
    "Split",
    "calibration_summary",
    "default_prior",
    "default_prior_name",
    "fit_profile",
    "holdout_evaluation",
    "measurement_from_record",
    "measurements_from_records",
    "solve_relative",
    "spearman",
    "split_measurements",
    "validate_profile",
    "validation_rows",
    "validation_summary",
]
