"""The judge of every result, fed wrong results directly (no ranks, unit-level): the reference
check's verdict (`bench.reference.judge`, `run_case_on_rank`), the tolerance's error model
(`config.tolerances`), the sampled-row check (`bench.rowcheck`) and the byte comparison of a
record (`app.record`). Each test plants a known error and asserts the verdict; the mutation
check (tests/mutation, docs/mutation.md) shows which defect of the judge each one catches."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import cpbench.attention as attention
from cpbench.app.record import _comm_section
from cpbench.attention.reference import reference_attention, row_visibility
from cpbench.bench import reference as reference_module
from cpbench.bench import rowcheck
from cpbench.bench.reference import CHECKED, judge, run_case_on_rank
from cpbench.config.bench import BenchConfig, VerifyCase
from cpbench.config.masks import MaskSpec
from cpbench.config.tolerances import UNIT_ROUNDOFF, allowed_error, rounded_terms
from cpbench.model.formulas import comm_volume

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _case(dtype: str = "bfloat16", ring: int = 2, heads: int = 4, kv_heads: int = 2) -> VerifyCase:
    return VerifyCase(
        seq_len=32, heads=heads, kv_heads=kv_heads, head_dim=8, batch=2, ulysses=1, ring=ring,
        layout="contiguous", dtype=dtype,
    )  # fmt: skip


def _inputs(case: VerifyCase, seed: int = 3) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout of the case, rounded to its dtype (as the reference's inputs are)."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.seq_len)
    heads = (case.heads, case.kv_heads, case.kv_heads, case.heads)
    dt = DTYPES[case.dtype]
    return tuple(torch.randn(*shape, h, case.head_dim, generator=g).to(dt) for h in heads)


def _attention(inputs: tuple[torch.Tensor, ...], precision: torch.dtype) -> list[torch.Tensor]:
    """out, dq, dk, dv of causal attention computed in `precision` (autograd)."""
    q, k, v, dout = (t.to(precision) for t in inputs)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = reference_attention(*leaves, causal=True)
    out.backward(dout)
    return [out.detach(), *(t.grad for t in leaves if t.grad is not None)]


@pytest.fixture(scope="module")
def judged() -> tuple[VerifyCase, list[torch.Tensor], dict[str, float]]:
    """A bfloat16 GQA case's float64 references and each tensor's bound."""
    case = _case()
    refs = _attention(_inputs(case), torch.float64)
    verdict = judge(case, refs, refs, dict.fromkeys(CHECKED, 0.0))
    return case, refs, verdict["bounds"]


def _shifted(refs: list[torch.Tensor], name: str, delta: float) -> list[torch.Tensor]:
    """The references with `delta` added to one element of tensor `name`."""
    out = [r.clone() for r in refs]
    out[CHECKED.index(name)][1, 5, 1, 3] += delta
    return out


# ------------------------------------------------------------------------ the verdict


def test_results_rounded_once_to_the_dtype_pass(judged: Any) -> None:
    case, refs, _ = judged
    rounded = [r.to(torch.bfloat16) for r in refs]
    verdict = judge(case, rounded, refs, dict.fromkeys(CHECKED, 0.0))
    assert verdict["passed"]
    for name, ref in zip(CHECKED, refs, strict=True):  # one rounding: at most u x |x|
        assert 0 < verdict["errors"][name] <= 2.0**-8 * float(ref.abs().max())


@pytest.mark.parametrize("name", CHECKED)
def test_an_error_just_above_the_bound_fails_and_just_below_passes(judged: Any, name: str) -> None:
    """Per tensor, the others exact: the verdict turns at that tensor's own bound."""
    case, refs, bounds = judged
    absolute = dict.fromkeys(CHECKED, 0.0)
    below = judge(case, _shifted(refs, name, 0.99 * bounds[name]), refs, absolute)
    above = judge(case, _shifted(refs, name, 1.01 * bounds[name]), refs, absolute)
    assert below["passed"] and below["errors"][name] == pytest.approx(0.99 * bounds[name])
    assert not above["passed"]
    assert [n for n in CHECKED if above["errors"][n] > above["bounds"][n]] == [name]


def test_a_wrong_output_and_a_wrong_dk_alone_fail(judged: Any) -> None:
    """5% of the tensor's largest magnitude on one element: 12.8 units of bf16's roundoff,
    where the bound is 5.8 (out, R 2) and 7.1 (dK, R 2, g 2); a tolerance 100x wider passes it."""
    case, refs, _ = judged
    absolute = dict.fromkeys(CHECKED, 0.0)
    for name in ("out", "dk"):
        delta = 0.05 * float(refs[CHECKED.index(name)].abs().max())
        verdict = judge(case, _shifted(refs, name, delta), refs, absolute)
        assert not verdict["passed"], name
        assert verdict["errors"][name] == pytest.approx(delta)
        assert verdict["errors"][name] > verdict["bounds"][name]
        assert verdict["max_error"] == pytest.approx(delta)


