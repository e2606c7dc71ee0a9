"""The `cpbench report` application service: results files -> the data of the report page.

What it builds and its parts: docs/internals.md, "The report"."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.app.plan_schema import PlanReport
from cpbench.app.report.data import ComparisonData, ReportData
from cpbench.app.report.dynamic import dynamic_frame
from cpbench.app.report.inference import inference_frame
from cpbench.app.report.predictions import cost_model
from cpbench.app.report.summary import summarize
from cpbench.app.report.work import work_fits
from cpbench.config.inference import is_inference_record
from cpbench.errors import CpbenchError
from cpbench.files import write_atomically
from cpbench.results.frame import compare_frame
from cpbench.results.schema import is_dynamic_record
from cpbench.results.store import read_records, records_frame


def _read(paths: Sequence[Path]) -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(list(paths))
    return records, [str(w.message) for w in caught]


def build_report(
    paths: Sequence[Path],
    *,
    title: str | None = None,
    hardware: str | None = None,
    generated_at: datetime | None = None,
    plan_request: Any = None,
) -> ReportData:
    """Read `paths` and gather what the report page shows (CpbenchError when there is nothing
    to show). `plan_request` (a `cpbench.app.plan.PlanRequest`) adds the whole-model plan."""
    if not paths:
        raise CpbenchError("give at least one results file (JSONL)")
    records, warned = _read(paths)
    if not records:
        raise CpbenchError(f"{', '.join(map(str, paths))}: no results records to report")
    # inference records (prefill, decode) and dynamic-CP policies have their own sections;
    # the training sections, the cost model and the records table take the training records
    training = [r for r in records if not is_inference_record(r) and not is_dynamic_record(r)]
    inference = inference_frame(records)
    dynamic = dynamic_frame(records)
    frame = records_frame(training)
    model = cost_model(training, frame, hardware, paths)
    if model.predicted_s:
        frame["predicted_s"] = pd.Series(model.predicted_s, dtype="float64")
    if model.peak_fraction:
        frame["peak_fraction"] = pd.Series(model.peak_fraction, dtype="float64")
    summary = summarize(records)
    conventions = {
        str(r["flops"]["convention"])
        for r in records
        if isinstance(r.get("flops"), Mapping) and r["flops"].get("convention")
    }
    return ReportData(
        title=title or "cpbench report: " + (", ".join(summary.scenarios) or "results"),
        sources=[Path(p).name for p in paths],
        summary=summary,
        frame=frame,
        generated_at=generated_at or datetime.now(timezone.utc),
        profile=model.profile_name,
        profile_line=model.profile_line,
        flops_convention="; ".join(sorted(conventions)) or None,
        prediction_note=model.prediction_note,
        peak_note=model.peak_note,
        recommendation=model.recommendation,
        recommendation_note=model.recommendation_note,
        warnings=warned,
        notes=model.notes if training else [],  # a profile note is of training records
        work=work_fits(frame),
        plan=_plan(plan_request),
        inference=inference if not inference.empty else None,
        dynamic=dynamic if not dynamic.empty else None,
    )


def _plan(request: Any) -> PlanReport | None:
    """The whole-model plan's answer, None without a request."""
    if request is None:
        return None
    from cpbench.app import plan as planner  # noqa: PLC0415

    return planner.plan_report(planner.plan_training(request))


def build_comparison(
    before: Path,
    after: Path,
    *,
    title: str | None = None,
    generated_at: datetime | None = None,
) -> ComparisonData:
    """The before/after data of two results files, matched by record id."""
    before_records, w1 = _read([before])
    after_records, w2 = _read([after])
    for path, recs in ((before, before_records), (after, after_records)):
        if not recs:
            raise CpbenchError(f"{path}: no results records to compare")
    sources = (Path(before).name, Path(after).name)
    before_frame, after_frame = records_frame(before_records), records_frame(after_records)
    compared = compare_frame(before_frame, after_frame)
    matched = compared[compared["ratio"].notna()]
    geomean = (
        math.exp(float(pd.Series(matched["ratio"]).apply(math.log).mean()))
        if not matched.empty
        else None
    )
    return ComparisonData(
        title=title or f"cpbench comparison: {sources[0]} -> {sources[1]}",
        sources=sources,
        summary=summarize([*before_records, *after_records]),
        before=before_frame,
        after=after_frame,
        compared=compared,
        generated_at=generated_at or datetime.now(timezone.utc),
        before_records=len(before_records),
        before_ok=sum(1 for r in before_records if r.get("status") == "ok"),
        after_records=len(after_records),
        after_ok=sum(1 for r in after_records if r.get("status") == "ok"),
        matched=len(matched),
        faster=int((matched["verdict"] == "faster").sum()),
        slower=int((matched["verdict"] == "slower").sum()),
        geomean=geomean,
        warnings=w1 + w2,
    )


def write_report(html: str, output: Path, inputs: Sequence[str | Path] = ()) -> Path:
    """Write the page `html` to `output` (parent folders created; never one of `inputs`, the
    results it was made from); returns the path."""
    return write_atomically(output, html, "--output", inputs, make_parents=True)
