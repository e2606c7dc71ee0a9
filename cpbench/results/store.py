"""The results store: one JSON record per configuration, one per line (JSONL).

Appending, torn lines and reading back: docs/design.md section 6."""

from __future__ import annotations

import codecs
import copy
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from cpbench.config.vocabulary import PassKey
from cpbench.errors import CpbenchError
from cpbench.reading import loads_json, read_bytes
from cpbench.results.schema import (
    SCHEMA_VERSION,
    STATUSES,
    CommSection,
    ResultRecord,
    dump_record,
    migrate_record,
)

SOURCE_KEY = "_source"
"""Key `read_records` adds to every record: the name of the file it was read from (the typed
records of `read_results` have it as `ResultRecord.source`)."""

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
    "window",
    "padding",
    "run_seq_len",
)
"""Integer configuration fields (nullable `Int64` columns of the frame)."""

FLOAT_COLUMNS = (
    "median_s",
    "ci_low_s",
    "ci_high_s",
    "relative_width",
    "p10_s",
    "p90_s",
    "compute_only_s",
    "comm_only_s",
    "exposed_comm_s",
    "overlap",
    "overlap_low",
    "overlap_high",
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
    "sampled_rows_error",
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
    "mask",
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
    "documents",
    *FLOAT_COLUMNS,
    "per_rank_median_s",
    "compute_only_per_rank_s",
    "per_rank_work",
    "comm_match",
    "comm_mismatch",
    "comm_fwd_mismatch",
    "comm_bwd_mismatch",
    "memory_source",
    "accuracy_passed",
    "devices",
    "iterations",
    "target_met",
    "overlap_status",
    "equivalent",
    "machine_warnings",
)
"""Columns of `records_frame`, in order (config fields a record adds beyond these follow)."""


# ------------------------------------------------------------------------------------ writing


