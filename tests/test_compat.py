"""The torch-version shims (`cpbench.compat`): one test per branch, each forced where it is not
the branch of the installed torch, and the real branch selection checked against the float64
reference (on torch 2.6 the GQA test below caught wrong outputs and heap corruption before
`CpuSdpaKernel` went through `cpu_flash_supports_gqa`)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed._functional_collectives as ft_c
from torch.distributed.tensor import DTensor
from torch.testing._internal.two_tensor import TwoTensor

import cpbench.attention.kernels.base as kernel_base
import cpbench.attention.kernels.cpu_sdpa as cpu_sdpa
from cpbench import compat
from cpbench.attention.comm import ByteCounter
from cpbench.attention.kernels import CpuSdpaKernel, default_scale
from cpbench.attention.reference import reference_attention
from cpbench.impls.counting import library_counting

TOL = 2e-5  # float32 kernel against the float64 reference on O(1) values (as test_kernels)
GQA_HEADS = [(4, 1), (4, 2), (6, 3)]


def _inputs(sq: int, sk: int, heads: int, kv_heads: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn(2, sq, heads, 16, generator=g),
        torch.randn(2, sk, kv_heads, 16, generator=g),
        torch.randn(2, sk, kv_heads, 16, generator=g),
        torch.randn(2, sq, heads, 16, generator=g),
    ]


def _errors_against_reference(causal: bool, heads: int, kv_heads: int) -> list[float]:
    """Max |error| of CpuSdpaKernel's out, dq, dk, dv against float64 autograd attention."""
    q, k, v, dout = _inputs(32, 32, heads, kv_heads)
    kernel, scale = CpuSdpaKernel(), default_scale(16)
    out, lse = kernel.forward(q, k, v, causal, scale)
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = reference_attention(*ref_in, causal=causal)
    ref.backward(dout.double())
    grads = kernel.backward(dout, q, k, v, out, lse, causal, scale)
    errors = [float((out.double() - ref.detach()).abs().max())]
    for got, x in zip(grads, ref_in, strict=True):
        assert got.shape == x.shape
        assert x.grad is not None
        errors.append(float((got.double() - x.grad).abs().max()))
    return errors


# ------------------------------------------------------------------ CPU flash GQA: the kernel


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads"), GQA_HEADS)
def test_cpu_sdpa_gqa_on_this_torchs_branch(causal: bool, heads: int, kv_heads: int) -> None:
    """The real branch selection (no patching): whatever this torch's op can do, GQA through
    CpuSdpaKernel matches the reference, forward and backward. Before the fix, on torch 2.6,
    this failed (out error 3.4) and then aborted the process (heap corruption)."""
    assert max(_errors_against_reference(causal, heads, kv_heads)) < TOL


class _ExpandSpy:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        self.calls += 1
        return x.repeat_interleave(heads // x.shape[2], dim=2)


@pytest.mark.parametrize(("heads", "kv_heads"), GQA_HEADS)
def test_cpu_sdpa_expanding_branch(
    monkeypatch: pytest.MonkeyPatch, heads: int, kv_heads: int
) -> None:
    """Forced: the op without native GQA (torch 2.5-2.8). K and V are expanded before the op,
    in the forward and the backward (4 calls), and the gradient copies summed back: correct on
    any torch."""
    spy = _ExpandSpy()
    monkeypatch.setattr(cpu_sdpa, "cpu_flash_supports_gqa", lambda: False)
    monkeypatch.setattr(kernel_base, "_expand_kv", spy)
    assert max(_errors_against_reference(True, heads, kv_heads)) < TOL
    assert spy.calls == 4


@pytest.mark.skipif(
    not compat.cpu_flash_supports_gqa(),
    reason="this torch's CPU flash op has no GQA: forcing the native branch would corrupt memory",
)
def test_cpu_sdpa_native_branch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced: the op with native GQA (torch 2.9+). K/V reach it unexpanded and the result
    still matches the reference."""
    spy = _ExpandSpy()
    monkeypatch.setattr(cpu_sdpa, "cpu_flash_supports_gqa", lambda: True)
    monkeypatch.setattr(kernel_base, "_expand_kv", spy)
    assert max(_errors_against_reference(True, 4, 2)) < TOL
    assert spy.calls == 0


def test_cpu_sdpa_mha_never_expands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal head counts: nothing to expand on either branch."""
    spy = _ExpandSpy()
    monkeypatch.setattr(cpu_sdpa, "cpu_flash_supports_gqa", lambda: False)
    monkeypatch.setattr(kernel_base, "_expand_kv", spy)
    assert max(_errors_against_reference(False, 4, 4)) < TOL
    assert spy.calls == 0


# ------------------------------------------------------------------- CPU flash GQA: the probe


def _gqa_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A kernel with GQA: query head h reads K/V head h // group."""
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, dim=1) for x in (k, v))
    probs = torch.softmax(q @ kk.transpose(-1, -2) * scale, dim=-1)
    return probs @ vv


