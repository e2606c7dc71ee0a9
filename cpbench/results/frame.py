"""Helpers on the results frame (`cpbench.results.store.records_frame`) shared by the report
service and the figure builders: the successful rows, the workload-variant label, the phase
order and the before/after comparison of two frames. Pure pandas; nothing here renders."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from cpbench.config.vocabulary import PHASES

PHASE_ORDER = PHASES

VARIANT_COLUMNS: tuple[tuple[str, str | None], ...] = (
    ("impl", "{}"),
    ("heads", "h{}"),
    ("kv_heads", "kv{}"),
    ("head_dim", "d{}"),
    ("batch", "B{}"),
    ("dtype", "{}"),
    ("causal", None),
    ("mask", "{}"),
    ("window", "window {}"),
    ("kernel", "{}"),
    ("backend", "backend {}"),
    ("nodes", "{} node(s)"),
)
"""Workload dimensions besides L, the mesh, the layout and the phase; those that take more
than one value in a frame tell its series apart (e.g. 'kv2' vs 'kv8' in a GQA sweep; the
implementation, 'cpbench' vs 'torch_cp', when a sweep measured several). The format is None
for the causal flag ('causal' / 'full mask'), left out when the mask kind varies too (it says
more: causal, full, document, sliding_window, ...)."""


def value(v: Any) -> Any:
    """A plain JSON-friendly value of a frame cell (None for NaN/NA, numpy scalars unwrapped)."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        v = v.item()
        if isinstance(v, float) and math.isnan(v):
            return None
    return v


def ok_rows(frame: pd.DataFrame, *required: str) -> pd.DataFrame:
    """Successful records with a value in every `required` column."""
    if frame.empty or "status" not in frame:
        return frame.iloc[0:0]
    rows = frame[frame["status"] == "ok"]
    for col in required:
        if col not in rows:
            return rows.iloc[0:0]
        rows = rows[rows[col].notna()]
    return rows


def with_variant(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy with a `variant` column: the values of the VARIANT_COLUMNS that vary in `frame`
    ('' when the frame holds one workload)."""
    out = frame.copy()
    varying = [
        (col, fmt)
        for col, fmt in VARIANT_COLUMNS
        if col in out and out[col].nunique(dropna=True) > 1
    ]
    if any(col == "mask" for col, _ in varying):
        varying = [(col, fmt) for col, fmt in varying if col != "causal"]

    def label(row: Any) -> str:
        parts = []
        for col, fmt in varying:
            cell = value(row[col])
            if cell is None:
                continue
            if fmt is None:
                parts.append("causal" if cell else "full mask")
            else:
                parts.append(fmt.format(cell))
        return " ".join(parts)

    out["variant"] = [label(row) for _, row in out.iterrows()] if varying else ""
    return out


def phases_of(frame: pd.DataFrame) -> list[str]:
    """Phases present, fwd first, then fwd+bwd, then any other in name order."""
    present = {p for p in frame["phase"].dropna().unique()} if "phase" in frame else set()
    return [p for p in PHASE_ORDER if p in present] + sorted(present - set(PHASE_ORDER))


def compare_frame(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Before/after per configuration, matched by record id (the last record of an id wins):
    id, mesh, layout, seq_len, phase, status and median of each side, `ratio` = after/before
    (NaN when either side has no time) and `change` in percent. Ids found on one side only are
    kept (with NaN on the other)."""
    keep = ["id", "mesh", "layout", "seq_len", "phase", "status", "median_s"]
    b = before[keep].drop_duplicates("id", keep="last")
    a = after[keep].drop_duplicates("id", keep="last")
    merged = b.merge(a, on="id", how="outer", suffixes=("_before", "_after"), sort=False)
    for col in ("mesh", "layout", "seq_len", "phase"):
        merged[col] = merged[f"{col}_after"].combine_first(merged[f"{col}_before"])
    before_s = merged["median_s_before"].where(merged["status_before"] == "ok")
    after_s = merged["median_s_after"].where(merged["status_after"] == "ok")
    out = pd.DataFrame(
        {
            "id": merged["id"],
            "mesh": merged["mesh"],
            "layout": merged["layout"],
            "seq_len": merged["seq_len"],
            "phase": merged["phase"],
            "status_before": merged["status_before"],
            "status_after": merged["status_after"],
            "before_s": before_s.astype("float64"),
            "after_s": after_s.astype("float64"),
        }
    )
    out["ratio"] = out["after_s"] / out["before_s"]
    out["change_pct"] = (out["ratio"] - 1.0) * 100.0
    out["_unmatched"] = out["ratio"].isna()
    out = out.sort_values(
        ["_unmatched", "phase", "seq_len", "mesh", "layout", "id"], na_position="last"
    )
    return out.drop(columns="_unmatched").reset_index(drop=True)
