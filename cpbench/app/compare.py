"""`cpbench compare BEFORE AFTER`: per configuration the change with its interval and a verdict,
for regression checks in CI. Nothing here prints. The rules: docs/design.md section 5."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.errors import CpbenchError
from cpbench.results.frame import compare_frame, value
from cpbench.results.store import read_records, records_frame

DEFAULT_THRESHOLD = 0.05
"""A significant slowdown counts as a regression above this relative change (5%)."""


@dataclass(frozen=True)
class Comparison:
    """What `compare_results` found."""

    sources: tuple[str, str]
    threshold: float
    """Relative slowdown above which a significant one is a regression."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Per configuration (`compare_frame` columns): id, mesh, layout, seq_len, phase, before_s,
    after_s, ratio, ratio_low, ratio_high, verdict, regression, status_before, status_after."""

    def count(self, verdict: str) -> int:
        """Configurations with this verdict."""
        return sum(1 for r in self.rows if r["verdict"] == verdict)

    @property
    def matched(self) -> int:
        """Configurations with a time on both sides."""
        return sum(1 for r in self.rows if r["verdict"] is not None)

    @property
    def unmatched(self) -> int:
        """Configurations on one side only, or not ok on both."""
        return len(self.rows) - self.matched

    @property
    def regressions(self) -> list[dict[str, Any]]:
        """Significantly slower by more than the threshold."""
        return [r for r in self.rows if r["regression"]]


def compare_results(
    before: Path, after: Path, threshold: float = DEFAULT_THRESHOLD
) -> Comparison:
    """Compare two results files (docs/design.md section 5)."""
    if not 0 <= threshold < 10:
        raise CpbenchError(f"--threshold ({threshold}) must be a relative change in [0, 10)")
    frames = []
    for path in (before, after):
        records = read_records(path)
        if not records:
            raise CpbenchError(f"{path}: no results records to compare")
        frames.append(records_frame(records))
    compared = compare_frame(frames[0], frames[1], threshold)
    return Comparison(
        (Path(before).name, Path(after).name), threshold, _rows(compared)
    )


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: value(v) for k, v in row.items()} for row in frame.to_dict("records")]
