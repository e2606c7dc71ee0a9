"""Hostile files given to the readers (issue 39): each gives a correct answer, or one line
naming the file, the value and the rule with exit 2; never a traceback, never a false verdict."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpbench.cli.main import app
from cpbench.config.documents import resolve_documents
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.table import read_table_rows
from cpbench.model.hardware.loading import load_profile
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.schema import SCHEMA_VERSION
from cpbench.results.store import completed_ids, read_records, records_frame

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures"
LINES = (FIXTURES / "sweep.jsonl").read_text().splitlines()
GOOD = next(line for line in LINES if '"status":"ok"' in line)
RECOMMEND = ["recommend", "--heads", "8", "--kv-heads", "2", "--seq-len", "1024", "--gpus", "4"]


def _good() -> dict[str, Any]:
    return json.loads(GOOD)


def _commands(path: str) -> list[list[str]]:
    """Every command that reads a results file, on `path`."""
    return [
        ["report", path, "-o", str(Path(path).with_suffix(".html"))],
        ["compare", str(FIXTURES / "sweep.jsonl"), path],
        ["calibrate", path],
        ["validate", path],
        [*RECOMMEND, "--results", path],
    ]


def _one_line_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert message in result.stderr, (args, result.stderr)
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


HOSTILE_LINES = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    "deep object": ('{"a":' * 2_000 + "1" + "}" * 2_000, "nested deeper than"),
    "long integer": ('{"schema_version":' + "9" * 5_000 + "}", "a number of more than 4300 digits"),
}


@pytest.mark.torch_free
@pytest.mark.parametrize("kind", sorted(HOSTILE_LINES))
@pytest.mark.parametrize("last", [False, True], ids=["middle", "last"])
def test_a_hostile_results_line_is_one_line_and_exit_2(
    tmp_path: Path, kind: str, last: bool
) -> None:
    line, message = HOSTILE_LINES[kind]
    path = tmp_path / "r.jsonl"
    lines = [GOOD, line] if last else [line, GOOD]
    path.write_text("\n".join(lines) + "\n")
    for args in _commands(str(path)):
        _one_line_exit_2(args, f"{path}:{lines.index(line) + 1}: {message}")
    with pytest.raises(CpbenchError, match=message):
        completed_ids(path)  # sweep --resume


def test_sweep_resume_on_a_hostile_file_exits_2_before_measuring(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(GOOD + "\n" + HOSTILE_LINES["deep"][0] + "\n")
    before = path.read_bytes()
    _one_line_exit_2(["sweep", "cpu-smoke", "--out", str(path), "--resume"], "nested deeper")
    assert path.read_bytes() == before


@pytest.mark.torch_free
def test_a_400_digit_seq_len_is_refused_naming_the_field(tmp_path: Path) -> None:
    record = _good()
    record["config"]["seq_len"] = int("9" * 400)
    path = tmp_path / "r.jsonl"
    path.write_text(GOOD + "\n" + json.dumps(record) + "\n")
    for args in _commands(str(path)):
        _one_line_exit_2(args, f"{path}:2: config.seq_len")


@pytest.mark.torch_free
def test_records_frame_makes_an_out_of_range_number_missing() -> None:
    """The frame of records built in memory: a number too large for a column is missing."""
    from cpbench.results.schema import ResultRecord  # noqa: PLC0415

    record = ResultRecord.model_validate(_good())
    assert record.comm is not None
    record.comm.analytic_bytes["fwd"] = int("9" * 400)
    frame = records_frame([record])
    assert frame["analytic_fwd_bytes"].isna().all()
    # per-rank values take their max first (the fuzz run found this one: OverflowError)
    assert record.memory is not None and record.comm.measured_bytes
    record.memory.rss_peak_bytes = [int("9" * 400), 1]
    record.comm.measured_bytes["bwd"] = [int("9" * 400)]
    frame = records_frame([record])
    assert frame["rss_peak_bytes"].isna().all() and frame["measured_bwd_bytes"].isna().all()


@pytest.mark.torch_free
@pytest.mark.parametrize(
    ("path", "value", "rule"),
    [
        (("config", "ulysses"), 0, "greater than or equal to 1"),
        (("config", "seq_len"), -5, "greater than or equal to 1"),
        (("timing", "median"), -0.5, "greater than 0"),
        (("timing", "median"), 0.0, "greater than 0"),  # a step takes time
        (("timing", "median"), float("inf"), "a finite number"),
        (("timing", "samples", 0), -1.0, "greater than or equal to 0"),
    ],
)
def test_an_impossible_value_is_refused_naming_line_field_and_rule(
    tmp_path: Path, path: tuple[Any, ...], value: Any, rule: str
) -> None:
    record = _good()
    node = record
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    file = tmp_path / "r.jsonl"
    file.write_text(GOOD + "\n" + json.dumps(record) + "\n")
    field = ".".join(str(p) for p in path)
    for args in _commands(str(file)):
        _one_line_exit_2(args, f"{file}:2: {field} is {value}: it must be {rule}")


@pytest.mark.torch_free
def test_a_newer_schema_version_names_both_versions(tmp_path: Path) -> None:
    record = _good()
    record["schema_version"] = 999
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    message = f"{path}:1: schema_version 999 is newer than this cpbench reads ({SCHEMA_VERSION})"
    for args in _commands(str(path)):
        _one_line_exit_2(args, message)


@pytest.mark.torch_free
def test_valid_records_still_read_as_written() -> None:
    """The constraints refuse nothing cpbench writes: every fixture reads, and a current
    record reads back as its line."""
    # the results files among the fixtures (the *_json.jsonl ones are golden CLI documents)
    for path in sorted(p for p in FIXTURES.glob("*.jsonl") if not p.stem.endswith("_json")):
        assert read_records(path)
    for record, line in zip(read_records(FIXTURES / "sweep.jsonl"), LINES, strict=True):
        record.pop("_source")
        assert record == json.loads(line)


# ------------------------------------------------------------------ calibrate and validate


@pytest.mark.torch_free
@pytest.mark.parametrize("command", ["calibrate", "validate"])
def test_calibrate_on_a_directory_or_random_bytes(tmp_path: Path, command: str) -> None:
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    _one_line_exit_2([command, str(folder)], f"{folder} is a directory")
    noise = tmp_path / "noise.jsonl"
    noise.write_bytes(bytes(range(256)) * 8)
    _one_line_exit_2([command, str(noise)], str(noise))
    table = tmp_path / "noise.csv"
    table.write_bytes(b"seq_len,heads\n\xff\xfe\x00\x81" * 50)
    _one_line_exit_2([command, str(table)], f"{table} is not UTF-8 text")
    csv_folder = tmp_path / "folder.csv"
    csv_folder.mkdir()
    _one_line_exit_2([command, str(csv_folder)], f"{csv_folder} is a directory")


@pytest.mark.torch_free
def test_calibrate_reports_the_records_it_did_not_use(tmp_path: Path) -> None:
    result = runner.invoke(app, ["calibrate", str(FIXTURES / "sweep.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert any("not used" in w and "1 failed" in w and "1 skipped" in w for w in warnings), warnings


@pytest.mark.torch_free
def test_calibrate_with_no_usable_record_says_how_many_and_their_statuses(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(line + "\n" for line in LINES if '"status":"ok"' not in line))
    _one_line_exit_2(["calibrate", str(path)], "3 records (1 failed, 1 skipped, 1 timeout)")


# ------------------------------------------------------------------------------- recommend


@pytest.mark.torch_free
def test_recommend_results_without_a_usable_record_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(line + "\n" for line in LINES if '"status":"ok"' not in line))
    _one_line_exit_2(
        [*RECOMMEND, "--results", str(path)],
        f"no usable record in {path}: 3 records (1 failed, 1 skipped, 1 timeout)",
    )


# ------------------------------------------------------------------ byte-order marks, --out


@pytest.mark.torch_free
def test_a_byte_order_mark_is_read_not_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n")
    records = read_records(path)  # no warning
    assert [r["id"] for r in records] == [_good()["id"]]
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "torn" not in result.output


@pytest.mark.torch_free
def test_a_byte_order_mark_in_every_text_reader(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    table = Path("cpbench/data/published/cp_attention.csv")
    csv = tmp_path / "t.csv"
    csv.write_bytes(bom + table.read_bytes())
    assert len(read_table_rows(csv)) == len(read_table_rows(table))
    jsonl = tmp_path / "t.jsonl"
    row = {"seq_len": 8192, "heads": 8, "kv_heads": 8, "head_dim": 64, "ulysses": 1,
           "ring": 1, "gpu": "cpu", "step_s": 0.1}  # fmt: skip
    jsonl.write_bytes(bom + json.dumps(row).encode() + b"\n")
    assert len(read_table_rows(jsonl)) == 1
    documents = tmp_path / "docs.txt"
    documents.write_bytes(bom + b"512\n512\n")
    assert resolve_documents(str(documents), 1024) == (512, 512)
    as_json = tmp_path / "docs.json"
    as_json.write_bytes(bom + b"[512, 512]")
    assert resolve_documents(str(as_json), 1024) == (512, 512)
    scenario = tmp_path / "s.toml"
    builtin = Path("cpbench/data/cpu-smoke.toml").read_bytes()
    scenario.write_bytes(bom + builtin)
    assert load_scenario(str(scenario)).name == load_scenario("cpu-smoke").name
    profile = tmp_path / "p.toml"
    profile.write_bytes(bom + Path("cpbench/data/hardware/cpu-local.toml").read_bytes())
    assert load_profile(str(profile)).name == load_profile("cpu-local").name


def test_sweep_out_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "x").write_text("x")
    _one_line_exit_2(["sweep", "cpu-smoke", "--out", str(folder)], f"{folder} is a directory")


# --------------------------------------------------------- scenarios, profiles, documents


@pytest.mark.torch_free
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = " + "[" * 100_000 + "]" * 100_000, "nested deeper than"),
        ("a = " + "{b = " * 5_000 + "1" + "}" * 5_000, "nested deeper than"),
        ("a = " + "9" * 5_000, "more than 4300 digits"),
    ],
)
def test_a_hostile_toml_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(CpbenchError, match=message):
        load_scenario(str(path))
    with pytest.raises(CpbenchError, match=message):
        load_profile(str(path))
    _one_line_exit_2(["sweep", str(path)], message)


@pytest.mark.torch_free
def test_documents_file_of_random_bytes_or_deep_json(tmp_path: Path) -> None:
    noise = tmp_path / "docs.txt"
    noise.write_bytes(os.urandom(64) + b"\xff\xfe")
    with pytest.raises(CpbenchError, match="is not UTF-8 text"):
        resolve_documents(str(noise), 1024)
    deep = tmp_path / "docs.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CpbenchError, match="nested deeper than"):
        resolve_documents(str(deep), 1024)
    long = tmp_path / "long.txt"
    long.write_text("9" * 5_000 + "\n")
    with pytest.raises(CpbenchError, match=r"'99999.*\(5000 characters\)' is not a document"):
        resolve_documents(str(long), 1024)


@pytest.mark.torch_free
def test_a_huge_world_size_in_a_scenario_is_refused_at_once(tmp_path: Path) -> None:
    """A world of 400 digits was factorized rank by rank: the loader never returned."""
    text = Path("cpbench/data/cpu-smoke.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(text.replace("world_size = 4", "world_size = " + "9" * 400))
    with pytest.raises(CpbenchError, match="key 'world_size': 9+ ranks is more than 1048576"):
        load_scenario(str(path))


@pytest.mark.torch_free
def test_a_documents_line_is_echoed_as_written_not_as_emoji(tmp_path: Path) -> None:
    """rich turned `:rocket:` of a bad documents line into a rocket: the message must show
    the line as the file has it."""
    path = tmp_path / "docs.txt"
    path.write_text(":rocket: 12\n")
    args = [*RECOMMEND, "--documents", str(path)]
    _one_line_exit_2(args, f"{path}:1: ':rocket: 12' is not a document length")
    assert "\U0001f680" not in runner.invoke(app, args).output


def test_markup_in_the_out_path_is_printed_as_written(tmp_path: Path, lend_the_session_pool: None) -> None:  # type: ignore[no-untyped-def]
    """A `--out` of `a[/red]b.jsonl` crashed the summary line with rich's MarkupError (exit 1,
    a traceback) after the record was written."""
    folder = tmp_path / "a["
    folder.mkdir()
    out = folder / "x[/red]y.jsonl"
    result = runner.invoke(app, ["run", "--heads", "4", "--seq-len", "64", "--head-dim", "16",
                                 "--ring", "2", "--warmup", "0", "--iters", "1", "--precision",
                                 "off", "--device", "cpu", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert str(out) in result.stdout.replace("\n", "")
    assert len(read_records(out)) == 1


@pytest.mark.torch_free
def test_a_scenario_named_by_its_file_gets_a_plain_name(tmp_path: Path) -> None:
    """No `name` key: the file's stem names the output; `x[red]y` reached the file name and
    the console (which swallowed `[red]`) unchecked."""
    path = tmp_path / "x[red]y.toml"
    path.write_text(Path("cpbench/data/cpu-smoke.toml").read_text().replace(
        'name = "cpu-smoke"', ""))  # fmt: skip
    assert load_scenario(str(path)).name == "x-red-y"


@pytest.mark.torch_free
def test_report_never_writes_over_a_results_file(tmp_path: Path) -> None:
    """`report a.jsonl -o b.jsonl` wrote the page over another results file."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(_good()) + "\n")
    b.write_text(json.dumps(_good()) + "\n")
    before = b.read_text()
    _one_line_exit_2(["report", str(a), "-o", str(b)], "is an existing results file (.jsonl)")
    assert b.read_text() == before


@pytest.mark.torch_free
def test_a_mesh_that_is_not_the_world_is_refused(tmp_path: Path) -> None:
    """ring 3 on a world of 2 was read, then silently left out of calibrate and validate."""
    record = _good()
    record["config"]["ring"] = 3 * record["config"]["ring"]
    file = tmp_path / "r.jsonl"
    file.write_text(GOOD + "\n" + json.dumps(record) + "\n")
    c = record["config"]
    for args in _commands(str(file)):
        _one_line_exit_2(args, f"{file}:2: config: it must hold ulysses x ring = world_size "
                               f"({c['ulysses']} x {c['ring']} = {c['ulysses'] * c['ring']}, "
                               f"not {c['world_size']})")
