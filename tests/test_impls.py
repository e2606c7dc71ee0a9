"""External implementations behind cpbench's adapters (cpbench.impls): capability tables, skip
reasons and install hints, correctness of every adapter that runs on CPU against the float64
reference (ring-flash-attention and yunchang through the test-only flash_attn stand-in,
tests/stand_ins), the byte counter at the torch.distributed boundary, and a sweep with an
impl axis down to the report.

Tolerances: the error model's bound per tensor (cpbench.config.tolerances), and under the coarse
TOLERANCE per dtype (float32 2e-4, float16 1e-2, bfloat16 5e-2, max abs error against float64),
loosened only for a gradient named by a documented upstream issue.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpbench.app.verify import split_cases
from cpbench.bench.reference import run_cases_on_rank
from cpbench.config.bench import BenchConfig, VerifyCase
from cpbench.config.tolerances import TOLERANCE
from cpbench.errors import CpbenchError
from cpbench.impls import IMPLS, get_adapter, skip_reason
from cpbench.results.scenarios.loading import parse_scenario
from tests import rank_tasks
from tests.impl_support import STAND_INS, use_stand_ins

TORCH_CP_MISSING = get_adapter("torch_cp").installed()
"""Why torch_cp cannot run on this torch (it follows torch 2.13's private context-parallel
modules; the floor torch lacks them), or None. Its cases are left out where it is missing."""
needs_torch_cp = pytest.mark.skipif(TORCH_CP_MISSING is not None, reason=str(TORCH_CP_MISSING))
RUNNING_EXTERNALS = tuple(
    i for i in ("torch_cp", "ring_flash_attn", "yunchang") if i != "torch_cp" or not TORCH_CP_MISSING
)
"""The external impls that run on the CPU here."""


@pytest.fixture(scope="module", autouse=True)
def stand_ins() -> Iterator[None]:
    """The flash_attn stand-in on sys.path for this module only (before yunchang is imported:
    it decides at import whether flash-attn exists); the libraries are unloaded afterwards.
    Ranks spawned meanwhile inherit the path; the session pool's ranks get it as a task."""
    added = STAND_INS not in sys.path
    use_stand_ins()
    yield
    if added and STAND_INS in sys.path:
        sys.path.remove(STAND_INS)
    for name in list(sys.modules):
        if name.split(".")[0] in ("flash_attn", "yunchang", "ring_flash_attn"):
            del sys.modules[name]


BASE = BenchConfig(
    seq_len=64, batch=1, heads=4, kv_heads=4, head_dim=16, dtype="bfloat16", causal=True,
    ulysses=1, ring=2, layout="zigzag", kv_replication=None, kernel="auto", phase="fwd+bwd",
    device="cpu", world_size=2,
)


def cfg(impl: str, **changes: object) -> BenchConfig:
    config = dataclasses.replace(BASE, impl=impl, **changes)  # type: ignore[arg-type]
    if "ulysses" in changes or "ring" in changes:
        config = dataclasses.replace(config, world_size=config.ulysses * config.ring)
    return config


# ------------------------------------------------------------------------- capability tables

