"""The `cpbench report` application service: results files -> the data of the report page.

`build_report(paths, ...)` reads the records (`cpbench.results.store`), summarizes them, adds
what the cost model knows when a hardware profile is available (predicted step time, fraction
of peak, the recommendation) and returns a `ReportData`; `build_comparison(before, after)`
returns the `ComparisonData` of two files matched by record id. The page itself is drawn by
`cpbench.render.html` from that data; `write_report` writes it to a file. Nothing here prints
or renders; warnings (a torn last line) are returned for the CLI to show.
"""

from __future__ import annotations

import importlib
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cpbench.errors import CpbenchError
from cpbench.model.calibrate.stats import Interval, rank_with_ties
from cpbench.results.frame import PHASE_ORDER, compare_frame, ok_rows, with_variant
from cpbench.results.schema import STATUSES
from cpbench.results.store import read_records, records_frame

__all__ = [
    "NO_PROFILE_NOTE",
    "ComparisonData",
    "Recommendation",
    "ReportData",
    "Summary",
    "WorkFit",
    "build_comparison",
    "build_report",
    "cost_model",
    "default_hardware",
    "measured_best",
    "measured_workload",
    "summarize",
    "work_fits",
    "write_report",
]

NO_PROFILE_NOTE = "no hardware profile available"


@dataclass
class Recommendation:
    """What the recommendation section shows; plain text only (escaped when rendered)."""

    summary: str = ""
    """One paragraph."""
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
    """Number of records."""
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


