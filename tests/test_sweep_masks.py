"""Masks through the sweep, the record and the report: documents and windows as axes, measured
on 2 CPU ranks, stored, read back (old records migrated), and plotted per rank against the
model's work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cpbench.app.record import per_rank_work
from cpbench.app.report import build_report
from cpbench.app.report.work import work_fits
from cpbench.app.sweep import run_sweep
from cpbench.attention.layouts import shard_tensor
from cpbench.config.bench import BenchConfig
from cpbench.config.geometry import pack
from cpbench.impls import skip_reason
from cpbench.render.figures.balance import work_balance_figure
from cpbench.render.html.report import render_report
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.schema import ConfigSection, ResultRecord, dump_record, migrate_record
from cpbench.results.store import append_record, read_records, read_results, records_frame
from tests.conftest import lend

MASKED = """
name = "masked"
description = "documents and windows on 2 ranks"
world_size = 2
device = "cpu"
warmup = 0
iters = 2
timeout = 120
precision = "off"

[axes]
seq_len = 64
heads = 4
kv_heads = 2
head_dim = 16
dtype = "float32"
mesh = ["1x2", "2x1"]
layout = ["zigzag", "doc_zigzag", "balanced"]
documents = "{documents}"
phase = "fwd+bwd"

[[also]]
mesh = "1x2"
layout = "contiguous"
documents = "none"
window = ["none", 16]
"""

DOCUMENTS = "30,3,25,6"
"""Documents shorter than a chunk (3, 6), none a multiple of 2R = 4 (doc_zigzag pads them)."""


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, pool) -> tuple[Path, list[dict]]:  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("masks")
    path = folder / "masked.toml"
    path.write_text(MASKED.format(documents=DOCUMENTS))
    out = folder / "r.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        lend(pool, patch)  # on the session's 2 ranks
        result = run_sweep(load_scenario(str(path)), "cpu", 2, out)
    return out, result.records


def test_a_document_sweep_on_two_ranks_is_checked_counted_and_recorded(
    swept: tuple[Path, list[dict]],
) -> None:
    out, records = swept
    # 3 layouts on 1x2 with documents and one on 2x1 (at ring 1 every layout is contiguous:
    # measured once), then the window study (no window, window 16)
    assert len(records) == 3 + 1 + 2
    assert [r["status"] for r in records] == ["ok"] * len(records), [r["error"] for r in records]
    for r in records:
        c = r["config"]
        config = BenchConfig.from_dict(c)
        packing = pack(config.mask, 64, config.ulysses, config.ring, config.layout)
        assert c["mask"] == config.mask.kind
        assert c["padding"] == packing.padding and c["run_seq_len"] == 64 + packing.padding
        # the reference check ran the configuration's own mask and passed
        assert r["accuracy"]["passed"], r["accuracy"]
        assert r["accuracy"]["max_abs_error"] <= r["accuracy"]["tolerance"]
        # counted bytes equal the mask-aware analytic bytes, collective by collective
        assert r["comm"]["match"], r["comm"]["by_collective"]
        # each rank's compute-only median and its work, counted pair by pair, are in the record
        assert len(r["timing"]["compute_only_per_rank"]) == 2
        assert r["flops"]["per_rank_work"] == pytest.approx(_brute_force_work(config), rel=1e-12)
    documented = [r for r in records if r["config"]["documents"] is not None]
    assert {tuple(r["config"]["documents"]) for r in documented} == {(30, 3, 25, 6)}
    assert {r["config"]["mask"] for r in documented} == {"document"}
    # doc_zigzag pads each document to a multiple of 2R on the ring of 2: 2 + 1 + 3 + 2 tokens
    ring_doc = [
        r for r in documented if r["config"]["ring"] == 2 and r["config"]["layout"] == "doc_zigzag"
    ]
    assert [r["config"]["padding"] for r in ring_doc] == [8]
    assert all(
        r["config"]["padding"] == 0 for r in documented if r["config"]["layout"] != "doc_zigzag"
    )
    # the window study: plain causal keeps its id; the window adds its mask to the id
    plain, windowed = records[-2:]
    assert plain["id"].endswith("-cpu-w2") and plain["config"]["mask"] == "causal"
    assert windowed["id"].endswith("-causal-w16") and windowed["config"]["mask"] == "sliding_window"
    # and the file holds what the sweep returned, typed
    typed = read_results(out)
    assert [r.id for r in typed] == [r["id"] for r in records]
    assert typed[0].config is not None and typed[0].config.documents == [30, 3, 25, 6]


@pytest.mark.torch_free
def test_a_record_with_documents_round_trips(tmp_path: Path, swept: tuple[Path, list[dict]]):
    _, records = swept
    record = ResultRecord.model_validate(records[2])
    assert record.config is not None and record.config.documents == [30, 3, 25, 6]
    path = tmp_path / "one.jsonl"
    append_record(path, record)
    (again,) = read_results(path)
    assert again.model_dump() == record.model_dump()
    assert json.loads(path.read_text()) == dump_record(record) == records[2]
    row = records_frame([record]).iloc[0]
    assert row["mask"] == "document" and row["documents"] == [30, 3, 25, 6]
    assert row["padding"] == record.config.padding and row["run_seq_len"] == 64 + row["padding"]
    assert row["per_rank_work"] == record.flops.per_rank_work  # type: ignore[union-attr]


@pytest.mark.torch_free
def test_an_old_record_reads_as_causal_or_full_and_is_written_back_unchanged(
    tmp_path: Path, swept: tuple[Path, list[dict]]
) -> None:
    _, records = swept
    old = json.loads(json.dumps(records[-2]))  # the plain causal point
    for key in ("mask", "documents", "window", "padding", "run_seq_len"):
        del old["config"][key]
    del old["flops"]["per_rank_work"]
    full = json.loads(json.dumps(old))
    full["config"]["causal"] = False
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps(full) + "\n")
    causal, no_mask = read_results(path)
    for record, kind in ((causal, "causal"), (no_mask, "full")):
        assert record.config is not None
        assert record.config.mask == kind
        assert (record.config.documents, record.config.window) == (None, None)
        assert (record.config.padding, record.config.run_seq_len) == (0, 64)
    # nothing is added when the record is written again (the fill-in is not "set")
    assert [dict(r, _source=None) for r in read_records(path)] == [
        dict(old, _source=None),
        dict(full, _source=None),
    ]
    assert migrate_record(old) == old
    frame = records_frame([causal, no_mask])
    assert list(frame["mask"]) == ["causal", "full"] and list(frame["padding"]) == [0, 0]
    # a skipped point whose layout cannot pack keeps its padding null
    section = ConfigSection.model_validate({**old["config"], "padding": None, "run_seq_len": None})
    assert section.padding is None and section.run_seq_len is None


@pytest.mark.torch_free
def test_the_report_plots_per_rank_work_against_compute_per_layout(
    swept: tuple[Path, list[dict]],
) -> None:
    out, _ = swept
    report = build_report([out])
    (fit,) = report.work
    assert fit.phase == "fwd+bwd"
    # one point per rank of each document record, none of the plain ones
    assert len(fit.points) == (3 + 1) * 2
    assert set(fit.records["layout"]) == {"zigzag", "doc_zigzag", "balanced", "contiguous"}
    assert fit.max_error >= 0 and (fit.correlation is None or -1 <= fit.correlation <= 1)
    # the fitted line passes through the points' means (least squares with an intercept)
    mean_fit = fit.slope_s * fit.points["work"].mean() + fit.intercept_s
    assert mean_fit == pytest.approx(fit.points["compute_s"].mean(), rel=1e-9)
    assert work_fits(records_frame(read_records(out))[0:0]) == []
    page = render_report(report)
    assert "Packed documents: per-rank work and padding" in page.html
    figure = work_balance_figure(report.work)
    assert figure is not None
    titles = [a.text for a in figure.layout.annotations]
    # one facet per layout (the 2x1 point is contiguous); doc_zigzag paid 8 tokens on the
    # ring of 2, the others none
    assert [t.split(":")[0] for t in titles] == ["contiguous", "zigzag", "doc_zigzag", "balanced"]
    assert "padding 0 tok" in titles[1] and "padding 8 tok" in titles[2]
    assert sum(len(t.x) for t in figure.data if t.mode == "markers") == len(fit.points)
    assert "work-table" in page.html
    # a mask column in the record table and in the sweep's table
    assert "<th" in page.html and ">mask<" in page.html


def test_external_impls_refuse_a_mask_they_do_not_run() -> None:
    base = BenchConfig(
        seq_len=64, batch=1, heads=4, kv_heads=4, head_dim=16, dtype="bfloat16", causal=True,
        ulysses=1, ring=2, layout="zigzag", kv_replication=None, kernel="auto", phase="fwd+bwd",
        device="cuda", world_size=2, documents=(30, 34),
    )  # fmt: skip
    import dataclasses  # noqa: PLC0415

    for impl in ("ring_flash_attn", "yunchang", "torch_cp", "transformer_engine"):
        docs = skip_reason(dataclasses.replace(base, impl=impl))
        assert docs is not None and "document mask (document (2 docs))" in docs, docs
        assert "never dropped" in docs
        window = skip_reason(dataclasses.replace(base, impl=impl, documents=None, window=16))
        assert window is not None and "sliding_window mask (window 16)" in window, window
        layout = skip_reason(
            dataclasses.replace(base, impl=impl, documents=None, layout="balanced")
        )
        assert layout is not None and "no balanced layout" in layout, layout
    assert skip_reason(dataclasses.replace(base, impl="cpbench")) is None


def test_cli_run_takes_documents_window_and_seed(tmp_path: Path, lend_the_session_pool: None) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    common = ["run", "--seq-len", "64", "--heads", "4", "--head-dim", "16", "--ring", "2",
              "--iters", "1", "--warmup", "0", "--precision", "off", "--device", "cpu"]  # fmt: skip
    out = tmp_path / "one.jsonl"
    res = CliRunner().invoke(
        app,
        [*common, "--layout", "balanced", "--documents", "uniform:min=4,max=24", "--seed", "5",
         "--window", "12", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (record,) = read_records(out)
    assert record["status"] == "ok" and record["comm"]["match"], record["error"]
    assert record["config"]["mask"] == "document_sliding_window"
    assert record["config"]["window"] == 12 and sum(record["config"]["documents"]) == 64
    assert "mask" in res.output  # the results table shows the mask column
    bad = CliRunner().invoke(app, [*common, "--documents", "10,10"])
    assert bad.exit_code == 2
    assert "key 'documents': documents '10,10' sum to 20, not the sequence length 64" in bad.stderr
    bad = CliRunner().invoke(app, [*common, "--window", "8", "--no-causal"])
    assert bad.exit_code == 2 and "key 'window': 8 needs a causal mask" in bad.stderr


# ---------------------------------------------------- per-rank work, counted by brute force


def _spans(config: BenchConfig) -> list[tuple[int, int]]:
    """The sequence as the ring runs it, as (document, padding after it) spans, from the
    layouts' definition (cpbench.attention.layouts): doc_zigzag on a ring of R > 1 pads every
    document to a multiple of 2R, then adds a padding span in steps of 2R until the ring shard
    is a multiple of U; the other layouts run the documents as they are. Padding tokens form
    documents of their own."""
    ring, ulysses = config.ring, config.ulysses
    docs = config.mask.for_length(config.seq_len).documents or (config.seq_len,)
    if config.layout != "doc_zigzag" or ring == 1:
        return [(d, 0) for d in docs]
    spans = [(d, -d % (2 * ring)) for d in docs]
    extra = 0
    while (sum(d + p for d, p in spans) + extra) // ring % ulysses:
        extra += 2 * ring
    return spans + ([(0, extra)] if extra else [])


def _ring_positions(config: BenchConfig, spans: list[tuple[int, int]], ring_rank: int) -> list[int]:
    """The positions ring rank j holds, from each layout's definition: contiguous
    [jL/R, (j+1)L/R); zigzag chunks j and 2R-1-j of 2R; striped i mod R == j; doc_zigzag
    chunks j and 2R-1-j of every span (a document with its padding); at R = 1 all. `balanced`
    is an optimiser's output, not a formula: its positions are read off what `shard_tensor`
    actually moves (an arange, the ring rank's U pieces) and `_brute_force_work` checks that
    they partition the sequence into L/R tokens per ring rank."""
    ring = config.ring
    run_len = sum(d + p for d, p in spans)
    if ring == 1:
        return list(range(run_len))
    if config.layout == "balanced":
        tokens = torch.arange(run_len).view(1, run_len, 1)
        pieces = [
            shard_tensor(tokens, config.ulysses, ring, "balanced", ring_rank * config.ulysses + u,
                         mask=config.mask)
            for u in range(config.ulysses)
        ]  # fmt: skip
        return sorted(int(p) for piece in pieces for p in piece.flatten())
    if config.layout == "contiguous":
        n = run_len // ring
        return list(range(ring_rank * n, (ring_rank + 1) * n))
    if config.layout == "striped":
        return list(range(ring_rank, run_len, ring))
    zigzagged = [(0, run_len)] if config.layout == "zigzag" else []
    start = 0
    for d, p in spans if config.layout == "doc_zigzag" else []:
        zigzagged.append((start, d + p))
        start += d + p
    held: list[int] = []
    for start, length in zigzagged:
        chunk = length // (2 * ring)
        for c in (ring_rank, 2 * ring - 1 - ring_rank):
            held += range(start + c * chunk, start + (c + 1) * chunk)
    return sorted(held)


def _brute_force_work(config: BenchConfig) -> list[float]:
    """Each global rank's attention work counted pair by pair: every (query, key) of the run
    sequence with the query on the rank's ring rank (ring attention: each ring rank attends
    its queries to every key over the ring's steps) that the mask's definition keeps (causal:
    key <= query, query - key < window, the same document), minus half a pair per own token
    under a causal mask (cpbench.model.flops' continuum convention: one causal document of L
    tokens is L^2/2), x B x the h/U heads a rank computes after the Ulysses all-to-all.
    Global rank p = j*U + u holds ring rank j's work."""
    spans = _spans(config)
    document = [i for i, n in enumerate(x for s in spans for x in s if x) for _ in range(n)]
    run_len, window, causal = len(document), config.mask.window, config.mask.causal
    held = [_ring_positions(config, spans, j) for j in range(config.ring)]
    assert sorted(p for h in held for p in h) == list(range(run_len)), held  # a partition
    assert {len(h) for h in held} == {run_len // config.ring}, held  # L/R tokens each
    work = []
    for queries in held:
        pairs = sum(
            1
            for q in queries
            for k in range(run_len)
            if not causal
            or (k <= q and (window is None or q - k < window) and document[q] == document[k])
        )
        work.append(pairs - (len(queries) / 2 if causal else 0))
    heads = config.batch * config.heads / config.ulysses
    return [work[p // config.ulysses] * heads for p in range(config.world_size)]


@pytest.mark.parametrize(
    ("documents", "window"),
    [(None, None), ((30, 3, 25, 6), None), (None, 5), ((9, 1, 40, 14), 12), ((64,), None)],
)
@pytest.mark.parametrize(("ulysses", "ring"), [(1, 2), (2, 1), (1, 4), (2, 2), (4, 1)])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped", "doc_zigzag", "balanced"])
def test_per_rank_work_equals_pairs_counted_one_by_one(
    layout: str, ulysses: int, ring: int, documents: tuple[int, ...] | None, window: int | None
) -> None:
    """The record's `per_rank_work` (cpbench.app.record) against the brute-force count, to
    1e-12, on L = 64 with 8 heads, B = 2: every layout on every mesh of 2 and 4 ranks, under
    plain causal, documents shorter than a chunk, a window, both, and one document."""
    config = BenchConfig(
        seq_len=64, batch=2, heads=8, kv_heads=8, head_dim=16, dtype="float32", causal=True,
        ulysses=ulysses, ring=ring, layout=layout, kv_replication=None, kernel="auto",
        phase="fwd+bwd", device="cpu", world_size=ulysses * ring, documents=documents,
        window=window,
    )  # fmt: skip
    assert per_rank_work(config) == pytest.approx(_brute_force_work(config), rel=1e-12)
