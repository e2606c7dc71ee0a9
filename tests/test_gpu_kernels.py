"""The GPU kernels' logic on a CPU: which kernel `select_kernel` picks for every device, dtype
and installed library (availability faked by monkeypatching), flash-attn's inputs handed over
without copies (on the test-only stand-in), and the argument marshalling of the CUDA SDPA,
memory-efficient, cuDNN and FlashAttention-3 kernels against fakes of the ops that check what
they are given and compute with the einsum kernel, so every result is also checked against
the float64 reference."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from cpbench import compat
from cpbench.attention.kernels import (
    CpuSdpaKernel,
    CudaSdpaKernel,
    CudnnKernel,
    EfficientKernel,
    FlashAttn3Kernel,
    FlashAttnKernel,
    NaiveKernel,
    auto_kernel_name,
    band_capable,
    default_scale,
    kernel_unavailable,
    kernel_version,
    ops,
    select,
    select_kernel,
)
from cpbench.attention.kernels import flash_attn3 as fa3_module
from cpbench.attention.kernels.base import band_mask, causal_mask
from cpbench.attention.reference import reference_attention
from cpbench.errors import CpbenchError
from tests import flash_rules
from tests.impl_support import use_stand_ins

TOL = 2e-5  # float32 einsum (inside the fakes) against float64
B, D = 2, 16
SCALE = default_scale(D)
NAIVE = NaiveKernel()


def _inputs(s: int, heads: int, kv_heads: int, dtype: torch.dtype = torch.float32) -> dict:
    """q, dout [B, S, H, D]; k, v as views of a packed [B, S, 2, h_kv, D] buffer (the ring's)."""
    g = torch.Generator().manual_seed(heads * 100 + kv_heads * 10 + s)
    kv = torch.randn(B, s, 2, kv_heads, D, generator=g).to(dtype)
    return {
        "q": torch.randn(B, s, heads, D, generator=g).to(dtype),
        "kv": kv,
        "k": kv[:, :, 0],
        "v": kv[:, :, 1],
        "dout": torch.randn(B, s, heads, D, generator=g).to(dtype),
    }


def _check_against_reference(kernel: Any, x: dict, causal: bool, tol: float) -> None:
    """Forward (out, LSE) and backward with the given out/LSE against the float64 reference."""
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    out, lse = kernel.forward(q, k, v, causal, SCALE)
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = reference_attention(*ref_in, causal=causal, scale=SCALE)
    ref.backward(dout.double())
    _, ref_lse = NaiveKernel().forward(*(t.double() for t in (q, k, v)), causal, SCALE)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.dtype == torch.float32 and lse.shape == (B, q.shape[2], q.shape[1])
    assert (out.double() - ref).abs().max() < tol
    assert (lse.double() - ref_lse).abs().max() < tol
    grads = kernel.backward(dout, q, k, v, out, lse, causal, SCALE)
    for got, want in zip(grads, ref_in, strict=True):
        assert got.shape == want.shape
        assert (got.double() - want.grad).abs().max() < tol


# ----------------------------------------------------------------------------- selection


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Fake what is installed: torch version, cuDNN, GPU capability, flash-attn 2 and 3.
    `select_kernel` then returns the kernel class instead of an instance."""

    def setup(
        torch_version: str = "2.8.0",
        cudnn: int | None = 90100,
        capability: tuple[int, int] | None = (9, 0),
        fa2: bool = False,
        fa3: bool = False,
        fa2_version: tuple[int, int, int] = (2, 8, 3),
    ) -> None:
        monkeypatch.setattr(torch, "__version__", torch_version)
        monkeypatch.setattr(select, "flash_attn_version", lambda: fa2_version if fa2 else None)
        monkeypatch.setattr(ops, "cudnn_version", lambda: cudnn)
        monkeypatch.setattr(
            ops, "device_capability", lambda d: capability if d.type == "cuda" else None
        )
        monkeypatch.setattr(select, "flash_attn_available", lambda: fa2)
        monkeypatch.setattr(select, "flash_attn3_available", lambda: fa3)
        monkeypatch.setattr(select, "_kernel_instance", lambda cls: cls)

    return setup


BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


@pytest.mark.parametrize(
    ("env", "device", "dtype", "expected"),
    [
        # CUDA fp16/bf16: FA3 on Hopper > flash-attn > cuDNN on Hopper+ > PyTorch's flash op
        ({"fa3": True, "fa2": True}, "cuda", BF16, FlashAttn3Kernel),
        ({"fa3": True, "fa2": True}, "cuda", FP16, FlashAttn3Kernel),
        ({"fa3": True, "fa2": True, "capability": (8, 0)}, "cuda", BF16, FlashAttnKernel),
        ({"fa3": True, "capability": (10, 0)}, "cuda", BF16, CudnnKernel),
        ({"fa2": True}, "cuda", BF16, FlashAttnKernel),
        ({}, "cuda", BF16, CudnnKernel),
        ({"capability": (10, 0)}, "cuda", FP16, CudnnKernel),
        ({"capability": (8, 0)}, "cuda", BF16, CudaSdpaKernel),
        ({"cudnn": 8907}, "cuda", BF16, CudaSdpaKernel),
        ({"cudnn": None}, "cuda", BF16, CudaSdpaKernel),
        ({"torch_version": "2.4.1"}, "cuda", BF16, CudaSdpaKernel),
        # float32 on CUDA: the memory-efficient op, whatever else is installed
        ({"fa3": True, "fa2": True}, "cuda", FP32, EfficientKernel),
        ({"cudnn": None, "capability": (7, 0)}, "cuda", FP32, EfficientKernel),
        # before Ampere (T4, V100) neither flash kernel runs: the memory-efficient op
        ({"fa2": True, "capability": (7, 5)}, "cuda", FP16, EfficientKernel),
        ({"capability": (7, 0)}, "cuda", FP16, EfficientKernel),
        # float64 stays with einsum; the CPU keeps its fused op
        ({"fa3": True, "fa2": True}, "cuda", FP64, NaiveKernel),
        ({"fa3": True, "fa2": True}, "cpu", FP32, CpuSdpaKernel),
        ({}, "cpu", BF16, CpuSdpaKernel),
        ({}, "cpu", FP64, NaiveKernel),
    ],
)
def test_auto_picks_the_fastest_usable_kernel(fake_env, env, device, dtype, expected) -> None:  # type: ignore[no-untyped-def]
    fake_env(**env)
    assert select_kernel(device, dtype) is expected
    assert select_kernel(device, dtype, "auto") is expected


@pytest.mark.parametrize(
    ("env", "device", "dtype", "name", "missing"),
    [
        ({"fa3": True}, "cpu", BF16, "flash_attn3", "needs a CUDA device"),
        ({"fa3": True}, "cuda", FP32, "flash_attn3", "fp16/bf16"),
        ({"fa3": True, "capability": (8, 0)}, "cuda", BF16, "flash_attn3", "Hopper"),
        ({"fa3": False}, "cuda", BF16, "flash_attn3", "flash_attn_interface"),
        ({}, "cpu", BF16, "cudnn", "needs a CUDA device"),
        ({}, "cuda", FP32, "cudnn", "fp16/bf16"),
        ({"torch_version": "2.4.1"}, "cuda", BF16, "cudnn", "torch >= 2.5"),
        ({"cudnn": None}, "cuda", BF16, "cudnn", "needs cuDNN"),
        ({"cudnn": 8907}, "cuda", BF16, "cudnn", "cuDNN >= 9.0"),
        ({"capability": (7, 5)}, "cuda", BF16, "cudnn", "compute capability >= 8.0"),
        ({}, "cpu", FP32, "efficient", "needs a CUDA device"),
        ({}, "cuda", FP64, "efficient", "float32/fp16/bf16"),
        ({}, "cuda", FP32, "sdpa", "kernel 'efficient'"),
        ({"fa2": False}, "cuda", BF16, "flash_attn", "flash-attn >= 2.7"),
        ({"fa2": True}, "cuda", FP32, "flash_attn", "fp16/bf16"),
        ({"fa2": True, "capability": (7, 5)}, "cuda", FP16, "flash_attn", "Ampere or newer"),
        ({"capability": (7, 0)}, "cuda", FP16, "sdpa", "compute capability >= 8.0"),
        ({"capability": (7, 5)}, "cuda", BF16, "efficient", "bf16 only from compute capability"),
    ],
)
def test_impossible_explicit_choice_names_what_is_missing(  # type: ignore[no-untyped-def]
    fake_env, env, device, dtype, name, missing
) -> None:
    fake_env(**env)
    with pytest.raises(CpbenchError, match=f"kernel '{name}' .*") as info:
        select_kernel(device, dtype, name)
    assert missing in str(info.value)


# What each kernel can run, written out by hand per environment (not computed with the code's
# own rules): (env, device, dtype, head_dim) -> {kernel: None (usable) or words of the reason}.
H100 = {"capability": (9, 0), "cudnn": 90100, "fa2": True, "fa3": True}
USABLE_BY_HAND: list[tuple[dict, str, torch.dtype, int | None, dict[str, str | None]]] = [
    (H100, "cuda", BF16, 128, {
        "flash_attn3": None, "flash_attn": None, "cudnn": None, "sdpa": None,
        "efficient": None, "naive": None,
    }),
    (H100, "cuda", BF16, 192, {  # cuDNN's bound is 128; the flash kernels' 256
        "flash_attn3": None, "flash_attn": None, "cudnn": "<= 128", "sdpa": None,
        "efficient": None, "naive": None,
    }),
    (H100, "cuda", FP16, 512, {
        "flash_attn3": "<= 256", "flash_attn": "<= 256", "cudnn": "<= 128", "sdpa": "<= 256",
        "efficient": None, "naive": None,
    }),
    (H100, "cuda", BF16, 12, {  # the memory-efficient op too: 16-bit GEMMs align to 8
        "flash_attn3": "12 % 8 = 4", "flash_attn": "12 % 8 = 4", "cudnn": "12 % 8 = 4",
        "sdpa": "12 % 8 = 4", "efficient": "12 % 8 = 4", "naive": None,
    }),
    (H100, "cuda", FP32, 12, {"efficient": None, "naive": None}),  # float32 aligns to 4
    (H100, "cuda", FP32, 6, {"efficient": "6 % 4 = 2", "naive": None}),
    ({"capability": (7, 5)}, "cuda", FP32, 6, {"efficient": None}),  # no alignment below sm80
    ({"capability": (7, 5)}, "cuda", FP16, 12, {"efficient": "12 % 8 = 4"}),  # tensor cores
    ({"capability": (6, 0)}, "cuda", FP16, 12, {"efficient": None}),  # none before sm70
    (H100, "cuda", FP32, 64, {
        "flash_attn3": "fp16/bf16", "flash_attn": "fp16/bf16", "cudnn": "fp16/bf16",
        "sdpa": "kernel 'efficient'", "efficient": None, "naive": None,
    }),
    ({"capability": (8, 0), "fa2": True, "fa3": True}, "cuda", BF16, 64, {  # A100
        "flash_attn3": "Hopper", "flash_attn": None, "cudnn": None, "sdpa": None,
        "efficient": None, "naive": None,
    }),
    ({"capability": (7, 5), "fa2": True}, "cuda", FP16, 64, {  # T4
        "flash_attn3": "Hopper", "flash_attn": "Ampere or newer",
        "cudnn": "compute capability >= 8.0", "sdpa": "compute capability >= 8.0",
        "efficient": None, "naive": None,
    }),
    ({"capability": (7, 5)}, "cuda", BF16, 64, {  # T4 has no bf16 tensor cores
        "efficient": "bf16 only from compute capability", "naive": None,
    }),
    # Blackwell with flash-attn 2.7.2 (admits 8.x and 9.0 only) and with 2.7.4 (any >= 8.0)
    ({"capability": (10, 0), "fa2": True, "fa2_version": (2, 7, 2)}, "cuda", BF16, 64, {
        "flash_attn": "8.x and 9.0 only", "flash_attn3": "Hopper", "cudnn": None,
    }),
    ({"capability": (12, 0), "fa2": True, "fa2_version": (2, 7, 4)}, "cuda", BF16, 64, {
        "flash_attn": None,
    }),
    ({"capability": (9, 0), "fa2": True, "fa2_version": (2, 7, 0)}, "cuda", BF16, 64, {
        "flash_attn": None,  # 9.0 is admitted by the old check
    }),
    ({"torch_version": "2.4.1", "cudnn": 90100}, "cuda", BF16, 64, {
        "cudnn": "torch >= 2.5", "flash_attn": "flash-attn >= 2.7",
    }),
    ({"cudnn": 8907}, "cuda", BF16, 64, {"cudnn": "cuDNN >= 9.0"}),
    ({}, "cpu", FP32, 12, {  # the CPU op and einsum take any head dimension
        "sdpa": None, "naive": None, "flash_attn": "needs CUDA", "cudnn": "needs a CUDA",
        "efficient": "needs a CUDA device", "flash_attn3": "needs a CUDA device",
    }),
]


@pytest.mark.parametrize(("env", "device", "dtype", "head_dim", "usable"), USABLE_BY_HAND)
def test_which_kernel_runs_where_by_hand(fake_env, env, device, dtype, head_dim, usable) -> None:  # type: ignore[no-untyped-def]
    """Each kernel's verdict against an expectation written out per case (capability,
    libraries, dtype, head dimension): usable, or the words of its rule; an explicit choice
    raises exactly then, naming the kernel."""
    fake_env(**env)
    for name, words in usable.items():
        reason = kernel_unavailable(name, device, dtype, head_dim)
        if words is None:
            assert reason is None, (name, reason)
            select_kernel(device, dtype, name, head_dim=head_dim)
        else:
            assert reason is not None and words in reason, (name, reason)
            with pytest.raises(CpbenchError, match=f"kernel '{name}'"):
                select_kernel(device, dtype, name, head_dim=head_dim)


@pytest.mark.parametrize(
    ("env", "dtype", "head_dim", "band", "expected"),
    [
        (H100, BF16, 128, False, "flash_attn3"),
        (H100, BF16, 256, False, "flash_attn3"),
        (H100, BF16, 512, False, "efficient"),  # no flash / cuDNN kernel takes 512
        (H100, BF16, 40, False, "flash_attn3"),
        (H100, BF16, 12, False, "naive"),  # 12 is no multiple of 8: not even memory-efficient
        (H100, FP32, 12, False, "efficient"),  # float32 aligns to 4
        (H100, FP32, 6, False, "naive"),
        ({"capability": (9, 0), "cudnn": 90100}, BF16, 128, False, "cudnn"),
        ({"capability": (9, 0), "cudnn": 90100}, BF16, 192, False, "sdpa"),  # cuDNN <= 128
        ({"capability": (10, 0), "fa2": True, "fa2_version": (2, 7, 2)}, BF16, 64, False, "cudnn"),
        # flash-attn 2.7 refuses sm100: the band goes to the memory-efficient op's bias
        ({"capability": (10, 0), "fa2": True, "fa2_version": (2, 7, 2)}, BF16, 64, True, "efficient"),
        ({"capability": (10, 0), "fa2": True, "fa2_version": (2, 8, 3)}, BF16, 64, True, "flash_attn"),
        ({"capability": (8, 0), "fa2": True}, BF16, 264, True, "efficient"),  # refuses the band
    ],
)
def test_auto_picks_a_kernel_that_runs_the_head_dim(fake_env, env, dtype, head_dim, band, expected) -> None:  # type: ignore[no-untyped-def]
    fake_env(**env)
    assert auto_kernel_name("cuda", dtype, band, head_dim) == expected


def test_a_sweep_records_a_head_dim_the_named_kernel_cannot_run_as_skipped() -> None:
    """The parent's check before any rank exists (no CUDA query): flash_attn at head_dim 12
    or 264 and cuDNN at 192 are `skipped` with the rule; `auto` and the head dimensions the
    kernel runs are not (main ran them and raised in the kernel mid-sweep)."""
    from cpbench.app.sweep import impl_skip_reason  # noqa: PLC0415
    from cpbench.results.scenarios.loading import parse_scenario  # noqa: PLC0415

    spec = parse_scenario(
        {"axes": {"seq_len": 64, "heads": 4, "kv_heads": 4, "head_dim": [12, 64, 192, 264],
                  "dtype": "bfloat16", "mesh": ["1x2"], "layout": ["zigzag"],
                  "backend": ["auto", "flash_attn", "cudnn", "efficient"]}},
        "head-dims.toml",
    )  # fmt: skip
    reasons = {
        (c.kernel, c.head_dim): impl_skip_reason(c) for c, _ in spec.expand("cuda", 2)
    }
    skipped = {key for key, reason in reasons.items() if reason}
    assert skipped == {
        ("flash_attn", 12), ("flash_attn", 264), ("cudnn", 12), ("cudnn", 192), ("cudnn", 264),
        ("efficient", 12),  # bf16: the memory-efficient op's GEMMs align to 8 on sm80+
    }
    assert "head_dim 12" in str(reasons[("flash_attn", 12)])
    assert "multiple of 8 (12 % 8 = 4)" in str(reasons[("flash_attn", 12)])
    assert "<= 128" in str(reasons[("cudnn", 192)])
    assert all(impl_skip_reason(c) is None for c, _ in spec.expand("cpu", 2))


def test_version_rules_for_native_gqa() -> None:
    assert not compat.cuda_flash_supports_gqa("2.4.1")
    assert compat.cuda_flash_supports_gqa("2.5.0+cu121")
    assert compat.cuda_flash_supports_gqa("2.9.1")
    assert not compat.cudnn_attention_supports_gqa("2.7.1+cu126")
    assert compat.cudnn_attention_supports_gqa("2.8.0")


# ----------------------------------------------------------------------------- op marshalling


class FakeOp:
    """Stands for `torch.ops.aten.<name>.default`: the installed torch's real schema (so the
    argument names are checked), a recording of every call, and an implementation."""

    def __init__(self, name: str, impl: Callable[..., Any], schema: Any = None) -> None:
        self._schema = schema or getattr(torch.ops.aten, name).default._schema
        self.impl = impl
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        names = {a.name for a in self._schema.arguments}
        assert set(kwargs) <= names, set(kwargs) - names
        self.calls.append(kwargs)
        return self.impl(**kwargs)


def _bshd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def _fake_flash(**a: Any) -> tuple:
    out, lse = NAIVE.forward(_bshd(a["query"]), _bshd(a["key"]), _bshd(a["value"]),
                             a["is_causal"], a["scale"])  # fmt: skip
    empty = torch.empty(0)
    sq, sk = a["query"].shape[2], a["key"].shape[2]
    return _bshd(out), lse, empty, empty, sq, sk, torch.zeros(2), torch.zeros(()), empty


def _fake_flash_backward(**a: Any) -> tuple:
    assert a["logsumexp"].is_contiguous() and a["max_q"] == a["query"].shape[2]
    assert a["max_k"] == a["key"].shape[2] and a["dropout_p"] == 0.0
    grads = NAIVE.backward(*(_bshd(a[n]) for n in ("grad_out", "query", "key", "value", "out")),
                           a["logsumexp"], a["is_causal"], a["scale"])  # fmt: skip
    return tuple(_bshd(g) for g in grads)


def _checked_bias(a: dict[str, Any]) -> torch.Tensor | None:
    """The op's `attn_bias` as `_efficient_attention_forward` / `_backward` check it (aten
    transformers/cuda/attention.cu and mem_eff_attention/kernel_forward.h): the query's dtype,
    4-D [B, H, Sq, Sk], the last dimension contiguous, the row stride (and the batch and head
    strides where there is more than one) a multiple of kAlignmentQ (128 bits of the dtype on
    sm80+), the data pointer aligned the same."""
    bias, q, k = a["attn_bias"], a["query"], a["key"]
    if bias is None:
        return None
    assert bias.dtype == q.dtype, "invalid dtype for bias - should match query's dtype"
    assert bias.dim() == 4, "Bias expected in BMHK format"
    assert tuple(bias.shape) == (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), "wrong shape"
    assert bias.stride(3) == 1, "attn_bias: wrong alignment (last dimension must be contiguous)"
    align = 16 // q.element_size()
    for dim, name in enumerate("BHM"):
        assert bias.shape[dim] <= 1 or bias.stride(dim) % align == 0, f"not aligned (stride{name})"
    assert bias.data_ptr() % 16 == 0
    return bias


def _biased_scores(a: dict[str, Any], bias: torch.Tensor) -> torch.Tensor:
    """float64 scores [B, H, Sq, Sk] with the bias added (and the causal flag applied)."""
    s = torch.einsum("bhqd,bhkd->bhqk", a["query"].double(), a["key"].double()) * a["scale"]
    s = s + bias.double()
    if a["is_causal"]:
        keep = causal_mask(s.shape[2], s.shape[3], 0, s.device)
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _fake_efficient(**a: Any) -> tuple:
    """Like the CUDA op: equal head counts only, the LSE padded to a multiple of 32; a bias
    checked as the op checks it, and a row it hides whole is NaN (the fake does not promise
    what the op leaves there: the kernel must not rely on it)."""
    assert a["key"].shape[1] == a["query"].shape[1], "the efficient op wants equal heads"
    assert a["compute_log_sumexp"] is True
    bias = _checked_bias(a)
    if bias is None:
        out, lse = NAIVE.forward(_bshd(a["query"]), _bshd(a["key"]), _bshd(a["value"]),
                                 a["is_causal"], a["scale"])  # fmt: skip
        out = _bshd(out)
    else:
        s = _biased_scores(a, bias)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1))  # NaN in a row hidden whole
        out = torch.einsum("bhqk,bhkd->bhqd", p, a["value"].double()).to(a["query"].dtype)
        lse = lse.float()
    sq = lse.shape[-1]
    padded = torch.full((*lse.shape[:-1], -(-sq // 32) * 32), float("nan"))
    padded[..., :sq] = lse
    return out, padded, torch.zeros(()), torch.zeros(())


def _fake_efficient_backward(**a: Any) -> tuple:
    sq = a["query"].shape[2]
    lse = a["logsumexp"]
    assert lse.is_contiguous() and lse.shape[-1] == -(-sq // 32) * 32
    assert a["key"].shape[1] == a["query"].shape[1]
    assert a["grad_input_mask"] == [True, True, True, False]
    bias = _checked_bias(a)
    if bias is None:
        grads = NAIVE.backward(
            *(_bshd(a[n]) for n in ("grad_out_", "query", "key", "value", "out")),
            lse[..., :sq], a["is_causal"], a["scale"])  # fmt: skip
        return (*(_bshd(g) for g in grads), torch.empty(0))
    # the flash backward's arithmetic: P from the given LSE, D = rowsum(dO * O)
    s = _biased_scores(a, bias)
    p = torch.exp(s - lse[..., :sq].double().unsqueeze(-1))
    do, q, k, v = (a[n].double() for n in ("grad_out_", "query", "key", "value"))
    dv = torch.einsum("bhqk,bhqd->bhkd", p, do)
    dp = torch.einsum("bhqd,bhkd->bhqk", do, v)
    ds = p * (dp - (do * a["out"].double()).sum(-1, keepdim=True))
    dq = torch.einsum("bhqk,bhkd->bhqd", ds, k) * a["scale"]
    dk = torch.einsum("bhqk,bhqd->bhkd", ds, q) * a["scale"]
    dtype = a["query"].dtype
    return dq.to(dtype), dk.to(dtype), dv.to(dtype), torch.empty(0)


def _fake_cudnn(**a: Any) -> tuple:
    """Like cuDNN in torch 2.5: output in its own [B, H, S, D]-contiguous layout, LSE 4-D; one
    key refused, as torch's dispatcher refuses it (`check_cudnn_tensor_shapes`)."""
    assert a["key"].shape[2] > 1, "cuDNN attention with a key/value length of 1"
    assert a["attn_bias"] is None and a["compute_log_sumexp"] is True
    out, lse = NAIVE.forward(_bshd(a["query"]), _bshd(a["key"]), _bshd(a["value"]),
                             a["is_causal"], a["scale"])  # fmt: skip
    sq, sk = a["query"].shape[2], a["key"].shape[2]
    seed = torch.zeros(())
    return _bshd(out).contiguous(), lse.unsqueeze(-1), None, None, sq, sk, seed, seed, None


