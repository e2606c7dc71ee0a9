"""Application service of `cpbench recommend`: the ranked meshes, ties, explanation, settings.

What it returns: docs/internals.md, "cpbench recommend"; the ties: docs/cost-model.md."""

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
