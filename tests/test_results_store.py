"""The JSONL results store: append + fsync, torn last lines, errors that name file and line,
completed ids for --resume, the typed record (round trip, migration of version 1 records,
required fields, odd values) and the flattened pandas frame (round trip through JSONL)."""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from cpbench.errors import CpbenchError
from cpbench.results import store as results
from cpbench.results.schema import (
    SCHEMA_VERSION,
    ResultRecord,
    TimingSection,
    dump_record,
    migrate_record,
)
from cpbench.results.store import (
    SOURCE_KEY,
    append_record,
    completed_ids,
    read_records,
    read_results,
    records_frame,
)
from tests.fixtures import make_fixtures

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def fixture_records() -> list[dict]:
    return read_records(FIXTURES / "sweep.jsonl")


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != SOURCE_KEY}


def _sample(fixture_records: list[dict], n: int = 3) -> list[dict]:
    return [_strip(copy.deepcopy(r)) for r in fixture_records[:n]]


def _line(fixture_records: list[dict], record_id: str, **extra: object) -> str:
    """One JSONL line: the first fixture record under another id, with extra top-level keys."""
    record = dict(_strip(copy.deepcopy(fixture_records[0])), id=record_id, **extra)
    return json.dumps(record) + "\n"


# ---------------------------------------------------------------------------------- writing


