"""The report's inference section (issue 26, Build 4): TTFT against the prompt per scheme, decode
latency against the CP degree and the KV cache per rank, drawn from the records of a world-2
inference sweep; the training sections do not take the inference records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cpbench.app.report import build_report
from cpbench.app.sweep import run_sweep
from cpbench.render.figures.inference import (
    decode_latency_figure,
    kv_capacity_figure,
    ttft_figure,
)
from cpbench.render.html.report import render_report
from cpbench.results.scenarios.loading import parse_scenario
from cpbench.results.store import read_records

SCENARIO = {
    "name": "inference-report", "world_size": 2, "device": "cpu", "warmup": 0, "iters": 2,
    "precision": "off", "timeout": 60,
    "axes": {"heads": 4, "head_dim": 16, "phase": "prefill", "cached_len": 32,
             "new_tokens": [2, 8], "scheme": ["pass_kv", "pass_q"]},
    "also": [{"phase": "decode", "new_tokens": 2, "cache_layout": ["contiguous", "interleaved"]}],
}  # fmt: skip


@pytest.fixture
def swept(tmp_path: Path, lend_the_session_pool: None) -> Path:
    out = tmp_path / "inference.jsonl"
    run_sweep(parse_scenario(SCENARIO, "<test>"), "cpu", 2, out)
    return out


def _by(records: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    return [r for r in records if r["config"]["inference"]["phase"] == phase]


def test_the_report_draws_ttft_decode_latency_and_kv_capacity(swept: Path) -> None:
    records = read_records(swept)
    assert len(records) == 6 and {r["status"] for r in records} == {"ok"}
    report = build_report([swept])
    assert report.inference is not None and len(report.inference) == 6
    assert report.frame.empty  # the training sections (and the cost model) take none of them

    ttft = ttft_figure(report.inference)
    assert ttft is not None
    lines = {t.name: t for t in ttft.data}
    assert set(lines) == {"pass_kv cached len 32", "pass_q cached len 32"}
    for r in _by(records, "prefill"):
        line = lines[f"{r['config']['inference']['scheme']} cached len 32"]
        i = list(line.x).index(r["config"]["inference"]["new_tokens"])
        assert line.y[i] == pytest.approx(r["inference"]["ttft_s"] * 1e3, rel=1e-12)

    decode = decode_latency_figure(report.inference)
    assert decode is not None and len(decode.data) == 2
    for r, line in zip(
        sorted(_by(records, "decode"), key=lambda r: r["config"]["inference"]["cache_layout"]),
        decode.data,
        strict=True,
    ):
        assert list(line.x) == [2]
        assert line.y[0] == pytest.approx(r["inference"]["per_token_latency_s"] * 1e3, rel=1e-12)

    kv = kv_capacity_figure(report.inference)
    assert kv is not None
    measured, analytic = kv.data  # one world and batch: measured markers, analytic line
    # contexts 34, 40 (prefill) and 34 (decode: P 32 + T 2): ceil(N / 2) x K,V x 4 x 16 x 4 B
    assert list(analytic.x) == [34, 40]
    assert list(analytic.y) == pytest.approx([17 * 2 * 4 * 16 * 4 / 1024, 20 * 2 * 4 * 16 * 4 / 1024])
    for got, want in zip(measured.y, analytic.y, strict=True):
        assert got == pytest.approx(want, rel=0.05)

    html = render_report(report).html
    for key in ("inference-ttft", "inference-decode", "inference-kv", "inference-table"):
        assert f"id='{key}'" in html or f'id="{key}"' in html, key


@pytest.mark.torch_free
def test_a_training_report_has_no_inference_section() -> None:
    fixture = Path(__file__).parent / "fixtures" / "sweep.jsonl"
    report = build_report([fixture])
    assert report.inference is None
    assert "inference-ttft" not in render_report(report).html


def _frame_row(**over: Any) -> dict[str, Any]:
    row = {"status": "ok", "phase": "prefill", "how": "pass_kv", "world_size": 2, "cached_len": 32,
           "new_tokens": 8, "batch": 1, "heads": 4, "kv_heads": 4, "head_dim": 16,
           "dtype": "float32", "device": "cpu", "ttft_s": 1e-3, "per_token_latency_s": None}  # fmt: skip
    return row | over


@pytest.mark.torch_free
def test_a_line_never_mixes_records_of_different_worlds_or_new_tokens() -> None:
    """Two worlds at the same scheme and P are two TTFT lines, named by the world; decode steps
    of T = 1 and T = 4 are two latency lines (a median over them would mean nothing)."""
    import pandas as pd  # noqa: PLC0415

    frame = pd.DataFrame([_frame_row(), _frame_row(world_size=4, ttft_s=3e-3)])
    lines = {t.name: list(t.y) for t in ttft_figure(frame).data}  # type: ignore[union-attr]
    assert lines == {"pass_kv cached len 32 world size 2": [1.0],
                     "pass_kv cached len 32 world size 4": [3.0]}  # fmt: skip
    decode = pd.DataFrame([
        _frame_row(phase="decode", how="contiguous", new_tokens=t, ttft_s=None,
                   per_token_latency_s=s) for t, s in ((1, 2e-3), (4, 5e-4))
    ])  # fmt: skip
    lines = {t.name: list(t.y) for t in decode_latency_figure(decode).data}  # type: ignore[union-attr]
    assert lines == {"contiguous batch 1 new tokens 1": [2.0],
                     "contiguous batch 1 new tokens 4": [0.5]}  # fmt: skip