CAPABILITY = [
    # (impl, changes, None = supported / a fragment of the reason)
    ("cpbench", {"ulysses": 2, "ring": 1, "layout": "striped", "dtype": "float32"}, None),
    ("torch_cp", {"dtype": "float32"}, None),
    ("torch_cp", {"layout": "contiguous", "causal": False}, None),
    ("torch_cp", {"kv_heads": 2}, None),
    ("torch_cp:alltoall", {"layout": "contiguous"}, None),
    ("torch_cp", {"ulysses": 2, "ring": 1}, "has no Ulysses all-to-all"),
    ("torch_cp", {"layout": "striped"}, "striped has no SDPA load balancer"),
    ("torch_cp", {"causal": False}, "Load balancing requires `is_causal=True`"),
    ("torch_cp", {"kernel": "sdpa"}, "kernel must be 'auto'"),
    ("ring_flash_attn", {}, None),
    ("ring_flash_attn", {"layout": "striped", "kv_heads": 1}, None),
    ("ring_flash_attn", {"layout": "contiguous", "causal": False, "dtype": "float16"}, None),
    ("ring_flash_attn", {"dtype": "float32"}, "fp16/bf16 only"),
    ("ring_flash_attn", {"ulysses": 2, "ring": 2}, "ring attention only"),
    ("ring_flash_attn", {"causal": False}, "zigzag_ring_flash_attn_func is causal only"),
    ("ring_flash_attn", {"ulysses": 1, "ring": 1}, "gloo cannot do"),
    ("ring_flash_attn", {"ring": 1, "device": "cuda"}, None),
    ("yunchang", {"ulysses": 2, "ring": 2, "kv_heads": 2}, None),
    ("yunchang", {"ulysses": 2, "ring": 2, "layout": "striped"}, None),
    ("yunchang", {"ulysses": 2, "ring": 2, "kv_heads": 1}, "without KV-head replication"),
    ("yunchang", {"kv_replication": 2}, "no KV-head replication"),
    ("yunchang", {"ulysses": 2, "ring": 1}, "gloo cannot do"),
    ("yunchang", {"layout": "striped", "causal": False}, "'strip' is causal only"),
    ("yunchang", {"dtype": "float32"}, "fp16/bf16 only"),
    ("transformer_engine", {}, "runs only on CUDA"),
    ("transformer_engine", {"device": "cuda", "dtype": "float32"}, "needs fp16/bf16"),
    ("transformer_engine", {"device": "cuda"}, None),
    ("transformer_engine", {"device": "cuda", "ulysses": 2, "ring": 2, "seq_len": 64}, None),
    ("transformer_engine", {"device": "cuda", "layout": "striped"}, "use layout zigzag"),
    ("transformer_engine", {"device": "cuda", "ulysses": 4, "ring": 1, "kv_heads": 2},
     "kv_heads % ulysses == 0"),
    ("transformer_engine:all_gather", {"device": "cuda", "ulysses": 2, "ring": 1},
     "ring-level scheme"),
]


@pytest.mark.parametrize(("impl", "changes", "expected"), CAPABILITY)
def test_capability_tables(impl: str, changes: dict, expected: str | None) -> None:
    reason = get_adapter(impl).capability(cfg(impl, **changes))
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason, reason


def test_every_impl_has_an_adapter_and_the_axis_parses() -> None:
    assert {get_adapter(name).name for name in IMPLS} == set(IMPLS)
    spec = parse_scenario(
        {"world_size": 2, "device": "cpu",
         "axes": {"seq_len": 64, "heads": 4, "mesh": ["1x2"], "impl": ["cpbench", "torch_cp"]}},
        "t.toml",
    )
    points = spec.expand("cpu", 2)
    assert [c.impl for c, _ in points] == ["cpbench", "torch_cp"]
    cpbench, torch_cp = (c for c, _ in points)
    assert "impl" not in cpbench.key and torch_cp.key == f"{cpbench.key}-impl_torch_cp"
    assert torch_cp.to_dict()["impl"] == "torch_cp"
    old = {k: v for k, v in cpbench.to_dict().items() if k != "impl"}  # a pre-impl record
    assert BenchConfig.from_dict(old).impl == "cpbench"
    with pytest.raises(CpbenchError, match="key 'impl': 'megatron' is not one of cpbench"):
        parse_scenario({"axes": {"seq_len": 64, "heads": 4, "impl": "megatron"}}, "t.toml")
    default = parse_scenario({"axes": {"seq_len": 64, "heads": 4}}, "t.toml")
    assert default.impl == ("cpbench",)


def test_te_layout_is_megatrons_global_zigzag() -> None:
    from cpbench.attention.layouts import positions  # noqa: PLC0415
    from cpbench.impls.te import te_positions  # noqa: PLC0415

    assert te_positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    for rank in range(4):  # U = 1: the same as cpbench's zigzag
        assert te_positions(32, 4, rank).tolist() == positions(32, 1, 4, "zigzag", rank).tolist()
    # U = 2, R = 2: TE's rank 1 holds chunks 1 and 6 of 8; cpbench's ring-level zigzag gives it
    # the second half of ring rank 0's positions (chunk 3 of 4 = tokens 12..15).
    assert te_positions(16, 4, 1).tolist() != positions(16, 2, 2, "zigzag", 1).tolist()


# ------------------------------------------------------------------ install hints and skips


