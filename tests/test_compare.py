"""`cpbench compare BEFORE AFTER` and `report --compare`: the change per configuration with its
interval and a verdict; exit 1 on a significant regression beyond the threshold."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cpbench.app.compare import Comparison, ComparisonRow, compare_results
from cpbench.app.report import build_comparison
from cpbench.cli.main import app
from cpbench.render.tables import compare_table
from cpbench.results.store import read_records

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FIXTURES = Path(__file__).parent / "fixtures"
SWEEP, AFTER = FIXTURES / "sweep.jsonl", FIXTURES / "after.jsonl"
runner = CliRunner()


def test_verdicts_follow_the_intervals() -> None:
    result = compare_results(SWEEP, AFTER)
    matched = [r for r in result.rows if r.verdict is not None]
    assert len(matched) == result.matched == 7
    for r in matched:
        assert r.ratio is not None and r.ratio_low is not None and r.ratio_high is not None
        assert r.ratio_low <= r.ratio <= r.ratio_high
        if r.verdict == "faster":
            assert r.ratio_high < 1
        elif r.verdict == "slower":
            assert r.ratio_low > 1
        else:
            assert r.ratio_low <= 1 <= r.ratio_high
    zigzag = [r for r in matched if r.layout == "zigzag"]
    assert zigzag and all(r.verdict == "faster" for r in zigzag)  # 20% faster in the fixture
    assert [r.mesh for r in result.regressions] == ["U4xR1"]
    # The report's comparison counts the same verdicts.
    page = build_comparison(SWEEP, AFTER)
    assert (page.faster, page.slower) == (result.count("faster"), result.count("slower"))


def test_cli_exits_1_on_a_regression_beyond_the_threshold() -> None:
    res = runner.invoke(app, ["compare", str(SWEEP), str(AFTER), "--json"])
    assert res.exit_code == 1, res.output
    answer = json.loads(res.stdout)
    assert answer["faster"] + answer["slower"] + answer["no_significant_change"] == 7
    assert len(answer["regressions"]) == 1
    lenient = runner.invoke(app, ["compare", str(SWEEP), str(AFTER), "--threshold", "0.5"])
    assert lenient.exit_code == 0, lenient.output
    assert "0 regression(s) beyond 50%" in lenient.stdout
    same = runner.invoke(app, ["compare", str(SWEEP), str(SWEEP)])
    assert same.exit_code == 0 and "0 faster, 0 slower" in same.stdout
    bad = runner.invoke(app, ["compare", str(SWEEP), str(AFTER), "--threshold", "-1"])
    assert bad.exit_code == 2 and "--threshold (-1.0)" in bad.stderr


def test_an_equivalent_name_matches(tmp_path: Path) -> None:
    """A version 1 file measured a ring-degree-1 mesh under the zigzag name; the version 2
    file measured it once as contiguous, listing the zigzag id: the two are compared."""
    before = [r for r in read_records(AFTER)]
    after = json.loads(json.dumps(before))
    target = next(r for r in after if r["config"]["ring"] == 1)
    old_id = target["id"].replace("contiguous", "zigzag")
    for r in after:
        r.pop("_source", None)
    for r in before:
        r.pop("_source", None)
    renamed = next(r for r in before if r["id"] == target["id"])
    renamed["id"] = old_id
    target["config"]["equivalent"] = [old_id]
    b, a = tmp_path / "b.jsonl", tmp_path / "a.jsonl"
    b.write_text("".join(json.dumps(r) + "\n" for r in before))
    a.write_text("".join(json.dumps(r) + "\n" for r in after))
    result = compare_results(b, a)
    row = next(r for r in result.rows if r.id == target["id"])
    assert row.verdict == "no significant change" and row.ratio == 1.0
    assert result.unmatched == 0


def test_table_names_every_axis_that_tells_rows_apart() -> None:
    """Two configurations that differ only in heads / KV heads (or another axis) read apart."""
    base = {"id": "a", "mesh": "U1xR4", "layout": "contiguous", "seq_len": 1024,
            "phase": "fwd+bwd", "heads": 8, "kv_heads": 2, "dtype": "float32",
            "before_s": 0.01, "after_s": 0.01, "ratio": 1.0, "ratio_low": 0.9,
            "ratio_high": 1.1, "verdict": "no significant change", "regression": False}
    changes: list[dict] = [{}, {"id": "b", "heads": 16, "kv_heads": 4},
                           {"id": "c", "dtype": "bfloat16"}]
    rows = [ComparisonRow(**{**base, **change}) for change in changes]
    console = Console(width=120, file=io.StringIO(), color_system=None)
    console.print(compare_table(Comparison(("x", "y"), 0.05, rows)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    header = next(line for line in text.splitlines() if "layout" in line)
    assert all(col in header for col in (" h ", " kv ", "dtype"))
    body = [line for line in text.splitlines() if "contiguous" in line]
    assert len(body) == 3 and len(set(body)) == 3
    one_dtype = Console(width=120, file=io.StringIO(), color_system=None)
    one_dtype.print(compare_table(Comparison(("x", "y"), 0.05, rows[:2])))
    assert "dtype" not in one_dtype.file.getvalue()  # type: ignore[attr-defined]
    assert {"heads", "kv_heads"} <= set(compare_results(SWEEP, AFTER).rows[0].to_dict())


def test_each_row_is_the_frames_row_in_its_column_order() -> None:
    """`ComparisonRow.to_dict` (what `--json` prints) is the `compare_frame` row, key for key
    and in the frame's column order, so the typed rows change nothing in the output."""
    from cpbench.results.frame import compare_frame, value  # noqa: PLC0415
    from cpbench.results.store import records_frame  # noqa: PLC0415

    frame = compare_frame(records_frame(read_records(SWEEP)), records_frame(read_records(AFTER)))
    expected = [{k: value(v) for k, v in row.items()} for row in frame.to_dict("records")]
    rows = [r.to_dict() for r in compare_results(SWEEP, AFTER).rows]
    assert rows == expected
    assert [list(r) for r in rows] == [list(frame.columns)] * len(rows)