def append_record(path: Path, record: ResultRecord | Mapping[str, Any]) -> None:
    """Append one record as one JSON line, then flush and fsync (parent folders are created).
    A `ResultRecord` is written as `schema.dump_record` gives it.

    A file whose last line was torn by a crash is repaired first: a complete JSON line that
    only lacks its newline gets one; an incomplete fragment is cut off (with a warning), so
    the new record never lands glued to the fragment.
    """
    path = Path(path)
    data = dump_record(record) if isinstance(record, ResultRecord) else record
    try:
        line = json.dumps(data, separators=(",", ":")) + "\n"
    except (TypeError, ValueError) as exc:
        raise CpbenchError(f"record {data.get('id')!r} is not JSON serialisable: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    _repair_torn_tail(path)
    encoded = line.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(encoded)
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
        except (ValueError, RecursionError):  # undecodable, not JSON, too deep
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


def inflight_path(out: Path) -> Path:
    """The in-flight marker of a sweep writing `out`: `<out>.inflight`."""
    out = Path(out)
    return out.with_name(out.name + ".inflight")


def mark_inflight(out: Path, record: ResultRecord | Mapping[str, Any]) -> None:
    """Write the record a configuration gets if the job dies while it runs (a launched world
    writes it before each configuration; `take_inflight` turns it into a record on --resume).
    Written to a temporary file and renamed, so a marker is never half written."""
    marker = inflight_path(out)
    data = dump_record(record) if isinstance(record, ResultRecord) else record
    temporary = marker.with_name(marker.name + ".tmp")
    temporary.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    os.replace(temporary, marker)


def clear_inflight(out: Path) -> None:
    """Remove the in-flight marker (the configuration ended and is recorded, or was
    interrupted on purpose and is to be measured again)."""
    inflight_path(out).unlink(missing_ok=True)


def take_inflight(out: Path) -> dict[str, Any] | None:
    """The record of the configuration that was running when a sweep's job died; None when
    there is none (or it cannot be read). The caller appends it, then `clear_inflight` — in
    that order, so a crash in between loses nothing."""
    marker = inflight_path(out)
    if not marker.exists():
        return None
    try:
        data = loads_json(marker.read_text(encoding="utf-8"), str(marker))
    except (OSError, ValueError):  # CpbenchError and JSONDecodeError are ValueErrors
        data = None
    return data if isinstance(data, dict) and "id" in data else None


# ------------------------------------------------------------------------------------ reading


def read_results(paths: Path | str | Iterable[Path | str]) -> list[ResultRecord]:
    """Typed records of one or more JSONL files, in file order, each with its file's name as
    `source`.

    Blank lines are skipped; a torn last line (a crash mid-write) is skipped with a warning; any
    other malformed line, or a line that is not a record (see `parse_record`), raises
    CpbenchError naming the file and line. Unknown fields are kept.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records: list[ResultRecord] = []
    for path in paths:
        records.extend(_read_file(Path(path)))
    return records


def read_records(paths: Path | str | Iterable[Path | str]) -> list[dict[str, Any]]:
    """`read_results` as dicts (`schema.dump_record`: validated, migrated, the keys of the
    file), each with `SOURCE_KEY` set to its file's name."""
    return [_as_dict(record) for record in read_results(paths)]


def _as_dict(record: ResultRecord) -> dict[str, Any]:
    out = dump_record(record)
    out[SOURCE_KEY] = record.source
    return out


def _read_file(path: Path) -> list[ResultRecord]:
    raw = read_bytes(path, "results file", "JSONL file")
    lines = raw.removeprefix(codecs.BOM_UTF8).split(b"\n")
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    parsed: list[tuple[int, dict[str, Any]]] = []
    # Every line is JSON first, so that a malformed line is named before a line that is valid
    # JSON but not a record.
    for i, (lineno, line) in enumerate(numbered):
        is_last = i == len(numbered) - 1
        try:
            data = loads_json(line.decode("utf-8"), f"{path}:{lineno}")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if is_last:
                warnings.warn(
                    f"{path}:{lineno}: skipping a torn last line (an interrupted write?)",
                    stacklevel=4,
                )
                continue
            raise CpbenchError(f"{path}:{lineno}: malformed results line: {exc}") from None
        if not isinstance(data, dict):
            raise CpbenchError(
                f"{path}:{lineno}: a results line must be a JSON object, not {type(data).__name__}"
            )
        parsed.append((lineno, data))
    records = []
    for lineno, data in parsed:
        record = parse_record(data, f"{path}:{lineno}")
        record._source = path.name
        records.append(record)
    return records


def parse_record(raw: Mapping[str, Any], where: str) -> ResultRecord:
    """One record, migrated (`schema.migrate_record`) and validated.

    A record without a required field (or whose id, status or schema_version cannot be read),
    of a schema_version newer than SCHEMA_VERSION, or with an impossible value (a rule of the
    schema: a mesh degree of 0, a negative time) raises CpbenchError naming `where`, the
    field, the value and the rule. A value of the wrong type (a hand-edited
    file: 2.5 mesh degrees, "false" for a bool) is read as missing: it becomes null where the
    field may be null, else the smallest section around it that may be null does, with one
    warning that names `where`, the fields and the values.
    """
    version = raw.get("schema_version")
    if type(version) is int and version > SCHEMA_VERSION:
        raise CpbenchError(
            f"{where}: schema_version {version} is newer than this cpbench reads "
            f"({SCHEMA_VERSION}): read it with a newer cpbench"
        )
    data = migrate_record(dict(raw))
    try:
        return ResultRecord.model_validate(data)
    except ValidationError as exc:
        first = exc
    for e in first.errors():
        if e["type"] == "impossible_mesh":  # the section is the value: name the rule alone
            raise CpbenchError(
                f"{where}: {_dotted(e['loc'])}: it must hold {e['msg']} (an impossible value: "
                f"correct or delete the line)"
            )
        if e["type"] in _IMPOSSIBLE:
            rule = e["msg"].removeprefix("Input should be ")
            raise CpbenchError(
                f"{where}: {_dotted(e['loc'])} is {_short(e['input'])}: it must be {rule} "
                f"(an impossible value: correct or delete the line)"
            )
    problems = [
        f"{_dotted(e['loc'])}: {e['msg']}"
        + ("" if e["type"] == "missing" else f" (got {_short(e['input'])})")
        for e in first.errors()
    ]
    missing = [e for e in first.errors() if e["type"] == "missing"]
    if missing:
        raise CpbenchError(
            f"{where}: not a results record: "
            + "; ".join(f"{_dotted(e['loc'])}: field required" for e in missing)
        )
    data = copy.deepcopy(data)
    nulled: list[tuple[str | int, ...]] = []
    error: ValidationError = first
    while True:
        path = _nullable_path(data, error.errors()[0]["loc"])
        if path is None:
            raise CpbenchError(f"{where}: not a results record: {'; '.join(problems)}")
        _set(data, path, None)
        nulled = [p for p in nulled if p[: len(path)] != path] + [path]
        try:
            record = ResultRecord.model_validate(data)
            break
        except ValidationError as exc:
            error = exc
    warnings.warn(
        f"{where}: read as missing: {', '.join(_dotted(p) for p in nulled)} "
        f"({'; '.join(problems)})",
        stacklevel=3,
    )
    return record


_IMPOSSIBLE = frozenset(
    ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
     "impossible_mesh")
)
"""Pydantic error types of a value of the right type that breaks a rule of the schema."""


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in loc)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _nullable_path(data: dict[str, Any], loc: Sequence[str | int]) -> tuple[str | int, ...] | None:
    """The path to null for an error at `loc`: the deepest part of `loc` present in `data`, or
    its parent when that is null already (null is not allowed there); None at the top."""
    path: list[str | int] = []
    node: Any = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
        path.append(part)
    if path and node is None:
        path.pop()
    return tuple(path) if path else None