def _fake_cudnn_backward(**a: Any) -> tuple:
    assert a["key"].shape[2] > 1, "cuDNN attention with a key/value length of 1"
    lse = a["logsumexp"]
    assert lse.dim() == 4 and lse.shape[-1] == 1 and lse.is_contiguous()
    assert a["grad_out"].stride() == a["out"].stride(), "dO in O's layout"
    assert a["max_q"] == a["query"].shape[2] and a["max_k"] == a["key"].shape[2]
    grads = NAIVE.backward(*(_bshd(a[n]) for n in ("grad_out", "query", "key", "value", "out")),
                           lse.squeeze(-1), a["is_causal"], a["scale"])  # fmt: skip
    return tuple(_bshd(g) for g in grads)


FAKES = {
    "_scaled_dot_product_flash_attention": _fake_flash,
    "_scaled_dot_product_flash_attention_backward": _fake_flash_backward,
    "_scaled_dot_product_efficient_attention": _fake_efficient,
    "_scaled_dot_product_efficient_attention_backward": _fake_efficient_backward,
    "_scaled_dot_product_cudnn_attention": _fake_cudnn,
    "_scaled_dot_product_cudnn_attention_backward": _fake_cudnn_backward,
}


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeOp]:
    fakes = {name: FakeOp(name, impl) for name, impl in FAKES.items()}
    monkeypatch.setattr(ops, "aten_op", lambda name: fakes[name])
    return fakes


