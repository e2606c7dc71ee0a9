"""The data the report pages show (`ReportData`, `ComparisonData`) and its parts: plain
dataclasses, filled by the services of this package and drawn by `cpbench.render.html`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

from cpbench.app.plan_schema import PlanReport
from cpbench.app.report.work import WorkFit

NO_PROFILE_NOTE = "no hardware profile available"


@dataclass
class ReportRecommendation:
    """What the recommendation section shows; plain text only (escaped when rendered)."""

    summary: str = ""
    tables: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    """(caption, rows): one dict per row, keys = column titles."""
    settings: list[tuple[str, str, str]] = field(default_factory=list)
    """(framework, settings to use, note)."""
    notes: list[str] = field(default_factory=list)
    """Extra lines: the workload, the profile, rejected meshes."""
    explanation: Any = None
    """Why the winner wins as facts (`cpbench.app.recommend.explain.Explanation`): the renderer
    words it as the summary."""
    frameworks: tuple[Any, ...] = ()
    """`FrameworkSetting`s with their caveats: the renderer words them as the settings."""


@dataclass
class Summary:
    """The header facts of a set of records."""

    scenarios: list[str]
    """Scenario names, sorted."""
    total: int
    statuses: dict[str, int]
    """Status -> number of records."""
    reasons: dict[str, list[tuple[int, str, int]]]
    """failed/skipped/timeout -> (count, example message, distinct messages) per message
    pattern (numbers ignored), most frequent first."""
    devices: dict[str, int]
    """Device name -> the most of them one record ran on."""
    hosts: list[str]
    """Host names, sorted."""
    software: dict[str, list[str]]
    """Environment entry (torch, python, ...) -> the values seen, sorted."""
    env: dict[str, list[str]]
    """Environment variable -> the values seen, sorted."""
    first: str | None
    """Earliest record timestamp (None when no record has one)."""
    last: str | None
    """Latest record timestamp."""
    device_kinds: list[str]
    """Config device kinds (cpu, cuda), sorted."""


@dataclass
class ReportData:
    """Everything the report page shows, for `cpbench.render.html.render_report`."""

    title: str
    sources: list[str]
    summary: Summary
    frame: pd.DataFrame
    """The records frame, with `predicted_s` and `peak_fraction` columns when the cost model
    gave them."""
    generated_at: datetime
    profile: str | None = None
    """Name of the hardware profile used, None when none was available."""
    profile_line: str = NO_PROFILE_NOTE
    """The profile as the header describes it."""
    flops_convention: str | None = None
    """The FLOP-counting convention(s) of the records."""
    prediction_note: str | None = None
    """Why the predicted-vs-measured section is empty or partial."""
    peak_note: str | None = None
    """Why the fraction of peak is missing."""
    recommendation: ReportRecommendation | None = None
    recommendation_note: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why a section is empty or a model part is missing (for the CLI to show)."""
    work: list[WorkFit] = field(default_factory=list)
    """Packed documents: per-rank predicted work against measured compute, per phase."""
    plan: PlanReport | None = None
    """The whole-model plan (`cpbench.app.plan.plan_report`) when a model was given."""
    inference: pd.DataFrame | None = None
    """The inference records (prefill, decode), one row each
    (`cpbench.app.report.inference.inference_frame`); None when there are none. `frame`
    holds the training records only."""
    dynamic: pd.DataFrame | None = None
    """The dynamic-CP policy records, one row each (`cpbench.app.report.dynamic.
    dynamic_frame`); None when there are none (`frame` leaves them out)."""

    @property
    def records(self) -> int:
        return self.summary.total


@dataclass
class ComparisonData:
    """Everything the before/after page shows, for `cpbench.render.html.render_comparison`."""

    title: str
    sources: tuple[str, str]
    summary: Summary
    """Of both files' records together."""
    before: pd.DataFrame
    after: pd.DataFrame
    compared: pd.DataFrame
    """`cpbench.results.frame.compare_frame(before, after)`."""
    generated_at: datetime
    before_records: int
    before_ok: int
    after_records: int
    after_ok: int
    matched: int
    """Ids with a time on both sides."""
    faster: int
    """Matched ids significantly faster after (the 95% intervals apart:
    `cpbench.model.ties.compare_intervals`, as `cpbench compare`)."""
    slower: int
    geomean: float | None
    """Geometric mean of after/before over the matched ids (None when none matched)."""
    warnings: list[str] = field(default_factory=list)
    profile: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return self.before_records + self.after_records

    @property
    def unmatched(self) -> int:
        """Ids present in one file only or not ok on both sides."""
        return len(self.compared) - self.matched
