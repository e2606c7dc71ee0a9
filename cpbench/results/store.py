"""The results store: one JSON record per configuration, one per line (JSONL).

The record format is described in `cpbench.results.schema`. Writers append and fsync one record as
soon as its configuration ends (`append_record`), so a crash loses at most the record being
written; such a torn last line is skipped with a warning by `read_records`. A malformed line
anywhere else is an error that names the file and the line.

`records_frame` flattens records into a pandas DataFrame with one row per record; the report
and the tables read that frame.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.errors import CpbenchError

SOURCE_KEY = "_source"
"""Key `read_records` adds to every record: the name of the file it was read from."""

CONFIG_INT_COLUMNS = (
    "seq_len",
    "batch",
    "heads",
    "kv_heads",
    "head_dim",
    "ulysses",
    "ring",
    "kv_replication",
    "world_size",
    "nodes",
)
"""Integer configuration fields (nullable `Int64` columns of the frame)."""

FLOAT_COLUMNS = (
    "median_s",
    "p10_s",
    "p90_s",
    "compute_only_s",
    "comm_only_s",
    "exposed_comm_s",
    "overlap",
    "analytic_fwd_bytes",
    "analytic_bwd_bytes",
    "measured_fwd_bytes",
    "measured_bwd_bytes",
    "busbw_GBps",
    "peak_bytes",
    "analytic_peak_bytes",
    "rss_peak_bytes",
    "flops_global",
    "achieved_tflops",
    "achieved_tflops_per_rank",
    "max_abs_error",
)
"""Measurement columns (float64, NaN where a record has no value)."""

_CONFIG_TEXT = (
    "impl",
    "dtype",
    "causal",
    "layout",
    "backend",
    "kernel",
    "device",
    "phase",
    "scheme",
)

COLUMNS = (
    "id",
    "source",
    "scenario",
    "timestamp",
    "status",
    "error",
    "schema_version",
    *CONFIG_INT_COLUMNS,
    *_CONFIG_TEXT,
    "mesh",
    *FLOAT_COLUMNS,
    "per_rank_median_s",
    "compute_only_per_rank_s",
    "comm_match",
    "comm_mismatch",
    "comm_fwd_mismatch",
    "comm_bwd_mismatch",
    "memory_source",
    "accuracy_passed",
    "devices",
)
"""Columns of `records_frame`, in order (config fields a record adds beyond these follow)."""


# ------------------------------------------------------------------------------------ writing


def append_record(path: Path, record: dict) -> None:
    """Append one record as one JSON line, then flush and fsync (parent folders are created).

    A file whose last line was torn by a crash is repaired first: a complete JSON line that
    only lacks its newline gets one; an incomplete fragment is cut off (with a warning), so
    the new record never lands glued to the fragment.
    """
    path = Path(path)
    try:
        line = json.dumps(record, separators=(",", ":")) + "\n"
    except (TypeError, ValueError) as exc:
        raise CpbenchError(f"record {record.get('id')!r} is not JSON serialisable: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    _repair_torn_tail(path)
    data = line.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _repair_torn_tail(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        # Find the start of the last line.
        size = f.seek(0, os.SEEK_END)
        pos, block, tail = size, 4096, b""
        while pos > 0:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            if b"\n" in tail:
                break
        cut = tail.rfind(b"\n")
        start = pos + cut + 1 if cut >= 0 else 0
        fragment = tail[cut + 1 :] if cut >= 0 else tail
        try:
            json.loads(fragment.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            warnings.warn(
                f"{path}: dropping a torn last line ({len(fragment)} bytes) before appending",
                stacklevel=3,
            )
            f.truncate(start)
        else:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------------------------ reading


def read_records(paths: Path | str | Iterable[Path | str]) -> list[dict]:
    """Records of one or more JSONL files, in file order.

    Blank lines are skipped; a torn last line (a crash mid-write) is skipped with a warning; any
    other malformed line raises CpbenchError naming the file and line. Unknown fields are kept
    as they are. Each record gets `SOURCE_KEY` set to its file's name.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records: list[dict] = []
    for path in paths:
        records.extend(_read_file(Path(path)))
    return records