def _set(data: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def status_summary(records: Sequence[Mapping[str, Any]]) -> str:
    """How many records, by status: '3 records (1 failed, 1 skipped, 1 timeout)'."""
    counts = {s: sum(r.get("status") == s for r in records) for s in STATUSES}
    parts = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    noun = "record" if len(records) == 1 else "records"
    return f"{len(records)} {noun}" + (f" ({parts})" if parts else "")


def completed_ids(path: Path) -> set[str]:
    """Ids of the records already in `path` (every status counts as done); empty when the
    file does not exist yet. Used by `cpbench sweep --resume`."""
    path = Path(path)
    if not path.exists():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {record.id for record in read_results(path)}


# --------------------------------------------------------------------------------- the frame


def records_frame(records: Iterable[ResultRecord | Mapping[str, Any]]) -> pd.DataFrame:
    """One row per record, flattened (see `COLUMNS`): configuration fields as top-level columns,
    status and error, timing (seconds), communication bytes (measured: max over ranks), memory
    (peak: max over ranks), FLOP/s, accuracy, the source file's name and the scenario. The mask
    is `mask` (its kind), `documents` (the lengths, a list, or None), `window`, `padding` and
    `run_seq_len` (older records: causal or full, no padding). A dict goes through `parse_record` first (as `read_records` gives them, or built in memory)."""
    rows = [_flatten(_typed(r)) for r in records]
    extra = sorted({k for row in rows for k in row} - set(COLUMNS))
    frame = pd.DataFrame(rows, columns=[*COLUMNS, *extra])
    for col in CONFIG_INT_COLUMNS:
        numbers = pd.to_numeric(frame[col].map(_int64), errors="coerce")
        # An out-of-range value in a hand-edited file becomes missing, not a crash.
        whole = numbers.where((numbers % 1 == 0) & (numbers.abs() < 2**62))
        frame[col] = whole.astype("Int64")
    for col in FLOAT_COLUMNS:
        frame[col] = pd.to_numeric(frame[col].map(_float), errors="coerce").astype("float64")
    frame["schema_version"] = pd.to_numeric(frame["schema_version"], errors="coerce").astype(
        "Int64"
    )
    booleans = (
        "causal",
        "comm_match",
        "comm_mismatch",
        "comm_fwd_mismatch",
        "comm_bwd_mismatch",
        "target_met",
    )
    for col in (*booleans, "accuracy_passed"):
        frame[col] = frame[col].map(lambda v: v if isinstance(v, bool) else pd.NA).astype("boolean")
    for col in (
        "per_rank_median_s",
        "compute_only_per_rank_s",
        "per_rank_work",
        "documents",
        "equivalent",
        "machine_warnings",
    ):
        frame[col] = frame[col].astype(object)
    return frame


def _int64(value: Any) -> Any:
    """An integer that fits the frame's Int64 columns as it is, a larger one None (anything
    else is left for `pd.to_numeric` to coerce)."""
    return None if type(value) is int and abs(value) >= 2**62 else value


def _float(value: Any) -> Any:
    """An integer as a float, None when too large for one (1e400 bytes)."""
    if type(value) is not int:
        return value
    try:
        return float(value)
    except OverflowError:
        return None


def _typed(record: ResultRecord | Mapping[str, Any]) -> ResultRecord:
    if isinstance(record, ResultRecord):
        return record
    data = {k: v for k, v in record.items() if k != SOURCE_KEY}
    typed = parse_record(data, f"record {record.get('id')!r}")
    source = record.get(SOURCE_KEY)
    typed._source = source if isinstance(source, str) else None
    return typed


def _max(values: Sequence[float | None] | None) -> float | None:
    """The largest of the values that are known (max over ranks); None without any, or when
    the largest is too large for a float (a 400-digit byte count: missing, not a crash)."""
    known = [v for v in values or () if v is not None]
    return _float(max(known)) if known else None


def _direction_mismatch(comm: CommSection | None, direction: PassKey) -> bool | None:
    """True when any rank's measured bytes of a direction differ from the analytic bytes;
    None when the record lacks either number."""
    if comm is None:
        return None
    expected = comm.analytic_bytes.get(direction)
    got = comm.measured_bytes.get(direction)
    if expected is None or got is None:
        return None
    return any(v != expected for v in got)


def _mismatch(comm: CommSection | None) -> bool | None:
    """True when any rank's measured bytes differ from the analytic bytes in a direction (or
    the record says they do not match); None when the record has no communication counts."""
    flags = [_direction_mismatch(comm, d) for d in ("fwd", "bwd")]
    match = comm.match if comm is not None else None
    if match is not None:
        return any(f is True for f in flags) or not match
    known = [f for f in flags if f is not None]
    return any(known) if known else None


def _flatten(record: ResultRecord) -> dict[str, Any]:
    config, timing, comm = record.config, record.timing, record.comm
    memory, flops, accuracy, env = record.memory, record.flops, record.accuracy, record.environment

    row: dict[str, Any] = {}
    if config is not None:
        for key, value in config.model_dump(mode="json").items():
            if key not in COLUMNS or key in CONFIG_INT_COLUMNS or key in _CONFIG_TEXT:
                row[key] = value
        row["documents"] = list(config.documents) if config.documents is not None else None
        row["mesh"] = f"U{config.ulysses}xR{config.ring}"
    else:
        row.update(mesh=None, phase=timing.phase if timing is not None else None)
    row.update(
        id=record.id,
        source=record.source,
        scenario=record.scenario,
        timestamp=record.timestamp,
        status=record.status,
        error=record.error,
        schema_version=record.schema_version,
    )
    if timing is not None:
        interval = timing.interval()
        row.update(
            ci_low_s=interval.low,
            ci_high_s=interval.high,
            relative_width=interval.relative_width if interval.median > 0 else None,
            iterations=timing.iterations or len(timing.samples),
            target_met=timing.target_met,
            overlap_status=timing.overlap_status,
            overlap_low=timing.overlap_low,
            overlap_high=timing.overlap_high,
            median_s=timing.median,
            p10_s=timing.p10,
            p90_s=timing.p90,
            compute_only_s=timing.compute_only,
            comm_only_s=timing.comm_only,
            exposed_comm_s=timing.exposed_comm,
            overlap=timing.overlap,
            per_rank_median_s=list(timing.per_rank_median or ()) or None,
            compute_only_per_rank_s=list(timing.compute_only_per_rank or ()) or None,
        )
    if comm is not None:
        row.update(
            analytic_fwd_bytes=comm.analytic_bytes.get("fwd"),
            analytic_bwd_bytes=comm.analytic_bytes.get("bwd"),
            measured_fwd_bytes=_max(comm.measured_bytes.get("fwd")),
            measured_bwd_bytes=_max(comm.measured_bytes.get("bwd")),
            busbw_GBps=comm.achieved_busbw_GBps,
            comm_match=comm.match,
        )
    if memory is not None:
        row.update(
            peak_bytes=_max(memory.peak_bytes),
            analytic_peak_bytes=memory.analytic_peak_bytes,
            rss_peak_bytes=_max(memory.rss_peak_bytes),
            memory_source=memory.source,
        )
    if flops is not None:
        row.update(
            flops_global=flops.global_flops,
            achieved_tflops=flops.achieved_tflops,
            achieved_tflops_per_rank=flops.achieved_tflops_per_rank,
            per_rank_work=list(flops.per_rank_work) if flops.per_rank_work else None,
        )
    if accuracy is not None:
        row.update(max_abs_error=accuracy.max_abs_error, accuracy_passed=accuracy.passed)
        if accuracy.sampled_rows is not None:
            row["sampled_rows_error"] = accuracy.sampled_rows.max_abs_error
    row["equivalent"] = list(config.equivalent) if config and config.equivalent else None
    machine = env.machine if env is not None else None
    row["machine_warnings"] = list(machine.warnings) if machine and machine.warnings else None
    devices = env.devices if env is not None else None
    row["devices"] = ", ".join(devices) if devices is not None else None
    external = config is not None and config.impl != "cpbench"
    if not (external and comm is not None and comm.match is None):
        # An external library's bytes next to cpbench's model get no verdict (cpbench.app.sweep).
        row.update(
            comm_mismatch=_mismatch(comm),
            comm_fwd_mismatch=_direction_mismatch(comm, "fwd"),
            comm_bwd_mismatch=_direction_mismatch(comm, "bwd"),
        )
    for key in FLOAT_COLUMNS:
        value = row.get(key)
        if isinstance(value, float) and math.isinf(value):
            row[key] = None
    return row