KERNEL_CASES = [
    # (kernel class, torch version, whether K/V should reach the op with their own heads)
    (CudaSdpaKernel, "2.5.0", True),
    (CudaSdpaKernel, "2.4.1", False),
    (EfficientKernel, "2.9.0", False),
    (CudnnKernel, "2.8.0", True),
    (CudnnKernel, "2.7.1", False),
]


@pytest.mark.parametrize(("cls", "version", "native"), KERNEL_CASES)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("s", [32, 40])
def test_aten_kernels_marshal_and_match_reference(  # type: ignore[no-untyped-def]
    monkeypatch, fake_ops, cls, version, native, heads, kv_heads, causal, s
) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    kernel = cls()
    x = _inputs(s, heads, kv_heads)
    _check_against_reference(kernel, x, causal, TOL)
    fwd, bwd = (c for n, c in fake_ops.items() if c.calls)
    for call in (fwd.calls[-1], bwd.calls[-1]):
        # [B, H, S, D] views of our tensors, scale and mask as given
        assert call["query"].shape == (B, heads, s, D)
        assert call["key"].shape == (B, kv_heads if native else heads, s, D)
        assert call["is_causal"] is causal and call["scale"] == SCALE
        assert call["dropout_p"] == 0.0
    if native:  # no copy at all: the op reads the packed K/V buffer itself
        assert fwd.calls[-1]["key"].data_ptr() == x["k"].data_ptr()
        assert fwd.calls[-1]["value"].data_ptr() == x["v"].data_ptr()
        assert fwd.calls[-1]["key"].stride() == x["k"].transpose(1, 2).stride()
    assert fwd.calls[-1]["query"].data_ptr() == x["q"].data_ptr()