def _no_gqa_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """What torch 2.5-2.8's kernel does with fewer K/V heads: index them with the query's
    head count and K/V's own strides (reading past the K/V heads)."""
    kk, vv = (x.as_strided(q.shape, x.stride()) for x in (k, v))
    return _gqa_op(q, kk, vv, scale)


def _refusing_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    raise RuntimeError("number of heads in key/value must equal the query's")


@pytest.mark.parametrize(
    ("op", "supported"), [(_gqa_op, True), (_no_gqa_op, False), (_refusing_op, False)]
)
def test_gqa_probe_tells_the_kernels_apart(
    monkeypatch: pytest.MonkeyPatch, op: Callable[..., torch.Tensor], supported: bool
) -> None:
    monkeypatch.setattr(compat, "_cpu_flash_forward", op)
    assert compat.cpu_flash_supports_gqa.__wrapped__() is supported


def test_gqa_probe_agrees_with_this_torchs_op() -> None:
    """The probe of the real op gives the same answer as the emulated kernel whose behaviour
    the real op shows on the probe's (memory-safe, strided) inputs."""
    g = torch.Generator().manual_seed(2)
    q, k_buf, v_buf = (torch.randn(1, 2, 8, 8, generator=g) for _ in range(3))
    k, v = k_buf[:, :1], v_buf[:, :1]
    real = compat._cpu_flash_forward(q, k, v, 0.25)
    emulated = (_gqa_op if compat.cpu_flash_supports_gqa() else _no_gqa_op)(q, k, v, 0.25)
    assert (real - emulated).abs().max() < 1e-5


def test_gqa_probe_is_invisible_to_an_active_dispatch_mode() -> None:
    """The first call may come while cpbench's memory tracker measures a step: the probe's
    tensors must not be counted there."""
    from cpbench.bench.memory import TensorAllocationTracker  # noqa: PLC0415

    with TensorAllocationTracker() as tracker:
        compat.cpu_flash_supports_gqa.__wrapped__()
    assert tracker.peak == 0


# ------------------------------------------------------------------- functional collectives


def _namespace(*names: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{n: (lambda *a, **k: None) for n in names})


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        # torch 2.13: both, the deprecated _tensor calling _single: only _single is named
        (("all_gather_single", "all_gather_tensor"), "all_gather_single"),
        (("all_gather_tensor",), "all_gather_tensor"),  # torch 2.6
        ((), None),
    ],
)
def test_functional_name_lookup(
    monkeypatch: pytest.MonkeyPatch, present: tuple[str, ...], expected: str | None
) -> None:
    monkeypatch.setattr(compat, "ft_c", _namespace(*present))
    assert compat.functional_collective_name("all_gather_single") == expected


def test_functional_names_on_this_torch() -> None:
    """Every name the real lookup gives exists here, and each counted entry point is found."""
    names = compat.functional_collectives()
    assert set(names) == {
        "all_gather_single",
        "reduce_scatter_single",
        "all_to_all_single",
        "all_reduce",
    }
    assert all(callable(getattr(ft_c, n)) for n in names.values())
    if hasattr(ft_c, "all_gather_single"):
        assert names["all_gather_single"] == "all_gather_single"


