"""Helpers on the results frame (`cpbench.results.store.records_frame`) shared by the report
service and the figure builders: the successful rows, the workload-variant label, the phase
order and the before/after comparison of two frames. Pure pandas; nothing here renders."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from cpbench.config.vocabulary import PHASES
from cpbench.model.ties import (
    Change,
    Interval,
    Ranked,
    compare_intervals,
    rank_with_ties,
    recorded_interval,
)

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


def _aliased(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """`before` with an id renamed to the id of the `after` record that lists it as
    equivalent (measured once under its canonical name, e.g. a version 1 file's zigzag name of
    a ring-degree-1 mesh), when `before` has no record of that id itself."""
    if "equivalent" not in after:
        return before
    present = set(before["id"])
    rename: dict[str, str] = {}
    for rid, equivalent in zip(after["id"], after["equivalent"], strict=True):
        if rid in present or not isinstance(equivalent, list):
            continue
        for other in equivalent:
            if other in present and other not in rename:
                rename[other] = rid
                break
    return before.assign(id=before["id"].replace(rename)) if rename else before


COMPARE_AXES = ("seq_len", "heads", "kv_heads", "head_dim", "batch", "dtype", "impl", "mask",
                "window", "kernel", "backend")
"""Configuration axes `compare_frame` keeps beside mesh, layout and phase (those the frames
have): what tells two compared rows apart."""


def compare_frame(
    before: pd.DataFrame, after: pd.DataFrame, threshold: float = 0.05
) -> pd.DataFrame:
    """Before/after per configuration, matched by record id (the last record of an id wins; an
    id a side measured under an equivalent name matches it, `_aliased`): id, mesh, layout,
    phase, the `COMPARE_AXES`, status and median of each side, `ratio` = after/before (NaN when either
    side has no time), `change_pct` in percent, the ratio's bounds `ratio_low`/`ratio_high`
    from the two medians' 95% intervals and the `verdict` (`ties.compare_intervals`: faster /
    slower / no significant change), and `regression`: slower and the ratio above 1 +
    `threshold`. Ids found on one side only are kept (with NaN on the other)."""
    axes = ["mesh", "layout", "phase", *(c for c in COMPARE_AXES if c in before and c in after)]
    keep = ["id", *axes, "status", "median_s", "ci_low_s", "ci_high_s"]
    before = _aliased(before, after)
    after = _aliased(after, before)
    b = before[keep].drop_duplicates("id", keep="last")
    a = after[keep].drop_duplicates("id", keep="last")
    merged = b.merge(a, on="id", how="outer", suffixes=("_before", "_after"), sort=False)
    for col in axes:
        merged[col] = merged[f"{col}_after"].combine_first(merged[f"{col}_before"])
    before_s = merged["median_s_before"].where(merged["status_before"] == "ok")
    after_s = merged["median_s_after"].where(merged["status_after"] == "ok")
    out = pd.DataFrame(
        {
            "id": merged["id"],
            **{col: merged[col] for col in axes},
            "status_before": merged["status_before"],
            "status_after": merged["status_after"],
            "before_s": before_s.astype("float64"),
            "after_s": after_s.astype("float64"),
        }
    )
    out["ratio"] = out["after_s"] / out["before_s"]
    out["change_pct"] = (out["ratio"] - 1.0) * 100.0
    changes = [_change(row) for row in merged.itertuples(index=False)]
    columns = {
        "ratio_low": ([c.low if c else math.nan for c in changes], "float64"),
        "ratio_high": ([c.high if c else math.nan for c in changes], "float64"),
        "verdict": ([c.verdict if c else None for c in changes], object),
        "regression": ([bool(c and c.regression(threshold)) for c in changes], bool),
    }
    for name, (cells, dtype) in columns.items():
        out[name] = pd.Series(cells, index=out.index, dtype=dtype)
    out["_unmatched"] = out["ratio"].isna()
    out = out.sort_values(
        ["_unmatched", "phase", "seq_len", "mesh", "layout", "id"], na_position="last"
    )
    return out.drop(columns="_unmatched").reset_index(drop=True)


def _change(row: Any) -> Change | None:
    """The change of one merged row (None unless both sides are ok with a positive time)."""
    if not (row.status_before == "ok" and row.status_after == "ok"):
        return None
    values = [
        value(getattr(row, f"{c}_{side}"))
        for side in ("before", "after")
        for c in ("median_s", "ci_low_s", "ci_high_s")
    ]
    if any(v is None for v in values):
        return None
    bm, bl, bh, am, al, ah = (float(v) for v in values)
    if bm <= 0 or bl <= 0:
        return None
    return compare_intervals(Interval(bm, bl, bh, 0, ""), Interval(am, al, ah, 0, ""))


def rank_group(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """The group in which configurations are ranked against each other (the sweep's "best per
    group", the report, compare's pairing of equivalents): the same problem (L, batch, heads,
    KV heads, head dim, dtype), mask (kind, documents, window), phase, device and world size;
    meshes, layouts, kernels and implementations compete within it."""
    documents = config.get("documents")
    return (
        config.get("seq_len"),
        config.get("batch"),
        config.get("heads"),
        config.get("kv_heads"),
        config.get("head_dim"),
        config.get("dtype"),
        config.get("mask") or ("causal" if config.get("causal", True) else "full"),
        tuple(documents) if documents else None,
        config.get("window"),
        config.get("phase"),
        config.get("device"),
        config.get("world_size"),
    )


def record_interval(record: Mapping[str, Any]) -> Interval | None:
    """The step median's 95% interval of a record dict (as recorded; from its samples for a
    version 1 record); None without timing."""
    timing = record.get("timing")
    if not isinstance(timing, Mapping) or timing.get("median") is None:
        return None
    samples = timing.get("samples") or ()
    return recorded_interval(
        float(timing["median"]), timing.get("ci_low"), timing.get("ci_high"),
        timing.get("iterations") or len(samples), timing.get("interval_method") or "", samples,
    )


def tiebreak_interval(record: Mapping[str, Any]) -> Interval | None:
    """The interval of a record's interleaved re-measurement (`timing.tiebreak`), if any."""
    timing = record.get("timing")
    tb = timing.get("tiebreak") if isinstance(timing, Mapping) else None
    if not isinstance(tb, Mapping) or tb.get("median") is None:
        return None
    return recorded_interval(float(tb["median"]), tb["ci_low"], tb["ci_high"], tb["iterations"],
                             "interleaved re-measurement")