def test_append_creates_folders_writes_one_line_each_and_fsyncs(
    tmp_path: Path, fixture_records: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(results.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "deep" / "er" / "run.jsonl"
    records = _sample(fixture_records)
    for record in records:
        append_record(path, record)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and len(synced) == 3
    assert [json.loads(line) for line in lines] == records
    assert [_strip(r) for r in read_records(path)] == records


def test_append_rejects_what_json_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(CpbenchError, match="not JSON serialisable"):
        append_record(tmp_path / "r.jsonl", {"id": "x", "bad": object()})
    assert not (tmp_path / "r.jsonl").exists() or (tmp_path / "r.jsonl").read_text() == ""


def test_append_after_a_crash_drops_the_torn_fragment(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    path = tmp_path / "r.jsonl"
    first, second = _sample(fixture_records, 2)
    append_record(path, first)
    with path.open("a") as f:
        f.write('{"id": "half-writ')  # the crash
    with pytest.warns(UserWarning, match="dropping a torn last line"):
        append_record(path, second)
    assert [r["id"] for r in read_records(path)] == [first["id"], second["id"]]


def test_append_completes_a_whole_record_that_lacks_its_newline(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    path = tmp_path / "r.jsonl"
    first, second = _sample(fixture_records, 2)
    path.write_text(json.dumps(first))  # no trailing newline, but a complete record
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        append_record(path, second)
    assert [r["id"] for r in read_records(path)] == [first["id"], second["id"]]


# ---------------------------------------------------------------------------------- reading


def test_torn_last_line_is_skipped_with_a_warning(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    path = tmp_path / "r.jsonl"
    records = _sample(fixture_records, 2)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"id": "torn", "sta')
    with pytest.warns(UserWarning, match=r"r\.jsonl:3: skipping a torn last line"):
        got = read_records(path)
    assert [r["id"] for r in got] == [r["id"] for r in records]


def test_torn_last_line_followed_by_blank_lines_is_still_the_last(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(_line(fixture_records, "a") + '\n{"id": \n\n   \n')
    with pytest.warns(UserWarning, match="torn"):
        assert [r["id"] for r in read_records(path)] == ["a"]


def test_malformed_line_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": oops}\n{"id": "c"}\n')
    with pytest.raises(CpbenchError, match=r"bad\.jsonl:3: malformed results line"):
        read_records(path)


def test_a_line_that_is_not_an_object_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text('[1, 2]\n{"id": "b"}\n')
    with pytest.raises(CpbenchError, match=r"list\.jsonl:1: a results line must be a JSON object"):
        read_records(path)


def test_missing_file_and_folder_are_named(tmp_path: Path) -> None:
    with pytest.raises(CpbenchError, match=r"results file .*nope\.jsonl does not exist"):
        read_records(tmp_path / "nope.jsonl")
    with pytest.raises(CpbenchError, match="is a directory"):
        read_records(tmp_path)


def test_blank_lines_unknown_fields_and_several_files(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n" + _line(fixture_records, "1", future_field={"x": [1, 2]}) + "\n")
    config = dict(fixture_records[0]["config"], new_knob=7)
    b.write_text(_line(fixture_records, "2") + _line(fixture_records, "3", config=config))
    got = read_records([a, str(b)])
    assert [r["id"] for r in got] == ["1", "2", "3"]
    assert got[0]["future_field"] == {"x": [1, 2]}
    assert [r[SOURCE_KEY] for r in got] == ["a.jsonl", "b.jsonl", "b.jsonl"]
    frame = records_frame(got)
    assert list(frame["id"]) == ["1", "2", "3"]
    assert frame.loc[2, "new_knob"] == 7  # unknown config fields become columns


def test_completed_ids_counts_every_status_and_tolerates_a_torn_tail(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    path = tmp_path / "r.jsonl"
    assert completed_ids(path) == set()  # a new sweep
    statuses = {r["status"] for r in fixture_records}
    assert statuses == {"ok", "failed", "skipped", "timeout"}
    for record in fixture_records:
        append_record(path, _strip(record))
    with path.open("a") as f:
        f.write('{"id": "not-done"')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning leaks out of completed_ids
        done = completed_ids(path)
    assert done == {r["id"] for r in fixture_records}
    assert "not-done" not in done


# ------------------------------------------------------------------------------------ frame


def test_frame_flattens_config_timing_comm_memory_flops_accuracy(
    fixture_records: list[dict],
) -> None:
    frame = records_frame(fixture_records)
    assert len(frame) == len(fixture_records) == 45
    assert frame["source"].unique().tolist() == ["sweep.jsonl"]
    assert frame["scenario"].unique().tolist() == ["cpu-smoke"]
    first = fixture_records[0]
    row = frame.iloc[0]
    assert row["seq_len"] == first["config"]["seq_len"]
    assert row["mesh"] == "U4xR1"
    assert row["layout"] == "contiguous" and row["phase"] == "fwd"
    assert row["median_s"] == pytest.approx(first["timing"]["median"])
    assert row["compute_only_s"] == pytest.approx(first["timing"]["compute_only"])
    assert row["overlap"] == pytest.approx(first["timing"]["overlap"])
    assert row["peak_bytes"] == max(first["memory"]["peak_bytes"])
    assert row["analytic_peak_bytes"] == first["memory"]["analytic_peak_bytes"]
    assert row["achieved_tflops"] == pytest.approx(first["flops"]["achieved_tflops"])
    assert row["max_abs_error"] == pytest.approx(first["accuracy"]["max_abs_error"])
    assert row["per_rank_median_s"] == first["timing"]["per_rank_median"]
    assert row["devices"].startswith("cpu: AMD EPYC")


def test_frame_takes_the_max_over_ranks_and_flags_a_mismatch(fixture_records: list[dict]):
    frame = records_frame(fixture_records).set_index("id")
    bad = next(
        r for r in fixture_records if isinstance(r.get("comm"), dict) and not r["comm"]["match"]
    )
    row = frame.loc[bad["id"]]
    assert row["measured_bwd_bytes"] == max(bad["comm"]["measured_bytes"]["bwd"])
    assert row["measured_bwd_bytes"] == row["analytic_bwd_bytes"] + 4096
    assert row["comm_mismatch"] and row["comm_bwd_mismatch"] and not row["comm_fwd_mismatch"]
    assert frame["comm_mismatch"].sum() == 1


def test_mismatch_from_a_rank_that_sent_less_is_seen(fixture_records: list[dict]) -> None:
    record = _strip(copy.deepcopy(fixture_records[1]))
    record["comm"]["measured_bytes"]["fwd"][0] -= 8  # max over ranks still equals analytic
    record["comm"]["match"] = None
    row = records_frame([record]).iloc[0]
    assert row["measured_fwd_bytes"] == row["analytic_fwd_bytes"]
    assert row["comm_fwd_mismatch"] and row["comm_mismatch"]


def test_frame_of_failures_has_missing_measurements(fixture_records: list[dict]) -> None:
    frame = records_frame(fixture_records)
    bad = frame[frame["status"] != "ok"]
    assert sorted(bad["status"]) == ["failed", "skipped", "timeout"]
    assert bad["median_s"].isna().all() and bad["peak_bytes"].isna().all()
    assert bad["error"].notna().all()
    assert bad["comm_mismatch"].isna().all()


def test_empty_frame_has_every_column() -> None:
    frame = records_frame([])
    assert frame.empty
    assert set(results.COLUMNS) <= set(frame.columns)


def test_jsonl_round_trip_through_pandas(tmp_path: Path, fixture_records: list[dict]) -> None:
    path = tmp_path / "round.jsonl"
    originals = [_strip(r) for r in fixture_records]
    for record in originals:
        append_record(path, record)
    frame = records_frame(read_records(path))

    # dtypes: nullable integers for the configuration, float64 for measurements
    for col in ("seq_len", "ulysses", "ring", "world_size", "heads", "kv_heads"):
        assert str(frame[col].dtype) == "Int64", col
    for col in ("median_s", "p10_s", "measured_fwd_bytes", "peak_bytes", "achieved_tflops"):
        assert frame[col].dtype == "float64", col
    assert str(frame["causal"].dtype) == "boolean"
    assert str(frame["comm_mismatch"].dtype) == "boolean"

    # pandas' own JSONL reader sees the same records
    direct = pd.read_json(path, lines=True)
    assert list(direct["id"]) == list(frame["id"])
    assert list(direct["status"]) == list(frame["status"])
    config = pd.json_normalize(direct["config"].tolist())
    assert config["seq_len"].tolist() == frame["seq_len"].astype(int).tolist()
    timing = direct["timing"].map(lambda t: t["median"] if isinstance(t, dict) else None)
    ok = frame["status"] == "ok"
    assert timing[ok].tolist() == pytest.approx(frame.loc[ok, "median_s"].tolist())

    # the flat frame survives pandas' JSONL writer and reader
    flat = frame.drop(columns=["per_rank_median_s", "compute_only_per_rank_s"])
    flat.to_json(tmp_path / "flat.jsonl", orient="records", lines=True)
    again = pd.read_json(tmp_path / "flat.jsonl", lines=True)
    assert list(again["id"]) == list(flat["id"])
    assert again["median_s"].tolist() == pytest.approx(flat["median_s"].tolist(), nan_ok=True)
    assert again["seq_len"].tolist() == flat["seq_len"].astype(int).tolist()


# ------------------------------------------------------------------------------ typed record


def test_a_record_round_trips_through_the_model(tmp_path: Path) -> None:
    record = make_fixtures.ok_record(2048, 2, 2, "zigzag", "fwd+bwd")
    data = dump_record(record)
    assert data["flops"]["global"] == record.flops.global_flops  # type: ignore[union-attr]
    assert ResultRecord.model_validate(data) == record
    path = tmp_path / "one.jsonl"
    append_record(path, record)
    (again,) = read_results(path)
    assert again.source == "one.jsonl"
    assert again.model_dump() == record.model_dump()
    assert json.loads(path.read_text()) == data == _strip(read_records(path)[0])


def test_a_version_1_record_before_the_impl_axis_migrates(tmp_path: Path) -> None:
    """The fixture record predates the impl axis and the busbw rename: read, it is cpbench's
    own and its bandwidth has today's name, with the same value; nothing else changes."""
    raw = json.loads((FIXTURES / "v1-before-impl.jsonl").read_text())
    assert raw["schema_version"] == 1 and SCHEMA_VERSION == 4
    assert "impl" not in raw["config"] and "achieved_busbw_GBps" not in raw["comm"]
    (record,) = read_records(FIXTURES / "v1-before-impl.jsonl")
    assert record["config"]["impl"] == "cpbench"
    assert record["comm"]["achieved_busbw_GBps"] == raw["comm"]["achieved_algbw_GBps"]
    assert "achieved_algbw_GBps" not in record["comm"]
    raw["config"]["impl"] = "cpbench"
    raw["comm"]["achieved_busbw_GBps"] = raw["comm"].pop("achieved_algbw_GBps")
    assert _strip(record) == raw
    assert migrate_record(_strip(record)) == _strip(record)  # idempotent
    row = records_frame([record]).iloc[0]
    assert row["busbw_GBps"] == pytest.approx(raw["comm"]["achieved_busbw_GBps"], rel=1e-12)


def test_the_fixture_files_are_what_the_model_built_generator_writes() -> None:
    """tests/fixtures/*.jsonl (version 1, migrated on reading) equal make_fixtures' records."""
    for name, expected in (("sweep", make_fixtures.sweep()), ("after", make_fixtures.after())):
        got = read_results(FIXTURES / f"{name}.jsonl")
        assert [r.model_dump() for r in got] == [r.model_dump() for r in expected], name


def test_a_record_without_a_required_field_is_rejected_naming_it(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    record = _strip(copy.deepcopy(fixture_records[0]))
    del record["status"]
    path = tmp_path / "r.jsonl"
    path.write_text(_line(fixture_records, "a") + json.dumps(record) + "\n")
    with pytest.raises(CpbenchError, match=r"r\.jsonl:2: not a results record: status: field"):
        read_records(path)
    del record["timing"]["median"]
    record["status"] = "ok"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(CpbenchError, match=r"r\.jsonl:1: .*timing\.median: field required"):
        read_results(path)
    unreadable_id = dict(_strip(fixture_records[0]), id=7)
    with pytest.raises(CpbenchError, match=r"record 7: .*id: Input should be a valid string"):
        records_frame([unreadable_id])


def test_odd_values_are_read_as_missing_with_a_warning(
    tmp_path: Path, fixture_records: list[dict]
) -> None:
    record = _strip(copy.deepcopy(fixture_records[0]))
    record["timing"]["overlap"] = "high"  # may be null: only the value goes
    record["memory"]["peak_bytes"][1] = "lots"  # may not be null: the list goes
    record["flops"]["achieved_tflops"] = True  # not a number; required: the section goes
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.warns(UserWarning, match=r"odd\.jsonl:1: read as missing: ") as caught:
        (got,) = read_records(path)
    message = str(caught[0].message)
    assert "timing.overlap, memory.peak_bytes, flops (" in message
    assert "memory.peak_bytes.1: Input should be a valid integer (got 'lots')" in message
    assert got["timing"]["overlap"] is None and got["memory"]["peak_bytes"] is None
    assert got["flops"] is None
    assert got["timing"]["median"] == record["timing"]["median"]  # the rest is kept
    assert got["memory"]["analytic_peak_bytes"] == record["memory"]["analytic_peak_bytes"]


def test_the_writer_rejects_a_wrong_shape() -> None:
    record = make_fixtures.ok_record(1024, 4, 1, "contiguous", "fwd")
    assert record.config is not None
    with pytest.raises(ValidationError, match="status"):
        record.status = "done"  # type: ignore[assignment]
    with pytest.raises(ValidationError, match="median"):
        TimingSection.model_validate({"phase": "fwd", "median": "fast"})
    with pytest.raises(ValidationError, match="causal"):
        record.config.causal = "yes"  # type: ignore[assignment]
    assert record.status == "ok" and record.config.causal is True


def test_a_version_2_record_before_the_inference_phases_reads_as_version_3(tmp_path: Path) -> None:
    """Version 3 added only optional inference fields: a version-2 training record reads as the
    same record (its version as written)."""
    text = (FIXTURES / "sweep.jsonl").read_text()
    current = f'"schema_version":{SCHEMA_VERSION}'
    assert current in text

    def without_version(path: Path) -> list[dict]:
        return [r.model_dump(exclude={"schema_version"}) for r in read_results(path)]

    for version in (2, 3):  # version 4 added only the optional dynamic section
        old = tmp_path / f"v{version}.jsonl"
        old.write_text(text.replace(current, f'"schema_version":{version}'))
        assert without_version(old) == without_version(FIXTURES / "sweep.jsonl")