@pytest.mark.parametrize(
    "names",
    [
        {
            "all_gather_single": "all_gather_single",
            "reduce_scatter_single": "reduce_scatter_single",
        },
        {
            "all_gather_single": "all_gather_tensor",
            "reduce_scatter_single": "reduce_scatter_tensor",
        },
    ],
    ids=["single", "tensor"],
)
def test_counting_wraps_the_name_this_torch_has(
    monkeypatch: pytest.MonkeyPatch, names: dict[str, str]
) -> None:
    """Each naming branch forced: `library_counting` wraps exactly the names compat gives,
    with the counters' argument positions (group at 2 for gather, 3 for reduce-scatter),
    and restores them. The collectives are stubs, the group a list of 4 ranks, so no process
    group is needed."""
    calls: list[str] = []

    def stub(name: str) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            calls.append(name)

        return run

    for name in names.values():
        monkeypatch.setattr(ft_c, name, stub(name), raising=False)
    monkeypatch.setattr("cpbench.attention.boundary.functional_collectives", lambda: names)
    originals = {name: getattr(ft_c, name) for name in names.values()}
    x = torch.ones(4, 8)  # 128 bytes
    counter = ByteCounter()
    with library_counting(counter):
        getattr(ft_c, names["all_gather_single"])(x, 0, [0, 1, 2, 3])
        getattr(ft_c, names["reduce_scatter_single"])(x, "sum", 0, [0, 1, 2, 3])
    tags = {tag: n for (_, tag), n in counter.bytes.items()}
    assert tags == {"all_gather": 128 * 3, "reduce_scatter": 128 * 3 // 4}
    assert calls == [names["all_gather_single"], names["reduce_scatter_single"]]
    assert {name: getattr(ft_c, name) for name in names.values()} == originals


# ---------------------------------------------------------------------- tensor subclasses


class _PlainSubclass(torch.Tensor):
    pass


SUBCLASS_CASES = [
    (DTensor, True),
    (TwoTensor, True),
    (torch.Tensor, False),
    (_PlainSubclass, False),
]


@pytest.mark.parametrize(("cls", "expected"), SUBCLASS_CASES)
def test_wrapper_subclass_check_on_this_torch(cls: type, expected: bool) -> None:
    assert compat.is_traceable_wrapper_subclass_type(cls) is expected


@pytest.mark.parametrize(("cls", "expected"), SUBCLASS_CASES)
def test_wrapper_subclass_check_fallback(
    monkeypatch: pytest.MonkeyPatch, cls: type, expected: bool
) -> None:
    """Forced: torch without `is_traceable_wrapper_subclass_type` (before torch 2.5)."""
    monkeypatch.setattr(compat, "_IS_WRAPPER_SUBCLASS_TYPE", compat._wrapper_subclass_type_fallback)
    assert compat.is_traceable_wrapper_subclass_type(cls) is expected


# ------------------------------------------------------------ CUDA ops (decided by version)


@pytest.mark.parametrize(
    ("version", "at_least_2_5", "at_least_2_8"),
    [
        ("2.4.1", False, False),
        ("2.5.1+cu124", True, False),
        ("2.6.0a0+ecf3bae40a", True, False),  # an NGC build's pre-release tag counts as 2.6
        ("2.7.1", True, False),
        ("2.8.0.dev20250601", True, True),
        ("2.10.0", True, True),  # 10 > 9 as numbers, not as strings
        ("2.13.0+cpu", True, True),
    ],
)
def test_cuda_op_capabilities_by_version(
    version: str, at_least_2_5: bool, at_least_2_8: bool
) -> None:
    assert compat.torch_at_least(2, 5, version) is at_least_2_5
    assert compat.cuda_flash_supports_gqa(version) is at_least_2_5
    assert compat.cudnn_attention_usable(version) is at_least_2_5
    assert compat.cudnn_attention_supports_gqa(version) is at_least_2_8


def test_torch_at_least_reads_the_installed_torch() -> None:
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert compat.torch_at_least(major, minor) and not compat.torch_at_least(major, minor + 1)
    with pytest.raises(ValueError, match="'nightly' is not 'major.minor"):
        compat.torch_at_least(2, 5, "nightly")
