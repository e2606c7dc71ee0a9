"""`cpbench compare BEFORE AFTER`: per configuration the change with its interval and a verdict,
for regression checks in CI. Nothing here prints. The rules: docs/design.md section 5."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.errors import CpbenchError
from cpbench.results.frame import compare_frame, value
from cpbench.results.store import read_records, records_frame

DEFAULT_THRESHOLD = 0.05
"""A significant slowdown counts as a regression above this relative change (5%)."""


@dataclass(frozen=True, kw_only=True)
class ComparisonRow:
    """One configuration of a comparison: a row of `compare_frame`, its fields in the frame's
    column order (`to_dict` is the row of `cpbench compare --json`). A side without the
    configuration, or not ok, leaves its fields None."""

    id: str
    """The configuration's record id (`BenchConfig.key`), as in the after file."""
    mesh: str | None = None
    """U<u>xR<r>: the Ulysses x ring mesh."""
    layout: str | None = None
    """How the sequence is cut over the ring."""
    phase: str | None = None
    """fwd | fwd+bwd: what one timed step runs."""
    seq_len: int | None = None
    """Global sequence length (tokens)."""
    heads: int | None = None
    """Query heads."""
    kv_heads: int | None = None
    """Key/value heads."""
    head_dim: int | None = None
    """Dimension of one head."""
    batch: int | None = None
    """Batch size."""
    dtype: str | None = None
    """float32 | bfloat16 | float16."""
    impl: str | None = None
    """The implementation measured."""
    mask: str | None = None
    """The mask kind (causal, full, document, ...)."""
    window: int | None = None
    """Sliding window in tokens; None = unbounded."""
    kernel: str | None = None
    """Kernel used."""
    backend: str | None = None
    """Kernel requested."""
    status_before: str | None = None
    """The record's status in the before file; None when it has none of this id."""
    status_after: str | None = None
    """The record's status in the after file; None when it has none of this id."""
    before_s: float | None = None
    """Median step seconds before (ok records only)."""
    after_s: float | None = None
    """Median step seconds after (ok records only)."""
    ratio: float | None = None
    """after_s / before_s; None unless both sides have a time."""
    change_pct: float | None = None
    """(ratio - 1) x 100."""
    ratio_low: float | None = None
    """Lowest ratio the two medians' 95% intervals allow."""
    ratio_high: float | None = None
    """Highest ratio the two medians' 95% intervals allow."""
    verdict: str | None = None
    """faster | slower | no significant change; None when not compared."""
    regression: bool = False
    """Slower, and the ratio above 1 + the threshold."""

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values, in field order (`cpbench compare --json`)."""
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """What `compare_results` found."""

    sources: tuple[str, str]
    threshold: float
    """Relative slowdown above which a significant one is a regression."""
    rows: list[ComparisonRow] = field(default_factory=list)
    """Per configuration (`compare_frame` columns), in the frame's order."""

    def count(self, verdict: str) -> int:
        """Configurations with this verdict."""
        return sum(1 for r in self.rows if r.verdict == verdict)

    @property
    def matched(self) -> int:
        """Configurations with a time on both sides."""
        return sum(1 for r in self.rows if r.verdict is not None)

    @property
    def unmatched(self) -> int:
        """Configurations on one side only, or not ok on both."""
        return len(self.rows) - self.matched

    @property
    def regressions(self) -> list[ComparisonRow]:
        """Significantly slower by more than the threshold."""
        return [r for r in self.rows if r.regression]


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


def _rows(frame: pd.DataFrame) -> list[ComparisonRow]:
    """The frame's rows (`compare_frame`: each of its columns a field of `ComparisonRow`)."""
    return [
        ComparisonRow(**{str(k): value(v) for k, v in row.items()})
        for row in frame.to_dict("records")
    ]