def _fail_import(monkeypatch: pytest.MonkeyPatch, module: str, message: str) -> None:
    """`import module` fails with `message` ("No module named 'x'": x is missing). The parent
    looks libraries up with importlib.util.find_spec (cpbench.impls.base.module_available),
    which then does not find x; a rank's import_module raises the message."""
    missing = message.split("'")[1]
    real_import, real_find_spec = importlib.import_module, importlib.util.find_spec

    def fake_import(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name == module or name.startswith(module + "."):
            raise ModuleNotFoundError(message)
        return real_import(name, package)

    def fake_find_spec(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name == missing or name.startswith(missing + "."):
            return None
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec)


@pytest.mark.parametrize(
    ("impl", "module", "message", "hint"),
    [
        ("ring_flash_attn", "ring_flash_attn", "No module named 'ring_flash_attn'",
         "pip install 'cpbench[ring]'"),
        ("ring_flash_attn", "ring_flash_attn", "No module named 'flash_attn'",
         "needs flash-attn (CUDA only): pip install flash-attn"),
        ("ring_flash_attn", "ring_flash_attn", "No module named 'transformers'",
         "pip install 'transformers<5'"),
        ("yunchang", "yunchang", "No module named 'yunchang'", "pip install 'cpbench[usp]'"),
        ("transformer_engine", "transformer_engine", "No module named 'transformer_engine'",
         "pip install 'cpbench[te]'"),
    ],
)
def test_a_missing_library_is_skipped_with_an_install_hint(
    monkeypatch: pytest.MonkeyPatch, impl: str, module: str, message: str, hint: str
) -> None:
    _fail_import(monkeypatch, module, message)
    assert hint in (get_adapter(impl).installed() or "")
    supported = cfg(impl, device="cuda") if impl.startswith("transformer") else cfg(impl)
    assert hint in (skip_reason(supported) or "")


def test_yunchang_without_flash_attn_and_torch_without_cp_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yunchang.globals  # noqa: PLC0415

    from cpbench.impls import torch_cp  # noqa: PLC0415

    monkeypatch.setattr(yunchang.globals, "HAS_FLASH_ATTN", False)
    assert "pip install flash-attn" in (get_adapter("yunchang").installed() or "")

    def missing() -> None:
        raise ImportError("..._attention._templated_ring_attention is missing")

    monkeypatch.setattr(torch_cp, "_torch_cp", missing)
    hint = get_adapter("torch_cp").installed() or ""
    assert "lacks what the torch_cp adapter uses" in hint and "torch 2.13" in hint


@needs_torch_cp
def test_torch_cp_is_covered_on_this_torch() -> None:
    """Where this torch lacks torch_cp's modules (the floor torch, 2.5.1), its cases leave the
    adapter matrix and the impl sweep quietly (RUNNING_EXTERNALS); this skip is what says so,
    with the reason, on the conftest allow-list for torch < 2.13 only. Where it runs, it is
    in both."""
    assert "torch_cp" in RUNNING_EXTERNALS
    assert any(c.impl.startswith("torch_cp") for c in _cases(2))


@needs_torch_cp
def test_verify_lists_what_an_impl_cannot_run_as_skipped() -> None:
    cases = [
        VerifyCase(ulysses=1, ring=2, layout="zigzag", causal=True, heads=4, kv_heads=4, seq_len=16, impl="torch_cp"),
        VerifyCase(ulysses=1, ring=2, layout="striped", causal=True, heads=4, kv_heads=4, seq_len=16, impl="torch_cp"),
    ]
    runnable, skipped = split_cases(cases, "cpu")
    assert runnable == cases[:1]
    assert skipped[0]["passed"] is None and "striped" in skipped[0]["skipped"]
    with pytest.raises(CpbenchError, match="cannot run: .*runs only on CUDA|cpbench\\[te\\]"):
        split_cases([VerifyCase(ulysses=1, ring=2, layout="zigzag", causal=True, heads=4, kv_heads=4, seq_len=16, impl="transformer_engine")],
                    "cpu")


def test_cli_run_rejects_an_impl_that_cannot_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    res = CliRunner().invoke(
        app, ["run", "--impl", "transformer_engine", "--device", "cpu", "--seq-len", "64"]
    )
    assert res.exit_code == 2
    assert "impl 'transformer_engine' cannot run" in res.stderr
    assert "runs only on CUDA" in res.stderr


# --------------------------------------------------------------- correctness on the CPU pool


def _cases(world: int) -> list[VerifyCase]:
    def case(u: int, layout: str, causal: bool, kv: int, impl: str, dtype: str) -> VerifyCase:
        return VerifyCase(ulysses=u, ring=world // u, layout=layout, causal=causal, heads=4, kv_heads=kv, seq_len=16 * world, head_dim=8, dtype=dtype, impl=impl)

    if world == 2:
        return [
            case(1, "zigzag", True, 2, "torch_cp", "float32"),
            case(1, "contiguous", False, 4, "torch_cp", "float32"),
            case(1, "contiguous", True, 4, "torch_cp:alltoall", "float32"),
            case(1, "contiguous", False, 2, "ring_flash_attn", "bfloat16"),
            case(1, "zigzag", True, 4, "ring_flash_attn", "bfloat16"),
            case(1, "contiguous", True, 4, "ring_flash_attn", "float16"),  # the known issue
            case(1, "striped", True, 2, "yunchang", "bfloat16"),
        ]
    return [
        case(1, "zigzag", True, 1, "torch_cp:alltoall", "float32"),
        case(1, "striped", True, 2, "ring_flash_attn", "bfloat16"),
        case(2, "zigzag", True, 2, "yunchang", "bfloat16"),
        case(2, "contiguous", False, 4, "yunchang", "bfloat16"),
        case(1, "zigzag", True, 4, "yunchang", "bfloat16"),
    ]


@pytest.mark.parametrize("world_size", [2, 4])
def test_adapters_match_the_reference(pool, world_size: int) -> None:  # type: ignore[no-untyped-def]
    assert pool(world_size).run(use_stand_ins, timeout=60) == [True] * world_size
    cases = [
        c for c in _cases(world_size) if not (TORCH_CP_MISSING and c.impl.startswith("torch_cp"))
    ]
    runnable, skipped = split_cases(cases, "cpu")
    assert not skipped, skipped
    records = pool(world_size).run(run_cases_on_rank, runnable, timeout=300)[0]
    bad = [(r["label"], r.get("errors"), r.get("error")) for r in records if not r["passed"]]
    assert not bad
    for r in records:
        # within the error model's bound, and under the dtype's coarse allowance unless a known
        # issue loosens that tensor (its `tolerances` are the bounds' absolute parts)
        coarse = TOLERANCE[r["dtype"]]
        loosened = r.get("tolerances", {})
        for name, error in r["errors"].items():
            assert error <= r["bounds"][name], (r["label"], name, error)
            assert error <= max(coarse, loosened.get(name, 0.0)), (r["label"], name, error)
    known = [r for r in records if r.get("known_issues")]
    # Only the float16 contiguous ring-flash-attn case names the bf16 dQ of its backward.
    assert [r["label"] for r in known] == (
        ["ring_flash_attn ring U1xR2 contiguous causal h4/kv4"] if world_size == 2 else []
    )
    if known:
        assert "dq.to(torch.bfloat16)" in known[0]["known_issues"][0]
        assert known[0]["tolerances"]["dq"] == TOLERANCE["bfloat16"]
        assert known[0]["errors"]["out"] <= TOLERANCE["float16"]


def test_library_layouts_equal_cpbench_positions(pool) -> None:  # type: ignore[no-untyped-def]
    """yunchang's extract_local (every ring_impl_type) and torch's context-parallel sharding
    (head-tail / none) give every rank the positions cpbench's layouts define."""
    pool(4).run(use_stand_ins, timeout=60)
    for ulysses, ring in ((1, 4), (2, 2)):
        per_rank = pool(4).run(rank_tasks.impl_layouts, 32, ulysses, ring, timeout=120)
        for rank, checks in enumerate(per_rank):
            assert checks and all(checks.values()), (ulysses, ring, rank, checks)


def test_library_boundary_counting(pool) -> None:  # type: ignore[no-untyped-def]
    per_rank = pool(2).run(rank_tasks.library_counting_cases, timeout=60)
    for rank, counted in enumerate(per_rank):
        uneven = 3 * 32 if rank == 0 else 1 * 32  # rows sent to the other rank, 32 B a row
        assert counted == {
            "fwd:all_to_all": 64 + uneven + 128,  # even, uneven, permute_tensor
            "fwd:all_gather": 128,
            "fwd:p2p": 64 + 128,  # the op built before counting, the one built during
            "fwd:a2a_named": 64,
            "restored": 1,
            "prebuilt_reused": 1,
        }


# ------------------------------------------------------------------ a sweep with impl axis


IMPL_SCENARIO = """
name = "impls"
world_size = 2
device = "cpu"
warmup = 0
iters = 2
precision = "off"
timeout = 120

[axes]
seq_len = 64
heads = 4
kv_heads = 2
head_dim = 16
dtype = "bfloat16"
mesh = ["1x2", "2x1"]
layout = "zigzag"
impl = ["cpbench", "torch_cp", "ring_flash_attn", "yunchang", "transformer_engine"]
"""


def test_sweep_with_impl_axis_and_the_report(  # type: ignore[no-untyped-def]
    tmp_path: Path, pool, lend_the_session_pool: None
) -> None:
    from cpbench.app.report import build_report  # noqa: PLC0415
    from cpbench.app.sweep import run_sweep  # noqa: PLC0415
    from cpbench.render.html.report import render_report  # noqa: PLC0415
    from cpbench.results.scenarios.loading import load_scenario  # noqa: PLC0415
    from cpbench.results.store import read_records, records_frame  # noqa: PLC0415

    path = tmp_path / "impls.toml"
    path.write_text(IMPL_SCENARIO)
    out = tmp_path / "impls.jsonl"
    assert pool(2).run(use_stand_ins, timeout=60) == [True, True]  # the session's ranks
    run_sweep(load_scenario(str(path)), "cpu", 2, out)
    records = read_records(out)
    status = {(r["config"]["impl"], r["config"]["ulysses"]): r["status"] for r in records}
    assert status == {
        ("cpbench", 1): "ok", ("cpbench", 2): "ok",
        ("torch_cp", 1): "skipped" if TORCH_CP_MISSING else "ok", ("torch_cp", 2): "skipped",
        ("ring_flash_attn", 1): "ok", ("ring_flash_attn", 2): "skipped",
        ("yunchang", 1): "ok", ("yunchang", 2): "skipped",
        ("transformer_engine", 1): "skipped", ("transformer_engine", 2): "skipped",
    }
    by_key = {(r["config"]["impl"], r["config"]["ulysses"]): r for r in records}
    assert "has no Ulysses all-to-all" in by_key[("torch_cp", 2)]["error"]
    assert "gloo cannot do" in by_key[("yunchang", 2)]["error"]
    assert "runs only on CUDA" in by_key[("transformer_engine", 1)]["error"]
    cpbench_ring = by_key[("cpbench", 1)]
    for impl in RUNNING_EXTERNALS:
        r = by_key[(impl, 1)]
        assert r["id"].endswith(f"-impl_{impl}")
        assert r["accuracy"]["passed"] and r["accuracy"]["max_abs_error"] < TOLERANCE["bfloat16"]
        comm = r["comm"]
        assert comm["match"] is None and "torch.distributed boundary" in comm["note"]
        # The same K/V hops as cpbench's ring; backward the libraries' fp32 dK/dV accumulator
        # leaves with its chunk at step 0 and makes R = 2 hops, cpbench's R - 1 = 1: one fp32
        # chunk more (twice the bf16 K/V chunk of a forward hop).
        ours = cpbench_ring["comm"]["measured_bytes"]
        assert comm["measured_bytes"]["fwd"] == ours["fwd"]
        extra_chunk = [b + 2 * f for b, f in zip(ours["bwd"], ours["fwd"], strict=True)]
        assert comm["measured_bytes"]["bwd"] == extra_chunk
        extra = (ours["bwd"][0] + 2 * ours["fwd"][0]) / ours["bwd"][0]
        assert comm["model_ratio"] == {"fwd": 1.0, "bwd": pytest.approx(extra, rel=1e-12)}
        timing = r["timing"]
        assert timing["compute_only"] is None and timing["overlap"] is None
        assert "exist only for cpbench" in timing["overlap_note"]
        assert min(r["memory"]["peak_bytes"]) > 0
    assert by_key[("ring_flash_attn", 1)]["config"]["kernel"] == "flash_attn (CPU stand-in)"
    if not TORCH_CP_MISSING:
        assert by_key[("torch_cp", 1)]["environment"]["impl_version"]
    frame = records_frame(records)
    assert set(frame["impl"]) == {"cpbench", "torch_cp", "ring_flash_attn", "yunchang",
                                  "transformer_engine"}
    external = frame[(frame["impl"] != "cpbench") & (frame["status"] == "ok")]
    assert external["comm_mismatch"].isna().all()
    report = render_report(build_report([out]))
    assert "<th scope='col' data-type='text'>impl</th>" in report.html
    for impl in RUNNING_EXTERNALS:
        assert f"{impl} (ring)" in report.html  # its own series in the bytes figure
    assert "mismatch(es)" not in report.html