def _read_file(path: Path) -> list[dict]:
    if not path.exists():
        raise CpbenchError(f"results file {path} does not exist")
    if path.is_dir():
        raise CpbenchError(f"results file {path} is a directory, not a JSONL file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CpbenchError(f"cannot read results file {path}: {exc.strerror or exc}") from exc
    lines = raw.split(b"\n")
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    records: list[dict] = []
    for i, (lineno, line) in enumerate(numbered):
        is_last = i == len(numbered) - 1
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if is_last:
                warnings.warn(
                    f"{path}:{lineno}: skipping a torn last line (an interrupted write?)",
                    stacklevel=3,
                )
                continue
            raise CpbenchError(f"{path}:{lineno}: malformed results line: {exc}") from None
        if not isinstance(record, dict):
            raise CpbenchError(
                f"{path}:{lineno}: a results line must be a JSON object, "
                f"not {type(record).__name__}"
            )
        record[SOURCE_KEY] = path.name
        records.append(record)
    return records


def completed_ids(path: Path) -> set[str]:
    """Ids of the records already in `path` (every status counts as done); empty when the
    file does not exist yet. Used by `cpbench sweep --resume`."""
    path = Path(path)
    if not path.exists():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {str(r["id"]) for r in read_records(path) if r.get("id") is not None}


# --------------------------------------------------------------------------------- the frame


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record, flattened (see `COLUMNS`): configuration fields as top-level columns,
    status and error, timing (seconds), communication bytes (measured: max over ranks), memory
    (peak: max over ranks), FLOP/s, accuracy, the source file's name and the scenario."""
    rows = [_flatten(r) for r in records]
    extra = sorted({k for row in rows for k in row} - set(COLUMNS))
    frame = pd.DataFrame(rows, columns=[*COLUMNS, *extra])
    for col in CONFIG_INT_COLUMNS:
        numbers = pd.to_numeric(frame[col], errors="coerce")
        # A non-integral or out-of-range value in a hand-edited file becomes missing, not a crash.
        whole = numbers.where((numbers % 1 == 0) & (numbers.abs() < 2**62))
        frame[col] = whole.astype("Int64")
    for col in FLOAT_COLUMNS:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["schema_version"] = pd.to_numeric(frame["schema_version"], errors="coerce").astype(
        "Int64"
    )
    booleans = ("causal", "comm_match", "comm_mismatch", "comm_fwd_mismatch", "comm_bwd_mismatch")
    for col in (*booleans, "accuracy_passed"):
        frame[col] = frame[col].map(lambda v: v if isinstance(v, bool) else pd.NA).astype("boolean")
    for col in ("per_rank_median_s", "compute_only_per_rank_s"):
        frame[col] = frame[col].astype(object)
    return frame


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _max_over_ranks(value: Any) -> float | None:
    if isinstance(value, (list, tuple)):
        numbers = [n for n in (_number(v) for v in value) if n is not None]
        return max(numbers) if numbers else None
    return _number(value)


def _rank_list(value: Any) -> list[float] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    numbers = [_number(v) for v in value]
    if any(n is None for n in numbers):
        return None
    return [float(n) for n in numbers if n is not None]


def _direction_mismatch(comm: Any, direction: str) -> bool | None:
    """True when any rank's measured bytes of a direction (fwd/bwd) differ from the analytic
    bytes; None when the record lacks either number."""
    expected = _number(_get(comm, "analytic_bytes", direction))
    got = _get(comm, "measured_bytes", direction)
    if expected is None or got is None:
        return None
    values = got if isinstance(got, (list, tuple)) else [got]
    return any(_number(v) != expected for v in values)


def _mismatch(comm: Any) -> bool | None:
    """True when any rank's measured bytes differ from the analytic bytes in a direction (or
    the record says they do not match); None when the record has no communication counts."""
    flags = [_direction_mismatch(comm, d) for d in ("fwd", "bwd")]
    match = _get(comm, "match")
    if isinstance(match, bool):
        return any(f is True for f in flags) or not match
    known = [f for f in flags if f is not None]
    return any(known) if known else None


def _flatten(record: Mapping[str, Any]) -> dict[str, Any]:
    config = record.get("config") if isinstance(record.get("config"), Mapping) else {}
    timing = record.get("timing") if isinstance(record.get("timing"), Mapping) else {}
    comm = record.get("comm") if isinstance(record.get("comm"), Mapping) else {}
    memory = record.get("memory") if isinstance(record.get("memory"), Mapping) else {}
    flops = record.get("flops") if isinstance(record.get("flops"), Mapping) else {}
    accuracy = record.get("accuracy") if isinstance(record.get("accuracy"), Mapping) else {}
    env = record.get("environment") if isinstance(record.get("environment"), Mapping) else {}

    row: dict[str, Any] = {}
    for key, value in config.items():
        if key not in COLUMNS or key in CONFIG_INT_COLUMNS or key in _CONFIG_TEXT:
            row[key] = value
    row.update(
        id=record.get("id"),
        source=record.get(SOURCE_KEY),
        scenario=record.get("scenario"),
        timestamp=record.get("timestamp"),
        status=record.get("status"),
        error=record.get("error"),
        schema_version=record.get("schema_version"),
    )
    if row.get("phase") is None:
        row["phase"] = timing.get("phase")
    if config and row.get("impl") is None:
        row["impl"] = "cpbench"  # records written before the impl axis are cpbench's own
    u, r = config.get("ulysses"), config.get("ring")
    row["mesh"] = f"U{u}xR{r}" if u is not None and r is not None else None

    analytic = comm.get("analytic_bytes") if isinstance(comm.get("analytic_bytes"), Mapping) else {}
    measured = comm.get("measured_bytes") if isinstance(comm.get("measured_bytes"), Mapping) else {}
    peak = _max_over_ranks(memory.get("peak_bytes"))
    devices = env.get("devices")
    row.update(
        median_s=_number(timing.get("median")),
        p10_s=_number(timing.get("p10")),
        p90_s=_number(timing.get("p90")),
        compute_only_s=_number(timing.get("compute_only")),
        comm_only_s=_number(timing.get("comm_only")),
        exposed_comm_s=_number(timing.get("exposed_comm")),
        overlap=_number(timing.get("overlap")),
        analytic_fwd_bytes=_number(analytic.get("fwd")),
        analytic_bwd_bytes=_number(analytic.get("bwd")),
        measured_fwd_bytes=_max_over_ranks(measured.get("fwd")),
        measured_bwd_bytes=_max_over_ranks(measured.get("bwd")),
        busbw_GBps=_number(comm.get("achieved_busbw_GBps", comm.get("achieved_algbw_GBps"))),
        peak_bytes=peak,
        analytic_peak_bytes=_number(memory.get("analytic_peak_bytes")),
        rss_peak_bytes=_max_over_ranks(memory.get("rss_peak_bytes")),
        flops_global=_number(flops.get("global")),
        achieved_tflops=_number(flops.get("achieved_tflops")),
        achieved_tflops_per_rank=_number(flops.get("achieved_tflops_per_rank")),
        max_abs_error=_number(accuracy.get("max_abs_error")),
        per_rank_median_s=_rank_list(timing.get("per_rank_median")),
        compute_only_per_rank_s=_rank_list(timing.get("compute_only_per_rank")),
        comm_match=comm.get("match") if isinstance(comm.get("match"), bool) else None,
        comm_mismatch=_mismatch(comm),
        comm_fwd_mismatch=_direction_mismatch(comm, "fwd"),
        comm_bwd_mismatch=_direction_mismatch(comm, "bwd"),
        memory_source=memory.get("source"),
        accuracy_passed=(
            accuracy.get("passed") if isinstance(accuracy.get("passed"), bool) else None
        ),
        devices=", ".join(map(str, devices)) if isinstance(devices, list) else devices,
    )
    if row.get("impl") not in (None, "cpbench") and comm.get("match") is None:
        # An external library's bytes next to cpbench's model: no verdict (cpbench.app.sweep).
        row.update(comm_mismatch=None, comm_fwd_mismatch=None, comm_bwd_mismatch=None)
    for key in FLOAT_COLUMNS:
        value = row.get(key)
        if isinstance(value, float) and math.isinf(value):
            row[key] = None
    return row