@pytest.mark.parametrize("queries", [1, 5])
def test_cudnn_never_gets_one_key(monkeypatch, fake_ops, queries) -> None:  # type: ignore[no-untyped-def]
    """A piece of one key (a one-token turn, a one-token cache shard) runs beside cuDNN, exact:
    out is V's row, dK/dV the sums over the queries."""
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    x = _inputs(1, 4, 2)
    g = torch.Generator().manual_seed(7)
    q, dout = (torch.randn(B, queries, 4, D, generator=g) for _ in range(2))
    k, v = x["k"], x["v"]
    kernel = CudnnKernel()
    # bottom-right causal: every query sees the one key (a decode prefix of one key)
    out, lse = kernel.forward(q, k, v, False, SCALE)
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, False, SCALE)
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = reference_attention(*ref_in, causal=False, scale=SCALE)
    ref.backward(dout.double())
    assert (out.double() - ref).abs().max() < TOL
    for got, want in zip((dq, dk, dv), (t.grad for t in ref_in), strict=True):
        assert want is not None and (got.double() - want).abs().max() < TOL
    if queries == 1:  # top-left causal on one query and one key: the same piece
        out_c, _ = kernel.forward(q, k, v, True, SCALE)
        assert (out_c.double() - ref).abs().max() < TOL
    assert not any(c.calls for c in fake_ops.values())