def rank_records(records: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, ...], Ranked]:
    """Per `rank_group`, the ok records ranked with ties (`ties.rank_with_ties`, by id; the
    interleaved re-measurement decides among tied leaders when it covers them all). The last
    record of an id wins."""
    latest: dict[str, Mapping[str, Any]] = {}
    for r in records:
        if r.get("status") == "ok" and record_interval(r) is not None and r.get("config"):
            latest[str(r["id"])] = r
    groups: dict[tuple[Any, ...], dict[str, Mapping[str, Any]]] = {}
    for rid, r in latest.items():
        groups.setdefault(rank_group(r["config"]), {})[rid] = r
    out: dict[tuple[Any, ...], Ranked] = {}
    for key, members in groups.items():
        intervals = {rid: record_interval(r) for rid, r in members.items()}
        tiebreaks = {rid: tiebreak_interval(r) for rid, r in members.items()}
        out[key] = rank_with_ties(
            {k: v for k, v in intervals.items() if v is not None},
            {k: v for k, v in tiebreaks.items() if v is not None} or None,
        )
    return out


def dynamic_speedups(
    records: Sequence[Mapping[str, Any]],
) -> dict[str, tuple[float | None, float | None]]:
    """Per ok dynamic-CP record (`schema.is_dynamic_record`) by id: its speedup over static CP
    measured (the study's static record's median / its median; None without an ok static
    record of the same study among `records`, the last of an id winning) and predicted
    (`predicted_static_s / predicted_s`; None when static cannot plan the batch)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for r in records:
        if r.get("status") == "ok" and isinstance(r.get("dynamic"), Mapping):
            latest[str(r["id"])] = r
    static = {
        r["dynamic"]["study"]: float(r["dynamic"]["median_s"])
        for r in latest.values()
        if r["dynamic"]["policy"] == "static"
    }
    out: dict[str, tuple[float | None, float | None]] = {}
    for rid, r in latest.items():
        d = r["dynamic"]
        base = static.get(d["study"])
        measured = base / float(d["median_s"]) if base is not None else None
        predicted_static = d.get("predicted_static_s")
        predicted = (
            float(predicted_static) / float(d["predicted_s"])
            if predicted_static is not None and d["predicted_s"] > 0
            else None
        )
        out[rid] = (measured, predicted)
    return out
