"""The dynamic-CP part of the report: one row per policy record of a `[dynamic]` study with its
measured and predicted step, idle share, per-rank load, checks and speedups over static CP, for
the report's dynamic-CP section (length histogram, per-rank load, measured vs predicted
speedup). docs/dynamic-cp.md, "Measured by sweep"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from cpbench.results.frame import dynamic_speedups
from cpbench.results.schema import is_dynamic_record

DYNAMIC_COLUMNS: tuple[str, ...] = (
    "id", "study", "status", "error", "policy", "world_size", "sequences", "tokens",
    "tokens_per_rank", "static_cp", "hardware", "micro_batches", "degrees", "median_s",
    "ci_low_s", "ci_high_s", "predicted_s", "idle_share", "predicted_idle_share",
    "speedup_measured", "speedup_predicted", "checks", "checks_passed", "max_error_ratio",
    "busy_s", "instrumented_s", "lengths",
)  # fmt: skip
"""The frame's columns: tokens = the batch's tokens; degrees = "degree:sequences" words;
busy_s = each rank's busy seconds of one instrumented step (a list); lengths = the batch's
sequence lengths (a list)."""


def _dynamic_row(record: Mapping[str, Any], speedups: Mapping[str, tuple[Any, Any]]) -> dict:
    config = record.get("config") or {}
    d = record.get("dynamic") or {}
    checks = d.get("checks") or {}
    measured, predicted = speedups.get(str(record["id"]), (None, None))
    lengths = config.get("documents") or []
    return {
        **{key: record.get(key) for key in ("id", "status", "error")},
        "study": d.get("study"),
        "policy": d.get("policy") or str(record["id"]).rsplit("-", 1)[-1],
        "world_size": config.get("world_size"),
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "tokens_per_rank": d.get("tokens_per_rank"),
        "static_cp": d.get("static_cp"),
        "hardware": d.get("hardware"),
        "micro_batches": len(d["micro_batches"]) if d.get("micro_batches") else None,
        "degrees": " ".join(f"{g}:{n}" for g, n in (d.get("degrees") or {}).items()),
        "median_s": d.get("median_s"),
        "ci_low_s": d.get("ci_low"),
        "ci_high_s": d.get("ci_high"),
        "predicted_s": d.get("predicted_s"),
        "idle_share": d.get("idle_share"),
        "predicted_idle_share": d.get("predicted_idle_share"),
        "speedup_measured": measured,
        "speedup_predicted": predicted,
        "checks": checks.get("groups"),
        "checks_passed": checks.get("passed"),
        "max_error_ratio": checks.get("max_error_ratio"),
        "busy_s": d.get("busy_s"),
        "instrumented_s": d.get("instrumented_s"),
        "lengths": list(lengths),
    }


def dynamic_frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per dynamic-CP record (`DYNAMIC_COLUMNS`), in the records' order; the speedups
    over the static record of the same study (`results.frame.dynamic_speedups`)."""
    dynamic = [r for r in records if is_dynamic_record(r)]
    speedups = dynamic_speedups(dynamic)
    frame = pd.DataFrame([_dynamic_row(r, speedups) for r in dynamic], columns=list(DYNAMIC_COLUMNS))
    for col in ("median_s", "ci_low_s", "ci_high_s", "predicted_s", "idle_share",
                "predicted_idle_share", "speedup_measured", "speedup_predicted",
                "max_error_ratio", "instrumented_s"):  # fmt: skip
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    for col in ("busy_s", "lengths"):
        frame[col] = frame[col].astype(object)
    return frame