def test_the_bound_is_the_error_model_by_hand() -> None:
    """bfloat16, max |ref| 1, ring 2, g 2, L 64: k = 2 + R = 4 for out, 2 + g R = 6 for dK;
    5 (u sqrt(k) + 2^-24 sqrt(64)) / sqrt(3) + 2^-16 = 0.0225694 and 0.0276380"""
    assert rounded_terms("out", 2, 2) == 4 and rounded_terms("dk", 2, 2) == 6
    assert allowed_error("bfloat16", 1.0, 4, 64) == pytest.approx(0.0225694, rel=1e-5)
    assert allowed_error("bfloat16", 1.0, 6, 64) == pytest.approx(0.0276380, rel=1e-5)
    # float32: the accumulator's sqrt(L) walk dominates: L 4096 gives 64 x 2^-24 of it
    assert allowed_error("float32", 1.0, 4, 4096, absolute=0.0) == pytest.approx(
        5 * (2.0**-24 * 2 + 2.0**-24 * 64) / math.sqrt(3), rel=1e-9
    )


# ---------------------------------------------------------- the judge in run_case_on_rank


def _scheme(wrong: str | None) -> Any:
    """A stand-in for cpbench's scheme (`_run_cpbench`): the case in float32 (an
    fp32-accumulating computation), rounded to the dtype; `wrong` scales that tensor's first
    KV head (or query head) by 1.05."""

    def run(case: VerifyCase, inputs: tuple[torch.Tensor, ...], mesh: Any = None) -> list[torch.Tensor]:
        dt = DTYPES[case.dtype]
        rounded = tuple(t.to(dt) for t in inputs)
        results = [t.to(dt) for t in _attention(rounded, torch.float32)]
        if wrong is not None:
            results[CHECKED.index(wrong)][:, :, 0] *= 1.05
        return results

    return run


@pytest.mark.parametrize("wrong", [None, "out", "dk", "dv"])
def test_run_case_on_rank_judges_what_the_scheme_returned(
    monkeypatch: pytest.MonkeyPatch, wrong: str | None
) -> None:
    """The whole rank-0 path of the reference check, its scheme replaced: a right result
    passes, a result wrong in one tensor fails on that tensor alone."""
    monkeypatch.setattr(reference_module, "_run_cpbench", _scheme(wrong))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    result = run_case_on_rank(_case(), torch.device("cpu"))
    assert result is not None
    assert result["passed"] is (wrong is None)
    over = [n for n in CHECKED if result["errors"][n] > result["bounds"][n]]
    assert over == ([] if wrong is None else [wrong])


def _fresh_reference(case: VerifyCase) -> list[torch.Tensor]:
    """The case's float64 reference computed here, from its own global inputs and run mask."""
    q, k, v, dout = reference_module._global_inputs(case, torch.device("cpu"))
    dt = DTYPES[case.dtype]
    leaves = [t.to(dt).double().requires_grad_(True) for t in (q, k, v)]
    out = reference_attention(*leaves, causal=case.causal, mask=case.packing.mask)
    out.backward(dout.to(dt).double())
    return [out.detach(), *(t.grad for t in leaves if t.grad is not None)]


def _cached(case: VerifyCase, memo: reference_module.ReferenceMemo) -> list[torch.Tensor]:
    return reference_module.reference_results(
        case, reference_module._global_inputs(case, torch.device("cpu")), memo
    )


