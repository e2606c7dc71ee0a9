"""Calibration: fit a hardware profile to measured results, and check predictions against them.

Pure math (numpy, scipy), by job:

- measurements.py: results records reduced to `Measurement`s (step, compute-only and
  comm-only times of one configuration);
- fit.py: the least-squares fits of links, kernel efficiency and overlap (`calibrate`; the
  method is described there);
- stats.py: RMS and Spearman rank correlation;
- validation.py: predicted vs measured, in sample (`validate`) or on a holdout.
"""

from __future__ import annotations

from cpbench.model.calibrate.fit import (
    DEFAULT_RIDGE,
    EFFICIENCY_CEILING,
    OVERLAP_RIDGE,
    CalibrationResult,
    FitReport,
    ParameterFit,
    calibrate,
    calibration_summary,
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
    validate,
    validation_rows,
    validation_summary,
)

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
    "calibrate",
    "calibration_summary",
    "default_prior",
    "default_prior_name",
    "holdout_evaluation",
    "measurement_from_record",
    "measurements_from_records",
    "solve_relative",
    "spearman",
    "split_measurements",
    "validate",
    "validation_rows",
    "validation_summary",
]
