"""Generated and mutated files for every reader of a user's file, and the check each reader
must pass on them (tests/test_fuzz_readers.py; the long run: benchmarks/fuzz_readers.py).

A reader gives a valid parse or a CpbenchError, never another exception, and writes nothing
but the output it was named."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from typer.testing import CliRunner

from cpbench.cli.main import app
from cpbench.config.documents import resolve_documents
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.measurements import measurements_from_records
from cpbench.model.calibrate.table import is_table, measurements_from_table
from cpbench.model.hardware.loading import load_profile
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.store import completed_ids, read_records, records_frame, take_inflight

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
RESULTS_LINES = [
    line
    for name in ("sweep.jsonl", "after.jsonl", "v1-before-impl.jsonl")
    for line in (FIXTURES / name).read_text().splitlines()
    if line.strip()
]
SCENARIO = (ROOT / "cpbench/data/cpu-smoke.toml").read_text()
PROFILES = [
    (ROOT / f"cpbench/data/hardware/{n}.toml").read_text() for n in ("cpu-local", "h100-sxm")
]
TABLE = (ROOT / "cpbench/data/published/cp_attention.csv").read_text()
TABLE_ROW = {
    "seq_len": 8192, "heads": 8, "kv_heads": 8, "head_dim": 64, "batch": 1, "mask": "causal",
    "ulysses": 2, "ring": 2, "layout": "zigzag", "gpu": "cpu", "step_s": 0.1,
    "documents": "4096+4096", "window": 512,
}  # fmt: skip

# ------------------------------------------------------------------------------ values

_HUGE = st.integers(min_value=2**62, max_value=10**400)
LONG = "<a number of 5000 digits>"
"""Written as 5000 nines by `_json_text` (hypothesis cannot show such an integer)."""
INTEGERS = st.integers(-3, 70_000) | st.sampled_from([0, -1, 2**31, 2**63]) | _HUGE
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 1e308, -1e-9])
SCALARS = (
    st.none() | st.booleans() | INTEGERS | FLOATS | st.text(max_size=12)
    | st.sampled_from(["ok", "failed", "fwd", "zigzag", "causal", "cpu", "nan", "1e999", LONG])
)  # fmt: skip
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


def _json_text(value: Any) -> str:
    """JSON text of a value, huge integers written out (json.dumps refuses over the limit)."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if value == LONG:
        return "9" * 5000
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return "{" + ",".join(f"{json.dumps(str(k))}:{_json_text(v)}" for k, v in value.items()) + "}"


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_json(draw: st.DrawFn, base: Any) -> str:
    """`base` with one to three values replaced or deleted, as JSON text."""
    data = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        node = data
        for part in path[:-1]:
            node = node[part]
        if isinstance(node, dict) and draw(st.booleans()) and draw(st.booleans()):
            del node[path[-1]]
        else:
            node[path[-1]] = draw(JSON_VALUES)
    return _json_text(data)


@st.composite
def mutated_bytes(draw: st.DrawFn, text: str) -> bytes:
    """`text` as UTF-8 with a byte-level mutation: cut, spliced bytes, a BOM, deep nesting."""
    data = text.encode()
    kind = draw(st.sampled_from(["cut", "splice", "bom", "deep", "flip", "same"]))
    at = draw(st.integers(0, len(data)))
    if kind == "cut":
        return data[:at]
    if kind == "splice":
        return data[:at] + draw(st.binary(max_size=16)) + data[at + draw(st.integers(0, 8)) :]
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "deep":
        depth = draw(st.sampled_from([65, 999, 5_000, 100_000]))
        return data[:at] + b"[" * depth + b"]" * depth + data[at:]
    if kind == "flip" and data:
        i = min(at, len(data) - 1)
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    return data


# ------------------------------------------------------------------------------- files


@st.composite
def results_files(draw: st.DrawFn) -> bytes:
    """A results file: fixture lines, some mutated as JSON or as bytes."""
    lines = draw(st.lists(st.sampled_from(RESULTS_LINES), min_size=1, max_size=4))
    out = []
    for line in lines:
        how = draw(st.sampled_from(["keep", "json", "bytes"]))
        if how == "json":
            out.append(draw(mutated_json(json.loads(line))).encode())
        elif how == "bytes":
            out.append(draw(mutated_bytes(line)))
        else:
            out.append(line.encode())
    return b"\n".join(out) + draw(st.sampled_from([b"\n", b""]))


TOML_LITERALS = st.one_of(
    st.sampled_from(
        ["[" * 2000 + "]" * 2000, "{ a = " * 600 + "1" + " }" * 600, "9" * 400, "9" * 5000]
    ),
    st.sampled_from(
        ["0", "-1", "1e999", "nan", "inf", '"x"', "true", "[]", "[0]", "[-5, 3]", "{}",
         "{ a = 1 }", "'../../x'", '"\\u202e"', "1979-05-27", "[[1], [2]]", "65", "1024",
         '"lognormal:mean=0"', '"uniform:min=5,max=1"']
    ),
    INTEGERS.map(str),
)  # fmt: skip
"""Values put in a TOML file or a CSV cell: hostile ones, odd ones, integers."""


