"""Application service of `cpbench recommend`.

`recommend` ranks every U x R factorisation of the CP degree and every layout with the cost
model (calibrated on measurements when results files are given; measured configurations are
ranked by their measurement), lists the rejected ones with the rule that rejects them, explains
the winner and gives the settings that reproduce it in Megatron-LM, DeepSpeed, yunchang and
torchtitan; `recommendation_report` turns the answer into a JSON-serialisable dict (the
`--json` answer). Every candidate carries its interval (`uncertainty`: the calibration's
residuals, a probe's fit error or the prior's accuracy) and the leaders that tie within it are
called a tie; `write_tie_scenario` writes the sweep that measures them. `cpbench.render.recommend` renders it; calibrate / validate are in
`cpbench.app.calibrate`.
"""

from __future__ import annotations

from cpbench.app.recommend.frameworks import cp_comm_type, framework_settings
from cpbench.app.recommend.parallel import ParallelSizes, solve_parallel_sizes
from cpbench.app.recommend.ranking import load_results, recommend_mesh
from cpbench.app.recommend.report import recommendation_report
from cpbench.app.recommend.scenario import tie_scenario, write_tie_scenario
from cpbench.app.recommend.types import (
    DEFAULT_HARDWARE,
    SIGMA_CONVENTION,
    TIME_CONVENTION,
    FrameworkSetting,
    RankedCandidate,
    Recommendation,
    RecommendRequest,
    Rejection,
    TieCall,
    Uncertainty,
    layout_label,
)

__all__ = [
    "DEFAULT_HARDWARE",
    "SIGMA_CONVENTION",
    "TIME_CONVENTION",
    "FrameworkSetting",
    "ParallelSizes",
    "RankedCandidate",
    "Recommendation",
    "RecommendRequest",
    "Rejection",
    "TieCall",
    "Uncertainty",
    "cp_comm_type",
    "framework_settings",
    "layout_label",
    "load_results",
    "recommend_mesh",
    "recommendation_report",
    "solve_parallel_sizes",
    "tie_scenario",
    "write_tie_scenario",
]