EFFICIENT_BAND_PIECES = [
    (16, 16, (-3, 0)),  # a sliding window's diagonal piece
    (12, 20, (-5, 2)),  # Sk not a multiple of 16: the bias's rows padded
    (40, 40, (-7, 0)),
    (16, 16, (None, -1)),  # row 0 sees no key (a prefix hidden whole)
    (16, 16, (1, 6)),  # rows 15 and on see none (a suffix)
]


@pytest.mark.parametrize(("sq", "sk", "band"), EFFICIENT_BAND_PIECES)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2)])
def test_efficient_applies_a_band_as_its_bias(fake_ops, sq, sk, band, heads, kv_heads) -> None:  # type: ignore[no-untyped-def]
    """Without flash-attn, the memory-efficient op runs document and window pieces on CUDA:
    the band as an additive bias the op accepts (checked as it checks it), out / LSE / the
    backward with them against float64, TOL; a row that sees no key is out 0, LSE -inf, and
    no NaN reaches the gradients (the fake leaves NaN in such a row, the op promises nothing)."""
    g = torch.Generator().manual_seed(sq * 100 + sk)
    q, dout = (torch.randn(B, sq, heads, D, generator=g) for _ in range(2))
    k, v = (torch.randn(B, sk, kv_heads, D, generator=g) for _ in range(2))
    kernel = EfficientKernel()
    out, lse = kernel.forward(q, k, v, False, SCALE, band=band)
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, False, SCALE, band=band)
    assert fake_ops["_scaled_dot_product_efficient_attention"].calls[-1]["attn_bias"] is not None
    seen = band_mask(sq, sk, band, torch.device("cpu")).any(dim=1)
    rows = seen.nonzero().flatten()
    ref_in = [t.double().requires_grad_(True) for t in (q[:, rows], k, v)]
    kk, vv = (t.repeat_interleave(heads // kv_heads, dim=2) for t in ref_in[1:])
    scores = torch.einsum("bqhd,bkhd->bhqk", ref_in[0], kk) * SCALE
    scores = scores.masked_fill(~band_mask(sq, sk, band, torch.device("cpu"))[rows],
                                float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), vv)
    ref.backward(dout[:, rows].double())
    assert (out[:, rows].double() - ref).abs().max() < TOL
    assert (lse[:, :, rows].double() - torch.logsumexp(scores, -1).detach()).abs().max() < TOL
    assert bool((out[:, ~seen] == 0).all()) and bool((lse[:, :, ~seen] == float("-inf")).all())
    assert (dq[:, rows].double() - ref_in[0].grad).abs().max() < TOL  # type: ignore[operator]
    assert bool((dq[:, ~seen] == 0).all())
    for got, want in ((dk, ref_in[1].grad), (dv, ref_in[2].grad)):
        assert want is not None and (got.double() - want).abs().max() < TOL


@pytest.mark.parametrize(("cls", "version", "native"), KERNEL_CASES)
def test_aten_kernels_backward_use_the_given_out_and_lse(  # type: ignore[no-untyped-def]
    monkeypatch, fake_ops, cls, version, native
) -> None:
    """A ring block's backward with the global out/LSE is that block's share of the global
    gradient; a backward before any forward (a fresh process) works too."""
    monkeypatch.setattr(torch, "__version__", version)
    x = _inputs(32, 4, 2)
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    fresh = cls()
    out, lse = NAIVE.forward(q, k, v, False, SCALE)
    parts = [fresh.backward(dout, q, k[:, sl], v[:, sl], out, lse, False, SCALE)
             for sl in (slice(0, 16), slice(16, 32))]  # fmt: skip
    dq, dk, dv = NAIVE.backward(dout, q, k, v, out, lse, False, SCALE)
    assert (parts[0][0] + parts[1][0] - dq).abs().max() < TOL
    assert (torch.cat([parts[0][1], parts[1][1]], dim=1) - dk).abs().max() < TOL
    assert (torch.cat([parts[0][2], parts[1][2]], dim=1) - dv).abs().max() < TOL


def test_call_op_follows_the_installed_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.4's cuDNN op had no `attn_bias`/`compute_log_sumexp`: they are not passed; an
    argument cpbench does not know is an error naming it."""
    seen: list[dict[str, Any]] = []
    old = torch._C.parse_schema(
        "aten::_scaled_dot_product_cudnn_attention(Tensor query, Tensor key, Tensor value, "
        "float dropout_p=0.0, bool is_causal=False, bool return_debug_mask=False, *, "
        "float? scale=None) -> (Tensor, Tensor, Tensor, Tensor, SymInt, SymInt, Tensor, "
        "Tensor, Tensor)"
    )
    future = torch._C.parse_schema(
        "aten::_scaled_dot_product_cudnn_attention(Tensor query, Tensor key, Tensor value, "
        "Tensor? attn_bias, bool compute_log_sumexp, int window, *, float? scale=None) "
        "-> (Tensor, Tensor)"
    )
    fakes = {
        "old": FakeOp("_scaled_dot_product_cudnn_attention", lambda **a: seen.append(a), old),
        "future": FakeOp("_scaled_dot_product_cudnn_attention", lambda **a: None, future),
    }
    t = torch.zeros(1)
    monkeypatch.setattr(ops, "aten_op", lambda name: fakes["old"])
    ops.call_op("x", query=t, key=t, value=t, attn_bias=None, compute_log_sumexp=True,
                is_causal=True, scale=0.5)  # fmt: skip
    assert set(seen[0]) == {"query", "key", "value", "is_causal", "scale"}
    monkeypatch.setattr(ops, "aten_op", lambda name: fakes["future"])
    with pytest.raises(CpbenchError, match="'window'"):
        ops.call_op("x", query=t, key=t, value=t, attn_bias=None, compute_log_sumexp=True)


# ----------------------------------------------------------------------------- flash-attn 2


class _Recorder:
    """Wraps the stand-in's private functions and keeps the tensors each call received."""

    def __init__(self, fa: Any) -> None:
        self.fa = fa
        self.calls: dict[str, tuple] = {}

    def _flash_attn_forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["fwd"] = args
        return self.fa._flash_attn_forward(*args, **kwargs)

    def _flash_attn_backward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["bwd"] = args
        return self.fa._flash_attn_backward(*args, **kwargs)


@pytest.fixture
def flash_attn_kernel() -> tuple[FlashAttnKernel, _Recorder]:
    if not use_stand_ins():
        pytest.skip("a real flash-attn is installed: the stand-in is not the one imported")
    kernel = FlashAttnKernel()
    recorder = _Recorder(kernel._fa)
    kernel._fa = recorder  # type: ignore[assignment]
    return kernel, recorder


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2)])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_takes_strided_views_without_copies(  # type: ignore[no-untyped-def]
    flash_attn_kernel, heads, kv_heads, causal
) -> None:
    """K and V (views of the packed buffer, stride(-1) == 1, not contiguous) and a row slice
    of q reach flash-attn as they are: same storage, same strides. Results stay right."""
    kernel, recorder = flash_attn_kernel
    x = _inputs(32, heads, kv_heads, torch.bfloat16)
    assert not x["k"].is_contiguous() and x["k"].stride(-1) == 1
    _check_against_reference(kernel, x, causal, 5e-2)  # bf16 inputs and outputs
    q, k, v = recorder.calls["fwd"][:3]
    assert (q.data_ptr(), k.data_ptr(), v.data_ptr()) == tuple(
        x[n].data_ptr() for n in ("q", "k", "v")
    )
    assert k.stride() == x["k"].stride() and v.stride() == x["v"].stride()
    dout, qb, kb, vb = recorder.calls["bwd"][:4]
    assert kb.data_ptr() == x["k"].data_ptr() and vb.data_ptr() == x["v"].data_ptr()
    assert dout.data_ptr() == x["dout"].data_ptr() and qb.data_ptr() == x["q"].data_ptr()
    rows = x["q"][:, 8:24]  # a ring block's query rows
    kernel.forward(rows, x["k"][:, 8:24], x["v"][:, 8:24], False, SCALE)
    assert recorder.calls["fwd"][0].data_ptr() == rows.data_ptr()


