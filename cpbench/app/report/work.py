"""Packed documents: each rank's measured compute time against the model's per-rank work, and
the least-squares line through them (`WorkFit`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cpbench.results.frame import PHASE_ORDER, ok_rows

DOCUMENT_MASKS = ("document", "document_sliding_window")
"""The mask kinds of packed documents (`cpbench.config.vocabulary.Mask`)."""


@dataclass(frozen=True)
class WorkFit:
    """Measured per-rank compute time against the model's per-rank work, over every rank of
    the successful records with packed documents of one phase: a least-squares line
    time = slope x work + intercept through all of them, how well it fits, and per record the
    layout's padding and balance."""

    phase: str
    """fwd | fwd+bwd: the records' phase."""
    points: pd.DataFrame
    """One row per rank of each record: id, layout, mesh, seq_len, rank, work (attended
    (query, key) pairs x B x heads of the rank, `flops.per_rank_work`), compute_s (the rank's
    median compute-only time, seconds), fitted_s (the line at its work) and error
    (fitted_s / compute_s - 1)."""
    records: pd.DataFrame
    """One row per record: id, layout, mesh, seq_len, mask, documents (how many), padding
    (tokens the layout added), run_seq_len, median_s (step), compute_s (slowest rank's
    compute-only median), work_imbalance (max / mean predicted work), compute_imbalance
    (max / mean measured compute), correlation (Pearson r of its ranks' work and compute;
    None when the work is equal on every rank)."""
    slope_s: float
    """Seconds of compute per unit of work (the fitted line)."""
    intercept_s: float
    """Seconds of compute at zero work (fixed per-step cost)."""
    correlation: float | None
    """Pearson r of work and compute time over all points (None with fewer than 3 points or
    no spread)."""
    max_error: float
    """Largest |fitted / measured - 1| over the points (0.1 = 10 %)."""


def _pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def work_fits(frame: pd.DataFrame) -> list[WorkFit]:
    """Per phase, the `WorkFit` of the records with packed documents that have both the
    model's per-rank work and each rank's compute-only time (cpbench's own impl)."""
    if "mask" not in frame or "per_rank_work" not in frame:
        return []
    rows = ok_rows(frame, "compute_only_per_rank_s", "per_rank_work", "median_s")
    rows = rows[rows["mask"].isin(DOCUMENT_MASKS)]
    fits = []
    for phase in [p for p in PHASE_ORDER if p in set(rows["phase"])]:
        sub = rows[rows["phase"] == phase]
        points, summary = [], []
        for rec in sub.itertuples(index=False):
            work = [float(w) for w in rec.per_rank_work]
            compute = [float(t) for t in rec.compute_only_per_rank_s]
            if len(work) != len(compute) or not work:
                continue
            point = {"id": rec.id, "layout": rec.layout, "mesh": rec.mesh, "seq_len": int(rec.seq_len)}
            for rank, (w, t) in enumerate(zip(work, compute, strict=True)):
                points.append({**point, "rank": rank, "work": w, "compute_s": t})
            mean_w, mean_t = sum(work) / len(work), sum(compute) / len(compute)
            summary.append(
                {
                    **point,
                    "mask": rec.mask,
                    "documents": len(rec.documents) if rec.documents is not None else 1,
                    "padding": None if pd.isna(rec.padding) else int(rec.padding),
                    "run_seq_len": None if pd.isna(rec.run_seq_len) else int(rec.run_seq_len),
                    "median_s": float(rec.median_s),
                    "compute_s": max(compute),
                    "work_imbalance": max(work) / mean_w if mean_w > 0 else None,
                    "compute_imbalance": max(compute) / mean_t if mean_t > 0 else None,
                    "correlation": _pearson(work, compute),
                }
            )
        if not points:
            continue
        table = pd.DataFrame(points)
        x, y = table["work"].to_numpy(), table["compute_s"].to_numpy()
        if np.ptp(x) > 0:
            slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
        else:  # one work value: the mean time is the best constant
            slope, intercept = 0.0, float(y.mean())
        table["fitted_s"] = slope * table["work"] + intercept
        table["error"] = table["fitted_s"] / table["compute_s"] - 1.0
        fits.append(
            WorkFit(
                phase=str(phase),
                points=table,
                records=pd.DataFrame(summary),
                slope_s=slope,
                intercept_s=intercept,
                correlation=_pearson(list(x), list(y)),
                max_error=float(table["error"].abs().max()),
            )
        )
    return fits