@st.composite
def mutated_toml(draw: st.DrawFn, text: str) -> bytes:
    """A TOML text with one to three values replaced by other literals, or a byte mutation."""
    if draw(st.integers(0, 3)) == 0:
        return draw(mutated_bytes(text))
    lines = text.splitlines()
    assignments = [i for i, line in enumerate(lines) if "=" in line and not line.startswith("#")]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.sampled_from(assignments))
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {draw(TOML_LITERALS)}"
    return "\n".join(lines).encode()


DOCUMENT_LINES = INTEGERS.map(str) | st.sampled_from(
    ["", "# c", "x", "1.5", "-3", " 7 ", "9" * 5000]
)


@st.composite
def documents_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """(suffix, content) of a documents file: lengths one a line, or JSON."""
    if draw(st.booleans()):
        lines = draw(st.lists(DOCUMENT_LINES, max_size=6))
        return ".txt", draw(mutated_bytes("\n".join(lines)))
    value = draw(st.lists(INTEGERS, max_size=6) | JSON_VALUES)
    if draw(st.booleans()):
        value = {"lengths": value}
    return ".json", draw(mutated_bytes(_json_text(value)))


@st.composite
def table_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """(suffix, content) of a table of step times: the published CSV mutated, or JSONL rows."""
    if draw(st.booleans()):
        lines = TABLE.splitlines()[:4]
        header, rows = lines[0], [r.split(",") for r in lines[1:]]
        for _ in range(draw(st.integers(1, 3))):
            row = draw(st.sampled_from(rows))
            row[draw(st.integers(0, len(row) - 1))] = draw(TOML_LITERALS)
        text = "\n".join([header, *(",".join(r) for r in rows)])
        return ".csv", draw(mutated_bytes(text))
    return ".jsonl", draw(mutated_bytes(draw(mutated_json(TABLE_ROW))))


# ------------------------------------------------------------------------------ checks


def _quiet(call: Callable[[], Any]) -> None:
    """Run a reader: it returns or raises CpbenchError; any other exception fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call()
        except CpbenchError:
            pass


def files_in(folder: Path) -> set[Path]:
    """Every file under `folder`."""
    return {p for p in folder.rglob("*") if p.is_file()}


def check_results(folder: Path, content: bytes) -> None:
    path = folder / "r.jsonl"
    path.write_bytes(content)
    _quiet(lambda: records_frame(read_records(path)))
    _quiet(lambda: measurements_from_records(read_records(path)))
    _quiet(lambda: completed_ids(path))
    marker = folder / "o.jsonl.inflight"
    marker.write_bytes(content)
    _quiet(lambda: take_inflight(folder / "o.jsonl"))
    marker.unlink()


def check_scenario(folder: Path, content: bytes) -> None:
    path = folder / "s.toml"
    path.write_bytes(content)

    def read() -> None:
        scenario = load_scenario(str(path))
        world = 2 if scenario.world_size == "auto" else scenario.world_size
        if isinstance(world, int) and world <= 64:
            scenario.expand("cpu", world)

    _quiet(read)


def check_profile(folder: Path, content: bytes) -> None:
    path = folder / "p.toml"
    path.write_bytes(content)
    _quiet(lambda: load_profile(str(path)))


def check_documents(folder: Path, suffix: str, content: bytes) -> None:
    path = folder / f"docs{suffix}"
    path.write_bytes(content)
    _quiet(lambda: resolve_documents(str(path), 1024))


def check_table(folder: Path, suffix: str, content: bytes) -> None:
    path = folder / f"t{suffix}"
    path.write_bytes(content)
    _quiet(lambda: is_table(path) and measurements_from_table(path))


runner = CliRunner()


def check_cli(folder: Path, args: list[str], outputs: tuple[str, ...] = ()) -> None:
    """A command on the files of `folder`: exit 0 or 2, no traceback, no file but `outputs`."""
    before = files_in(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.invoke(app, args)
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output, result.output
    new = files_in(folder) - before
    assert new <= {folder / name for name in outputs}, (args, new)


RECOMMEND = ["recommend", "--heads", "8", "--kv-heads", "2", "--seq-len", "1024", "--gpus", "4"]


def check_results_commands(folder: Path, content: bytes) -> None:
    """A results file through report, validate and recommend --results."""
    path = folder / "r.jsonl"
    path.write_bytes(content)
    check_cli(folder, ["report", str(path), "-o", str(folder / "r.html")], ("r.html",))
    (folder / "r.html").unlink(missing_ok=True)
    check_cli(folder, ["validate", str(path)])
    check_cli(folder, [*RECOMMEND, "--results", str(path)])


def check_documents_command(folder: Path, file: tuple[str, bytes]) -> None:
    """A documents file through formulas --documents."""
    path = folder / f"docs{file[0]}"
    path.write_bytes(file[1])
    check_cli(folder, ["formulas", "--seq-len", "1024", "--documents", str(path)])