def test_flash_attn_copies_only_what_the_library_would(flash_attn_kernel) -> None:  # type: ignore[no-untyped-def]
    """A tensor whose last dimension is strided is the one flash-attn itself copies: it is
    made contiguous (same values), the others are not; the LSE always goes in dense."""
    kernel, recorder = flash_attn_kernel
    x = _inputs(16, 2, 2, torch.bfloat16)
    q_strided = x["q"].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert q_strided.stride(-1) != 1
    out, lse = kernel.forward(q_strided, x["k"], x["v"], False, SCALE)
    q_in, k_in = recorder.calls["fwd"][:2]
    assert q_in.stride(-1) == 1 and q_in.data_ptr() != q_strided.data_ptr()
    assert torch.equal(q_in, q_strided) and k_in.data_ptr() == x["k"].data_ptr()
    big = torch.zeros(B, 2, 32)
    big[:, :, :16] = lse
    kernel.backward(x["dout"], x["q"], x["k"], x["v"], out, big[:, :, :16], False, SCALE)
    assert recorder.calls["bwd"][5].is_contiguous()


# ----------------------------------------------------------------------------- FlashAttention-3


def _fa3_forward(q, k, v, softmax_scale, causal):  # type: ignore[no-untyped-def]
    for t in (q, k, v):
        assert t.stride(-1) == 1
    return NAIVE.forward(q, k, v, causal, softmax_scale)