def test_the_reference_is_shared_by_meshes_and_layouts_and_by_nothing_else() -> None:
    """`reference_results` with a memo computes a problem once for all its meshes and layouts
    (the same tensors, equal to a fresh computation) and never hands one problem another's: a
    case differing in mask, window, causality, dtype, KV heads, seed or doc_zigzag's padded
    length gets its own reference, equal to its fresh one."""
    memo = reference_module.ReferenceMemo()
    base = replace(_case("float32"), documents=(5, 11, 16))
    first = _cached(base, memo)
    for same in (replace(base, ulysses=2, ring=1), replace(base, layout="zigzag")):
        assert all(a is b for a, b in zip(_cached(same, memo), first, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(first, _fresh_reference(base), strict=True))
    others = [
        replace(base, documents=(16, 5, 11)), replace(base, documents=None, window=7),
        replace(base, documents=None), replace(base, documents=None, causal=False),
        replace(base, dtype="bfloat16"), replace(base, kv_heads=1), replace(base, seed=1),
        replace(base, layout="doc_zigzag"),
    ]  # fmt: skip
    for other in others:
        got = _cached(other, memo)
        assert all(torch.equal(a, b) for a, b in zip(got, _fresh_reference(other), strict=True))
        assert not all(torch.equal(a, b) for a, b in zip(got, first, strict=True)), other.label


def test_a_reference_over_the_memo_bound_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is kept without a memo (a sweep's reference check) or past the memo's bound,
    where the least recently used goes first."""
    case = _case("float32")
    inputs = reference_module._global_inputs(case, torch.device("cpu"))
    alone = reference_module.reference_results(case, inputs)
    assert all(a is not b for a, b in zip(alone, reference_module.reference_results(case, inputs), strict=True))
    size = sum(t.numel() * t.element_size() for t in _fresh_reference(case))
    memo = reference_module.ReferenceMemo()
    monkeypatch.setattr(reference_module, "REFERENCE_MEMO_BYTES", size - 1)
    first = _cached(case, memo)
    assert not memo.references
    assert all(a is not b for a, b in zip(_cached(case, memo), first, strict=True))
    monkeypatch.setattr(reference_module, "REFERENCE_MEMO_BYTES", 2 * size)
    _cached(case, memo), _cached(replace(case, seed=1), memo), _cached(replace(case, seed=2), memo)
    assert [key[0] for key in memo.references] == [1, 2]  # seed 0's, the oldest, went first


# ---------------------------------------------------------------- the accumulator's precision


def _weighted_sum(p: torch.Tensor, v: torch.Tensor, accumulator: torch.dtype) -> torch.Tensor:
    """sum_j p_j v_j over the keys, p rounded to bf16 (as a kernel's second GEMM takes it), the
    running sum kept in `accumulator`, the result rounded to bf16. p [B, H, Q, K], v [B, K, H, D]."""
    p = p.to(torch.bfloat16).float()
    vv = v.float().permute(0, 2, 1, 3)  # [B, H, K, D]
    acc = torch.zeros(*p.shape[:3], v.shape[-1], dtype=accumulator)
    for j in range(p.shape[-1]):
        acc = (acc.float() + p[..., j : j + 1] * vv[:, :, j : j + 1]).to(accumulator)
    return acc.permute(0, 2, 1, 3).to(torch.bfloat16)


def test_a_bf16_accumulator_fails_where_an_fp32_one_passes() -> None:
    """Causal attention, L 1024, bf16 inputs (V with mean 1, as activations have), forward:
    the softmax-weighted sum accumulated in fp32 stays within the bound (measured 1.0 u x M);
    accumulated in bf16 it misses it by far (measured 21.6 u x M against a bound of 5.0 u x M;
    the old bound, 5e-2 + 2^-6 M, is 8.5 u x M here)."""
    length, heads, dim = 1024, 2, 16
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, length, heads, dim, generator=g).bfloat16() for _ in range(2))
    v = (torch.randn(1, length, heads, dim, generator=g) + 1.0).bfloat16()
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(dim)
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), -math.inf)
    p = torch.softmax(scores, dim=-1)
    ref = torch.einsum("bhqk,bkhd->bqhd", p, v.double())
    top = float(ref.abs().max())
    bound = allowed_error("bfloat16", top, rounded_terms("out", 1, 1), length)
    fp32 = float((_weighted_sum(p.float(), v, torch.float32).double() - ref).abs().max())
    bf16 = float((_weighted_sum(p.float(), v, torch.bfloat16).double() - ref).abs().max())
    u = UNIT_ROUNDOFF["bfloat16"]
    assert fp32 < 0.5 * bound, (fp32 / (u * top), bound / (u * top))
    assert bf16 > 2 * bound, (bf16 / (u * top), bound / (u * top))


# ----------------------------------------------------------------- the sampled-row check


def test_sampled_rows_are_spread_and_include_both_ends() -> None:
    assert rowcheck.sampled_rows(601, 7).tolist() == [0, 100, 200, 300, 400, 500, 600]
    assert rowcheck.sampled_rows(5, 256).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "mask", [MaskSpec(), MaskSpec(documents=(5, 11, 16)), MaskSpec(documents=(20, 12), window=4)]
)
def test_reference_rows_equal_the_full_reference_under_the_mask(mask: MaskSpec) -> None:
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 32, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 32, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    rows = torch.tensor([0, 4, 5, 17, 31])
    got = rowcheck.reference_rows(q[:, rows], k, v, row_visibility(mask, rows, 32))
    full = reference_attention(q, k, v, mask=mask)[:, rows]
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)


def _row_config() -> BenchConfig:
    return BenchConfig(
        seq_len=96, heads=2, kv_heads=1, head_dim=8, batch=1, ulysses=1, ring=1,
        layout="contiguous", dtype="bfloat16", documents=(40, 56), device="cpu", world_size=1,
    )  # fmt: skip


@pytest.mark.parametrize("wrong_row", [None, 0, 95, 48])
def test_row_check_passes_a_right_forward_and_fails_one_wrong_row(
    monkeypatch: pytest.MonkeyPatch, wrong_row: int | None
) -> None:
    """One process (U = R = 1), the scheme replaced by the masked forward in float32 rounded
    to bf16: right, it passes; 5% of M added to one sampled row (the first, the last, one
    inside), it fails. 7 rows of 96 sampled: 0, 16, 32, 48, 63, 79, 95."""
    config = _row_config()

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any) -> Any:
        out = reference_attention(q.float(), k.float(), v.float(), mask=config.packing.mask)
        out = out.to(q.dtype)
        if wrong_row is not None:
            out[:, wrong_row] += 0.05 * float(out.abs().max())
        return out

    monkeypatch.setattr(attention, "build_mesh", lambda ulysses, ring: None)
    monkeypatch.setattr(attention, "cp_attention", forward)
    result = rowcheck.full_length_row_check(config, None, torch.device("cpu"), rows=7)  # type: ignore[arg-type]
    assert result["rows"] == 7
    assert result["passed"] is (wrong_row is None)
    assert (result["max_abs_error"] > result["bound"]) is (wrong_row is not None)


# ------------------------------------------------------------------- the byte comparison


def _bytes_config() -> BenchConfig:
    return BenchConfig(
        seq_len=64, heads=4, kv_heads=2, head_dim=8, batch=1, ulysses=2, ring=2,
        layout="zigzag", dtype="float32", device="cpu", world_size=4,
    )  # fmt: skip


def _expected(config: BenchConfig) -> dict[str, dict[str, int]]:
    volume = comm_volume(config)
    return {
        key: {c.name: c.bytes_sent for c in volume.collectives(phase)}
        for key, phase in (("fwd", "forward"), ("bwd", "backward"))
    }


def _ranks(counted: list[dict[str, dict[str, int]]]) -> list[Any]:
    return [SimpleNamespace(bytes=c) for c in counted]


def test_bytes_equal_to_the_model_on_every_rank_match() -> None:
    config = _bytes_config()
    expected = _expected(config)
    comm = _comm_section(config, _ranks([expected] * 4), None)
    assert comm.match is True and comm.counted_at == "torch.distributed"
    assert comm.analytic_bytes == {p: sum(v.values()) for p, v in expected.items()}


def test_a_rank_that_sent_two_bytes_more_is_a_mismatch() -> None:
    config = _bytes_config()
    expected = _expected(config)
    name = next(iter(expected["bwd"]))
    off = {**expected, "bwd": {**expected["bwd"], name: expected["bwd"][name] + 2}}
    comm = _comm_section(config, _ranks([expected, expected, off, expected]), None)
    assert comm.match is False
    assert comm.measured_bytes["bwd"][2] == comm.analytic_bytes["bwd"] + 2
    assert comm.by_collective is not None
    assert comm.by_collective["bwd"][name].measured[2] == expected["bwd"][name] + 2


def test_bytes_moved_between_collectives_are_a_mismatch_although_the_total_agrees() -> None:
    config = _bytes_config()
    expected = _expected(config)
    first, second = sorted(expected["fwd"])[:2]
    moved = dict(expected["fwd"])
    moved[first] += 64
    moved[second] -= 64
    comm = _comm_section(config, _ranks([{**expected, "fwd": moved}] * 4), None)
    assert comm.measured_bytes["fwd"] == [comm.analytic_bytes["fwd"]] * 4
    assert comm.match is False


# ---------------------------------------------------------------- the verdict's exit code


@pytest.mark.parametrize(("verdicts", "code"), [((True, True), 0), ((True, False), 1)])
def test_verify_exits_1_when_a_case_failed_its_check(
    monkeypatch: pytest.MonkeyPatch, verdicts: tuple[bool, ...], code: int
) -> None:
    """`cpbench verify` with its cases' verdicts given (the run replaced): one failed case is
    exit 1, all passed exit 0 (nccl-tests' rule)."""
    from typer.testing import CliRunner  # noqa: PLC0415

    import cpbench.app.verify as verify_service  # noqa: PLC0415
    from cpbench.cli.main import app  # noqa: PLC0415

    records = [verify_service.VerifyRow(label=f"case {i}", passed=p, record={"label": f"case {i}"})
               for i, p in enumerate(verdicts)]  # fmt: skip
    monkeypatch.setattr(verify_service, "run_verify", lambda *a, **k: records)
    result = CliRunner().invoke(app, ["verify", "--world-size", "2", "--device", "cpu", "--json"])
    assert result.exit_code == code, result.output
