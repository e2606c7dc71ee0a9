"""The recommendation section: the fastest measured configurations (`measured_best`), and
`cpbench.app.recommend` on the measured workload, calibrated on the results files."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.app.report.data import ReportRecommendation
from cpbench.errors import CpbenchError
from cpbench.model.ties import Interval, rank_with_ties
from cpbench.results.frame import PHASE_ORDER, ok_rows, with_variant


def measured_best(frame: pd.DataFrame) -> pd.DataFrame:
    """The fastest successful configuration per phase, workload variant (when the results
    hold several, see `cpbench.results.frame.with_variant`) and sequence length, with the runner-up and the
    slowest, and how much faster the best is than each."""
    rows = with_variant(ok_rows(frame, "median_s", "seq_len"))
    rows = rows[rows["median_s"] > 0]  # a zero time is a broken record, not the fastest one
    rows = rows.drop_duplicates("id", keep="last")
    out = []
    for (phase, variant, seq_len), g in rows.groupby(["phase", "variant", "seq_len"], sort=True):
        g = g.sort_values("median_s")
        best = g.iloc[0]
        low, high = (g[bound].fillna(g["median_s"]) for bound in ("ci_low_s", "ci_high_s"))
        intervals = {  # a missing end of an interval is the median
            str(i): Interval(float(median), float(lo), float(hi), 0, "")
            for i, median, lo, hi in zip(g["id"], g["median_s"], low, high, strict=True)
        }
        ranked = rank_with_ties(intervals)
        tied = [g[g["id"] == i].iloc[0] for i in ranked.tied]
        second = g.iloc[1] if len(g) > 1 else None
        worst = g.iloc[-1]
        out.append(
            {
                "phase": phase,
                **({"workload": variant} if variant else {}),
                "L": int(seq_len),
                "best": f"{best['mesh']} {best['layout']}",
                "best ms": round(float(best["median_s"]) * 1e3, 4),
                "verdict": (
                    "fastest beyond the noise"
                    if ranked.clear
                    else "tie with " + ", ".join(f"{t['mesh']} {t['layout']}" for t in tied[1:])
                ),
                "runner-up": f"{second['mesh']} {second['layout']}" if second is not None else "",
                "runner-up ms": (
                    round(float(second["median_s"]) * 1e3, 4) if second is not None else None
                ),
                "slowest": f"{worst['mesh']} {worst['layout']}",
                "speedup vs slowest": round(float(worst["median_s"] / best["median_s"]), 3),
                "measured": len(g),
                "_id": best["id"],
            }
        )
    ordered = sorted(
        out,
        key=lambda r: (
            PHASE_ORDER.index(r["phase"]) if r["phase"] in PHASE_ORDER else 9,
            r.get("workload", ""),
            r["L"],
        ),
    )
    return pd.DataFrame(ordered)


def measured_recommendation(frame: pd.DataFrame) -> tuple[ReportRecommendation | None, str | None]:
    """The recommendation from the measurements alone: the fastest configuration measured."""
    best = measured_best(frame)
    if best.empty:
        return None, "No successful configuration: nothing to recommend."
    phase = "fwd+bwd" if "fwd+bwd" in set(best["phase"]) else str(best["phase"].iloc[0])
    top = best[best["phase"] == phase].iloc[-1]
    summary = (
        f"For the longest measured sequence (L={int(top['L'])}, phase {phase}) the fastest "
        f"configuration is {top['best']} ({top['best ms']:.4g} ms per step), "
        f"{top['speedup vs slowest']:.2f}x faster than the slowest one measured ({top['slowest']})."
    )
    return ReportRecommendation(summary=summary, tables=[(MEASURED_CAPTION, _best_rows(best))]), None


MEASURED_CAPTION = "Fastest measured configuration per phase and sequence length"


def _best_rows(best: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in best.to_dict("records")]


def measured_workload(frame: pd.DataFrame) -> dict[str, Any] | None:
    """The workload the measurements describe, for `cpbench.app.recommend`: the attention shape,
    dtype and mask with the most successful records, its longest sequence of the fwd+bwd phase
    (else fwd) and the largest world size (and devices per node) it ran on."""
    keys = ["heads", "kv_heads", "head_dim", "batch", "dtype", "causal"]
    rows = ok_rows(frame, "median_s", "seq_len", "world_size", *keys)
    if rows.empty:
        return None
    groups = rows.groupby(keys, dropna=False)
    shape, group = max(groups, key=lambda kv: len(kv[1]))
    phase = "fwd+bwd" if (group["phase"] == "fwd+bwd").any() else "fwd"
    group = group[group["phase"] == phase]
    widest = group.loc[group["world_size"].astype(int).idxmax()]
    nodes = int(widest["nodes"]) if not pd.isna(widest["nodes"]) else 1
    world = int(widest["world_size"])
    return {
        **{k: (v.item() if hasattr(v, "item") else v) for k, v in zip(keys, shape, strict=True)},
        "seq_len": int(group["seq_len"].max()),
        "phase": phase,
        "gpus": world,
        "gpus_per_node": max(1, world // max(1, nodes)),
        "shapes": groups.ngroups,
    }


def service_recommendation(
    frame: pd.DataFrame, paths: Sequence[Path], hardware: str, measured: ReportRecommendation
) -> tuple[ReportRecommendation | None, str | None]:
    """`cpbench.app.recommend` for the measured workload, calibrated on the results files: its
    explanation, ranked candidates (measured ones by their measurement), rejected meshes and
    framework settings, plus the measured-best table."""
    try:
        service = importlib.import_module("cpbench.app.recommend")
    except ImportError:
        return measured, "recommendation service not available (cpbench.app.recommend)"
    workload = measured_workload(frame)
    if workload is None:
        return measured, None
    request = service.RecommendRequest(
        **{key: int(workload[key]) for key in ("heads", "kv_heads", "head_dim", "batch")},
        **{key: workload[key] for key in ("seq_len", "gpus", "gpus_per_node", "phase")},
        hardware=hardware,
        dtype=str(workload["dtype"]),
        causal=bool(workload["causal"]),
        results=tuple(str(p) for p in paths),
        top=0,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn last line was reported when read above
            rec = service.recommend_mesh(request)
    except CpbenchError as exc:
        return measured, f"the recommendation service could not rank this workload: {exc}"
    ranked_rows = [
        {
            "rank": i,
            "U x R": f"{c.prediction.candidate.ulysses}x{c.prediction.candidate.ring}",
            "layout": service.layout_label(c.prediction),
            "ranked by": c.source,
            "time ms": round(c.time_s * 1e3, 4),
            "predicted ms": round(c.prediction.step_s * 1e3, 4),
            "memory/rank GiB": round(c.prediction.memory_bytes / 1024**3, 3),
        }
        for i, c in enumerate(rec.ranked[:10], start=1)
    ]
    shapes = workload["shapes"]
    notes = [
        f"Workload: h={workload['heads']}, h_kv={workload['kv_heads']}, "
        f"d_h={workload['head_dim']}, B={workload['batch']}, {workload['dtype']}, "
        f"{'causal' if workload['causal'] else 'full mask'}, L={workload['seq_len']}, "
        f"phase {workload['phase']}, {workload['gpus']} devices "
        f"({workload['gpus_per_node']} per node)"
        + (
            f"; the results hold {shapes} attention shapes, this one has the most records."
            if shapes > 1
            else "."
        )
    ]
    if rec.calibration is not None:
        cal = rec.calibration
        notes.append(
            f"Profile {rec.profile.name}: {cal.prior.name} calibrated on {cal.points} "
            f"measurements (rms step-time error {cal.residual_before:.0%} -> {cal.residual:.0%})."
        )
    for r in rec.rejected:
        notes.append(f"Rejected {r.ulysses}x{r.ring} ({', '.join(r.layouts)}): {r.rule}")
    out = ReportRecommendation(
        explanation=rec.explanation,
        tables=[
            ("Ranked candidates (measured where measured, else the model)", ranked_rows),
            *measured.tables,
        ],
        frameworks=rec.frameworks,
        notes=notes,
    )
    return out, None