DOCUMENT_MASKS = ("document", "document_sliding_window")
"""The mask kinds of packed documents (`cpbench.config.vocabulary.MASKS`)."""


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
            for rank, (w, t) in enumerate(zip(work, compute, strict=True)):
                points.append(
                    {"id": rec.id, "layout": rec.layout, "mesh": rec.mesh,
                     "seq_len": int(rec.seq_len), "rank": rank, "work": w, "compute_s": t}
                )  # fmt: skip
            mean_w, mean_t = sum(work) / len(work), sum(compute) / len(compute)
            summary.append(
                {
                    "id": rec.id,
                    "layout": rec.layout,
                    "mesh": rec.mesh,
                    "seq_len": int(rec.seq_len),
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


@dataclass
class ReportData:
    """Everything the report page shows, for `cpbench.render.html.render_report`."""

    title: str
    sources: list[str]
    """Names of the results files."""
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
    recommendation: Recommendation | None = None
    recommendation_note: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why a section is empty or a model part is missing (for the CLI to show)."""
    work: list[WorkFit] = field(default_factory=list)
    """Packed documents: per-rank predicted work against measured compute, per phase."""
    plan: dict[str, Any] | None = None
    """The whole-model plan (`cpbench.app.plan.to_json`) when a model was given."""

    @property
    def records(self) -> int:
        return self.summary.total


@dataclass
class ComparisonData:
    """Everything the before/after page shows, for `cpbench.render.html.render_comparison`."""

    title: str
    sources: tuple[str, str]
    """Names of the BEFORE and AFTER files."""
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
    `cpbench.model.calibrate.stats.compare_intervals`, as `cpbench compare`)."""
    slower: int
    """Matched ids significantly slower after."""
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


def _read(paths: Sequence[Path]) -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(list(paths))
    return records, [str(w.message) for w in caught]


# ---------------------------------------------------------------------------------- summary


def _group_reasons(messages: Iterable[str]) -> list[tuple[int, str, int]]:
    """(count, example, variants) per message pattern (numbers ignored), most frequent first."""
    groups: dict[str, list[str]] = {}
    for msg in messages:
        key = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", msg or "(no reason recorded)")
        groups.setdefault(key, []).append(msg or "(no reason recorded)")
    out = [(len(v), v[0], len(set(v))) for v in groups.values()]
    return sorted(out, key=lambda t: (-t[0], t[1]))


def _cfg(record: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = record.get("config")
    return cfg if isinstance(cfg, Mapping) else {}


def summarize(records: Sequence[Mapping[str, Any]]) -> Summary:
    """Header facts: scenarios, devices, hosts, software versions, environment variables,
    record time span and status counts with grouped reasons."""
    statuses = Counter(str(r.get("status")) for r in records)
    devices: Counter[str] = Counter()
    hosts: set[str] = set()
    software: dict[str, set[str]] = {}
    env_vars: dict[str, set[str]] = {}
    for r in records:
        env = r.get("environment")
        if not isinstance(env, Mapping):
            continue
        devs = env.get("devices")
        if isinstance(devs, list):
            for name, count in Counter(map(str, devs)).items():
                devices[name] = max(devices[name], count)
        hostnames = env.get("hostnames")
        if isinstance(hostnames, list):
            hosts.update(map(str, hostnames))
        for key, value in env.items():
            if key in ("devices", "hostnames", "env"):
                continue
            if value is None or isinstance(value, (str, int, float, bool)):
                software.setdefault(str(key), set()).add("none" if value is None else str(value))
        variables = env.get("env")
        if isinstance(variables, Mapping):
            for key, value in variables.items():
                env_vars.setdefault(str(key), set()).add(str(value))
    stamps = sorted(str(r["timestamp"]) for r in records if r.get("timestamp"))
    return Summary(
        scenarios=sorted({str(r.get("scenario")) for r in records if r.get("scenario")}),
        total=len(records),
        statuses=dict(statuses),
        reasons={
            status: _group_reasons(
                str(r.get("error") or "") for r in records if r.get("status") == status
            )
            for status in STATUSES
            if status != "ok"
            if statuses.get(status)
        },
        devices=dict(devices),
        hosts=sorted(hosts),
        software={k: sorted(v) for k, v in sorted(software.items())},
        env={k: sorted(v) for k, v in sorted(env_vars.items())},
        first=stamps[0] if stamps else None,
        last=stamps[-1] if stamps else None,
        device_kinds=sorted({str(_cfg(r).get("device")) for r in records if _cfg(r).get("device")}),
    )


# ------------------------------------------------------------------------------ cost model


@dataclass
class ModelResult:
    """What the cost model adds to a report."""

    profile_name: str | None = None
    profile_line: str = NO_PROFILE_NOTE
    predicted_s: dict[int, float] = field(default_factory=dict)
    """Frame index -> predicted step time (seconds)."""
    peak_fraction: dict[int, float] = field(default_factory=dict)
    """Frame index -> achieved TFLOP/s / peak TFLOP/s of all ranks."""
    prediction_note: str | None = None
    peak_note: str | None = None
    recommendation: Recommendation | None = None
    recommendation_note: str | None = None
    notes: list[str] = field(default_factory=list)


def default_hardware(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The profile to use when none is given: 'cpu-local' for CPU records; for GPU records the
    built-in profile whose name matches the device names; None when nothing matches."""
    kinds = {
        str(r["config"].get("device"))
        for r in records
        if isinstance(r.get("config"), Mapping) and r["config"].get("device")
    }
    if kinds == {"cpu"}:
        return "cpu-local"
    names = {
        str(d)
        for r in records
        if isinstance(r.get("environment"), Mapping)
        for d in (r["environment"].get("devices") or [])
    }
    return _profile_for_devices(sorted(names)) if names else None


def _profile_for_devices(device_names: Sequence[str]) -> str | None:
    """The built-in profile describing every device name (the model's one device -> profile
    rule, `cpbench.model.hardware.profile_for_devices`); None when no single one does."""
    try:
        from cpbench.model.hardware import profile_for_devices  # noqa: PLC0415
    except ImportError:
        return None
    return profile_for_devices(device_names)


def cost_model(
    records: Sequence[Mapping[str, Any]],
    frame: pd.DataFrame,
    hardware: str | None,
    paths: Sequence[Path] = (),
) -> ModelResult:
    """Predictions, peak fractions and the recommendation for `hardware` (a profile name or
    file; None = `default_hardware`). Every part missing from the model is a note, never an
    error, except an explicitly named profile that does not load."""
    result = ModelResult()
    result.recommendation, result.recommendation_note = _measured_recommendation(frame)
    name = hardware or default_hardware(records)
    if name is None:
        result.prediction_note = f"{NO_PROFILE_NOTE}: pass --hardware NAME|PATH"
        result.notes.append(result.prediction_note)
        return result
    try:
        from cpbench.model.hardware import load_profile  # noqa: PLC0415
    except ImportError:
        result.prediction_note = f"{NO_PROFILE_NOTE} (cpbench.model.hardware is not installed)"
        result.notes.append(result.prediction_note)
        return result
    try:
        profile = load_profile(name)
    except CpbenchError:
        if hardware is not None:
            raise
        result.prediction_note = f"{NO_PROFILE_NOTE} (no built-in profile {name!r})"
        result.notes.append(result.prediction_note)
        return result
    result.profile_name = str(profile.name)
    described = f"{profile.name}: {profile.description}"
    if profile.calibration is not None:
        cal = profile.calibration
        described += (
            f" (calibrated from {cal.prior} on {cal.points} measurements, "
            f"rms error {cal.residual:.0%})"
        )
    result.profile_line = described + ("" if hardware else " (default for these records)")
    _add_peak_fractions(frame, profile, result)
    _add_predictions(records, profile, result)
    if result.recommendation is not None and paths:
        result.recommendation, result.recommendation_note = _service_recommendation(
            frame, paths, hardware or name, result.recommendation
        )
    return result


def _peak_tflops(profile: Any, dtype: str) -> float | None:
    """Peak dense TFLOP/s of one device for a dtype (None when the profile has none)."""
    try:
        return float(profile.peak_flops(dtype)) / 1e12
    except (CpbenchError, AttributeError, TypeError, ValueError):
        return None


def _add_peak_fractions(frame: pd.DataFrame, profile: Any, result: ModelResult) -> None:
    rows = ok_rows(frame, "achieved_tflops", "world_size")
    for idx, row in rows.iterrows():
        peak = _peak_tflops(profile, str(row["dtype"]))
        if peak and peak > 0:
            result.peak_fraction[idx] = float(row["achieved_tflops"]) / (
                peak * int(row["world_size"])
            )
    if not result.peak_fraction:
        result.peak_note = f"profile {result.profile_name} gives no peak TFLOP/s for these dtypes"


def _add_predictions(
    records: Sequence[Mapping[str, Any]], profile: Any, result: ModelResult
) -> None:
    try:
        from cpbench.model.cost import prediction_for_record  # noqa: PLC0415
    except ImportError:
        result.prediction_note = "no cost model available (cpbench.model.cost is not installed)"
        result.notes.append(result.prediction_note)
        return
    for idx, record in enumerate(records):
        if record.get("status") != "ok":
            continue
        config = record.get("config")
        if isinstance(config, Mapping) and config.get("impl", "cpbench") != "cpbench":
            continue  # the cost model describes cpbench's own implementation
        try:
            prediction = prediction_for_record(dict(record), profile)
        except CpbenchError:
            continue
        seconds = _predicted_seconds(prediction)
        if seconds is not None:
            result.predicted_s[idx] = seconds
    if not result.predicted_s:
        result.prediction_note = (
            f"the cost model predicts none of these records ({result.profile_name})"
        )


def _predicted_seconds(prediction: Any) -> float | None:
    """`Prediction.step_s` (the record's phase), when finite and positive."""
    value = getattr(prediction, "step_s", None) if prediction is not None else None
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        return float(value)
    return None


# -------------------------------------------------------------------------- recommendation


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
        intervals = {
            str(r["id"]): Interval(
                float(r["median_s"]),
                float(r["ci_low_s"]) if pd.notna(r["ci_low_s"]) else float(r["median_s"]),
                float(r["ci_high_s"]) if pd.notna(r["ci_high_s"]) else float(r["median_s"]),
                0,
                "",
            )
            for _, r in g.iterrows()
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


def _measured_recommendation(frame: pd.DataFrame) -> tuple[Recommendation | None, str | None]:
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
    return Recommendation(summary=summary, tables=[(MEASURED_CAPTION, _best_rows(best))]), None


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


def _service_recommendation(
    frame: pd.DataFrame, paths: Sequence[Path], hardware: str, measured: Recommendation
) -> tuple[Recommendation | None, str | None]:
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
        heads=int(workload["heads"]),
        kv_heads=int(workload["kv_heads"]),
        seq_len=workload["seq_len"],
        head_dim=int(workload["head_dim"]),
        batch=int(workload["batch"]),
        gpus=workload["gpus"],
        gpus_per_node=workload["gpus_per_node"],
        hardware=hardware,
        dtype=str(workload["dtype"]),
        causal=bool(workload["causal"]),
        phase=workload["phase"],
        results=tuple(str(p) for p in paths),
        top=0,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn last line was reported when read above
            rec = service.recommend(request)
    except CpbenchError as exc:
        return measured, f"the recommendation service could not rank this workload: {exc}"
    ranked_rows = [
        {
            "rank": i,
            "U x R": f"{c.prediction.config.ulysses}x{c.prediction.config.ring}",
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
    out = Recommendation(
        explanation=rec.explanation,
        tables=[
            ("Ranked candidates (measured where measured, else the model)", ranked_rows),
            *measured.tables,
        ],
        frameworks=rec.frameworks,
        notes=notes,
    )
    return out, None


# ---------------------------------------------------------------------------------- service


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
    frame = records_frame(records)
    model = cost_model(records, frame, hardware, paths)
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
        notes=model.notes,
        work=work_fits(frame),
        plan=_plan(plan_request),
    )


def _plan(request: Any) -> dict[str, Any] | None:
    """The whole-model plan's answer, None without a request."""
    if request is None:
        return None
    from cpbench.app import plan as planner  # noqa: PLC0415

    return planner.to_json(planner.plan(request))


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


def write_report(html: str, output: Path) -> Path:
    """Write the page `html` to `output` (parent folders created); returns the path."""
    output = Path(output)
    if output.is_dir():
        raise CpbenchError(f"output {output} is a directory; give a file name such as report.html")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise CpbenchError(f"cannot write {output}: {exc.strerror or exc}") from exc
    return output
