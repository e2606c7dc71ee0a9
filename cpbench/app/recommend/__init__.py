"""Application service of `cpbench recommend`, `cpbench calibrate` and `cpbench validate`.

`recommend` ranks every U x R factorisation of the CP degree and every layout with the cost
model (calibrated on measurements when results files are given; measured configurations are
ranked by their measurement), lists the rejected ones with the rule that rejects them, explains
the winner and prints the settings that reproduce it in Megatron-LM, DeepSpeed, yunchang and
torchtitan. `*_report` functions return JSON-serialisable dicts (the `--json` answers);
`render_*` functions turn them into rich renderables. The CLI is a thin wrapper around both.
"""

from __future__ import annotations

from cpbench.app.recommend.frameworks import cp_comm_type, framework_settings
from cpbench.app.recommend.parallel import ParallelSizes, divisors, solve_parallel_sizes
from cpbench.app.recommend.ranking import load_results, recommend
from cpbench.app.recommend.report import recommendation_report
from cpbench.app.recommend.types import (
    DEFAULT_HARDWARE,
    TIME_CONVENTION,
    FrameworkSetting,
    RankedCandidate,
    Recommendation,
    RecommendRequest,
    Rejection,
    layout_label,
)

__all__ = [
    "DEFAULT_HARDWARE",
    "TIME_CONVENTION",
    "FrameworkSetting",
    "ParallelSizes",
    "RankedCandidate",
    "Recommendation",
    "RecommendRequest",
    "Rejection",
    "cp_comm_type",
    "divisors",
    "framework_settings",
    "layout_label",
    "load_results",
    "recommend",
    "recommendation_report",
    "solve_parallel_sizes",
]
