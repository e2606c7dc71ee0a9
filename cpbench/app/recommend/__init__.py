"""Application service of `cpbench recommend`: the ranked meshes, ties, explanation, settings.

What it returns: docs/internals.md, "cpbench recommend"; the ties: docs/cost-model.md."""

from __future__ import annotations

from cpbench.app.recommend.frameworks import cp_comm_type, framework_settings
from cpbench.app.recommend.parallel import solve_parallel_sizes
from cpbench.app.recommend.ranking import load_results, recommend_mesh
from cpbench.app.recommend.report import recommendation_report
from cpbench.app.recommend.scenario import write_tie_scenario
from cpbench.app.recommend.types import (
    FrameworkSetting,
    RankedCandidate,
    Recommendation,
    RecommendRequest,
    Uncertainty,
    layout_label,
)

__all__ = [
    "FrameworkSetting",
    "RankedCandidate",
    "Recommendation",
    "RecommendRequest",
    "Uncertainty",
    "cp_comm_type",
    "framework_settings",
    "layout_label",
    "load_results",
    "recommend_mesh",
    "recommendation_report",
    "solve_parallel_sizes",
    "write_tie_scenario",
]