def _fa3_backward(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal):  # type: ignore[no-untyped-def]
    assert lse.is_contiguous() and dq.is_contiguous() and dk.is_contiguous()
    grads = NAIVE.backward(dout, q, k, v, out, lse, causal, softmax_scale)
    for buffer, grad in zip((dq, dk, dv), grads, strict=True):
        buffer.copy_(grad)
    return torch.zeros(1)


def _fa3_2024() -> types.ModuleType:
    """The 2024 betas: `window_size` required, a 7-tuple with the LSE at index 5."""

    def _flash_attn_forward(q, k, v, softmax_scale, causal, window_size, descale_q=None,  # type: ignore[no-untyped-def]
                            descale_k=None, descale_v=None, gqa_parallel=False):  # fmt: skip
        assert window_size == (-1, -1) and descale_q is None and gqa_parallel is False
        out, lse = _fa3_forward(q, k, v, softmax_scale, causal)
        return out, q, k, v, out, lse, None

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale,  # type: ignore[no-untyped-def]
                             causal, window_size, deterministic=False):  # fmt: skip
        assert window_size == (-1, -1) and deterministic is False
        return _fa3_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)

    return types.SimpleNamespace(  # type: ignore[return-value]
        _flash_attn_forward=_flash_attn_forward, _flash_attn_backward=_flash_attn_backward
    )


def _fa3_2025() -> types.ModuleType:
    """2025: every varlen/paged/rotary parameter positional without default."""

    def _flash_attn_forward(q, k, v, k_new, v_new, qv, out, cu_seqlens_q, cu_seqlens_k,  # type: ignore[no-untyped-def]
                            cu_seqlens_k_new, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                            page_table, kv_batch_idx, leftpad_k, rotary_cos, rotary_sin,
                            seqlens_rotary, q_descale, k_descale, v_descale, softmax_scale, causal,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=1,
                            pack_gqa=None, sm_margin=0):  # fmt: skip
        unset = (k_new, v_new, qv, out, cu_seqlens_q, cu_seqlens_k, page_table, rotary_cos)
        assert all(x is None for x in unset) and num_splits == 1 and softcap == 0.0
        o, lse = _fa3_forward(q, k, v, softmax_scale, causal)
        return o, lse, None, None

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,  # type: ignore[no-untyped-def]
                             sequed_q, sequed_k, max_seqlen_q, max_seqlen_k, dq, dk, dv,
                             softmax_scale, causal, window_size=(-1, -1), softcap=0.0,
                             deterministic=False, sm_margin=0):  # fmt: skip
        assert cu_seqlens_q is None and sequed_q is None and max_seqlen_q is None
        return _fa3_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)

    return types.SimpleNamespace(  # type: ignore[return-value]
        _flash_attn_forward=_flash_attn_forward, _flash_attn_backward=_flash_attn_backward
    )


def _fa3_2026() -> types.ModuleType:
    """Late 2025 on: `torch.library.custom_op` wrappers (inspected through `_init_fn`),
    defaults everywhere, `window_size_left/right`, backward `is_causal`, forward `out_`."""

    def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None,  # type: ignore[no-untyped-def]
                            softmax_scale=None, causal=False, window_size_left=-1,
                            window_size_right=-1, num_splits=1, sm_margin=0):  # fmt: skip
        assert (window_size_left, window_size_right) == (-1, -1) and out_ is None
        o, lse = _fa3_forward(q, k, v, softmax_scale, causal)
        return o, lse, torch.empty(0), torch.empty(0)

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None,  # type: ignore[no-untyped-def]
                             cu_seqlens_k=None, dq=None, dk=None, dv=None, softmax_scale=None,
                             is_causal=False, window_size_left=-1, window_size_right=-1,
                             deterministic=False):  # fmt: skip
        assert dq is not None and dk is not None and dv is not None
        return _fa3_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale,
                             is_causal)  # fmt: skip

    class CustomOp:  # what torch.library.custom_op returns: (*args, **kwargs) + _init_fn
        def __init__(self, fn: Callable[..., Any]) -> None:
            self._init_fn = fn

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self._init_fn(*args, **kwargs)

    return types.SimpleNamespace(  # type: ignore[return-value]
        _flash_attn_forward=CustomOp(_flash_attn_forward),
        _flash_attn_backward=CustomOp(_flash_attn_backward),
    )


