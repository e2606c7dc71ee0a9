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
        calibration_summary,
        fit_profile,
        solve_relative,
    )
    from cpbench.model.calibrate.joint import ParameterFit
    from cpbench.model.calibrate.measurements import (
        Measurement,
        default_prior,
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

_EXPORTS = {
    "cpbench.model.calibrate.fit": (
        "DEFAULT_RIDGE", "EFFICIENCY_CEILING", "OVERLAP_RIDGE", "CalibrationResult", "FitReport",
        "calibration_summary", "fit_profile", "solve_relative",
    ),
    "cpbench.model.calibrate.joint": ("ParameterFit",),
    "cpbench.model.calibrate.measurements": (
        "Measurement", "default_prior", "measurement_from_record",
        "measurements_from_records",
    ),
    "cpbench.model.calibrate.stats": ("spearman",),
    "cpbench.model.calibrate.validation": (
        "SPLITS", "TIE", "Split", "holdout_evaluation", "split_measurements", "validate_profile",
        "validation_rows", "validation_summary",
    ),
}  # fmt: skip
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
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