@pytest.mark.parametrize("release", [_fa3_2024, _fa3_2025, _fa3_2026], ids=lambda f: f.__name__)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn3_marshalling_for_each_release(release, heads, kv_heads, causal) -> None:  # type: ignore[no-untyped-def]
    kernel = FlashAttn3Kernel(release())
    _check_against_reference(kernel, _inputs(32, heads, kv_heads), causal, TOL)


def test_flash_attn3_passes_views_and_refuses_an_unknown_release() -> None:
    seen: dict[str, torch.Tensor] = {}

    def _flash_attn_forward(q, k, v, softmax_scale=None, causal=False):  # type: ignore[no-untyped-def]
        seen.update(q=q, k=k, v=v)
        return NAIVE.forward(q, k, v, causal, softmax_scale)

    module = types.SimpleNamespace(
        _flash_attn_forward=_flash_attn_forward, _flash_attn_backward=lambda *a: None
    )
    x = _inputs(16, 2, 2)
    FlashAttn3Kernel(module).forward(x["q"], x["k"], x["v"], True, SCALE)  # type: ignore[arg-type]
    assert seen["k"].data_ptr() == x["k"].data_ptr() and seen["k"].stride() == x["k"].stride()

    def future(q, k, v, softmax_scale, causal, new_required_knob):  # type: ignore[no-untyped-def]
        raise AssertionError("not called")

    module = types.SimpleNamespace(_flash_attn_forward=future, _flash_attn_backward=future)
    with pytest.raises(CpbenchError, match="'new_required_knob'"):
        FlashAttn3Kernel(module).forward(x["q"], x["k"], x["v"], True, SCALE)  # type: ignore[arg-type]


def test_flash_attn3_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fa3_2025())
    assert fa3_module.flash_attn3_available()
    monkeypatch.setitem(sys.modules, "flash_attn_interface", types.SimpleNamespace())
    assert not fa3_module.flash_attn3_available()  # no private forward/backward
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # import fails
    assert not fa3_module.flash_attn3_available()
    with pytest.raises(ImportError, match="flash_attn_interface"):
        FlashAttn3Kernel()


def test_kernel_version_names_what_runs_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "cudnn_version", lambda: 90100)
    assert kernel_version("cudnn") == "90100"
    monkeypatch.setattr(ops, "cudnn_version", lambda: None)
    assert kernel_version("cudnn") is None
    for name in ("sdpa", "efficient", "naive"):
        assert kernel_version(name) == str(torch.__version__)
    monkeypatch.setattr(fa3_module, "FA3_DISTRIBUTIONS", ("no-such-distribution-cpbench",))
    assert kernel_version("flash_attn3") is None


def test_auto_with_bands_skips_an_fa3_without_a_window(fake_env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """FA3 before 2024-08-29 imports but has no window: with band pieces `auto` takes
    flash-attn 2 instead (main took FA3, which then ran the bands as full attention)."""
    fake_env(fa2=True, fa3=True)
    old = flash_rules.fa3_module("2024-07", flash_rules.Library())
    monkeypatch.setattr(select, "flash_attn3_interface", lambda: old)
    assert not band_capable("flash_attn3", "cuda")
    assert auto_kernel_name("cuda", BF16, band=True) == "flash_attn"
    assert auto_kernel_name("cuda", BF16) == "flash_attn3"
    new = flash_rules.fa3_module("2026", flash_rules.Library())
    monkeypatch.setattr(select, "flash_attn3_interface", lambda: new)
    assert auto_kernel_name("cuda", BF16, band=True) == "flash_attn3"


def test_flash_attn3_version_of_a_wheel_named_flash_attn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wheels built from hopper/ in 2025-01 .. 2025-07 are the distribution `flash_attn`
    (version 3.x) providing `flash_attn_interface`: the record names that version (main
    looked only for `flash_attn_3` / `flashattn-hopper` and wrote None)."""
    import importlib.metadata as metadata  # noqa: PLC0415

    versions = {"flash_attn": "3.0.0b1"}

    def version(dist: str) -> str:
        if dist not in versions:
            raise metadata.PackageNotFoundError(dist)
        return versions[dist]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"flash_attn_interface": ["flash_attn"]})
    assert fa3_module.flash_attn3_version() == "3.0.0b1"
    assert kernel_version("flash_attn3") == "3.0.0b1"
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {})
    assert fa3_module.flash_attn3_version() is None  # flash-attn 2 alone is not FA3


@pytest.mark.parametrize(
    ("device", "dtype", "kv_heads", "refused"),
    [
        ("cuda", "float32", 2, True),  # float32 GQA on CUDA: the math kernel, not the ring
        ("cuda", "float32", 8, False),  # MHA float32: the memory-efficient op, ringed
        ("cuda", "bfloat16", 2, False),  # GQA in bf16: the flash op (native GQA), ringed
        ("cpu", "float32", 2, False),  # on CPU the adapter rings the CPU flash op itself
    ],
)
def test_torch_cp_refuses_float32_gqa_on_cuda(device, dtype, kv_heads, refused) -> None:  # type: ignore[no-untyped-def]
    """torch's SDPA has no fused CUDA kernel for float32 with fewer KV heads than Q heads
    (sdp_utils.cpp: flash / cuDNN fp16/bf16 only, memory-efficient without GQA through 2.12),
    so context_parallel would run the math kernel, which it has no ring handler for."""
    from cpbench.config.bench import BenchConfig  # noqa: PLC0415
    from cpbench.impls.torch_cp import TorchCpAdapter  # noqa: PLC0415

    config = BenchConfig(
        seq_len=256, batch=1, heads=8, kv_heads=kv_heads, head_dim=64, dtype=dtype,
        causal=True, ulysses=1, ring=2, layout="zigzag", kv_replication=None, kernel="auto",
        phase="fwd+bwd", device=device, world_size=2, impl="torch_cp",
    )  # fmt: skip
    reason = TorchCpAdapter("torch_cp").capability(config)
    assert (reason is not None) is refused, reason
    if refused:
        assert "not ring attention" in str(reason) and "kv_heads 2" in str(reason)
