"""The torch-version shims: the one place that knows which torch has what (floor: pyproject.toml).

Why capabilities are probed, not read from the version, and the layer: docs/design.md section 4."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed._functional_collectives as ft_c
import torch.utils._python_dispatch as python_dispatch


def torch_at_least(major: int, minor: int, version: str | None = None) -> bool:
    """The installed torch (or `version`) is `major.minor` or newer; local tags (`+cu124`)
    and pre-release suffixes of the same release (`2.6.0a0+...`, as NGC builds name it) count
    as that release. Only for what cannot be probed here: the CUDA ops below (a probe would
    need a GPU and would create a CUDA context in whichever process asked first)."""
    text = version or str(torch.__version__)  # read at call time (tests fake other releases)
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"torch version {text!r} is not 'major.minor...'")
    return (int(found[1]), int(found[2])) >= (major, minor)


# ---------------------------------------------------------------- CUDA attention ops (by version)


def cuda_flash_supports_gqa(version: str | None = None) -> bool:
    """Whether `aten._scaled_dot_product_flash_attention` (and its backward) takes K/V with
    fewer heads than Q: its vendored FlashAttention-2 handles `H_q % H_kv == 0` itself, and
    torch routes `scaled_dot_product_attention(..., enable_gqa=True)` to it unexpanded from
    2.5 on (pytorch/pytorch#132689); older torch: expand K/V. By version (a CUDA op)."""
    return torch_at_least(2, 5, version)


def cudnn_attention_supports_gqa(version: str | None = None) -> bool:
    """Whether `aten._scaled_dot_product_cudnn_attention` is known to take K/V with fewer
    heads than Q: cuDNN's graph handles it and PyTorch checks it since pytorch/pytorch#150337
    (2.8); for 2.5-2.7 no such check is known, so K/V are expanded there. By version."""
    return torch_at_least(2, 8, version)


def cudnn_attention_usable(version: str | None = None) -> bool:
    """Whether this torch's cuDNN attention op is usable at all: 2.5 gave it `attn_bias` and
    `compute_log_sumexp` and made it a public SDPA backend; 2.4's op was marked not ready for
    use (pytorch/pytorch#122695). By version."""
    return torch_at_least(2, 5, version)


# ----------------------------------------------------------------------- CPU flash attention


def _cpu_flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, scale=scale
    )
    return out


@functools.cache
def cpu_flash_supports_gqa() -> bool:
    """Whether `aten._scaled_dot_product_flash_attention_for_cpu` (and its backward) accept
    fewer K/V heads than query heads, mapping query head h to K/V head h // (H_q / H_kv).

    - torch 2.9 and later: yes (pytorch/pytorch#157893, "[CPU] Support GQA for flash
      attention", July 2025, which changed the forward and the backward together).
    - torch 2.5-2.8 (checked on 2.5.1 and 2.6.0): no, and no error either: both kernels index K/V with
      the query's head count. The forward reads past the K/V heads (wrong outputs, max error
      3.4 in cpbench's kernel test) and the backward writes dK/dV for H_q heads into tensors
      allocated for H_kv heads (heap corruption: `double free or corruption`).

    Decided by a forward probe, run once per process: a 2-query-head, 1-KV-head attention whose
    K/V are views of the first head of 2-head buffers. A kernel without GQA reads the second
    buffer head (inside the allocation, so the probe itself is memory-safe) and its output for
    query head 1 differs from the GQA answer; a kernel with GQA reproduces it. The backward is
    never probed: on a version without GQA it would write out of bounds. The probe runs with
    any active TorchDispatchMode (cpbench's memory tracker, fake tensors) disabled and without
    autograd, so it is invisible to whatever is measuring when it first runs."""
    with python_dispatch._disable_current_modes(), torch.no_grad():
        g = torch.Generator().manual_seed(0)
        q, k_buf, v_buf = (torch.randn(1, 2, 8, 8, generator=g, device="cpu") for _ in range(3))
        k, v = k_buf[:, :1], v_buf[:, :1]  # one KV head, strided inside a 2-head buffer
        scale = 8**-0.5
        try:
            got = _cpu_flash_forward(q, k, v, scale)
        except RuntimeError:  # a version that checks the head counts and refuses
            return False
        want = _cpu_flash_forward(q, k.expand(1, 2, 8, 8), v.expand(1, 2, 8, 8), scale)
        return bool(torch.allclose(got, want, atol=1e-5, rtol=1e-5))


# ------------------------------------------------------------------- functional collectives

_FUNCTIONAL_FALLBACKS: dict[str, tuple[str, ...]] = {
    "all_gather_single": ("all_gather_single", "all_gather_tensor"),
    "reduce_scatter_single": ("reduce_scatter_single", "reduce_scatter_tensor"),
    "all_to_all_single": ("all_to_all_single",),
    "all_reduce": ("all_reduce",),
}
"""Entry point (current torch's name) -> the names that implement it, newest first."""


def functional_collective_name(entry_point: str) -> str | None:
    """The attribute of `torch.distributed._functional_collectives` that implements
    `entry_point` on this torch, or None where none does.

    - `all_gather_single(self, gather_dim, group, tag)` and `reduce_scatter_single(self,
      reduceOp, scatter_dim, group, tag)`: recent torch (2.13 has them; 2.6.0 does not). There
      the older `all_gather_tensor` / `reduce_scatter_tensor` remain as deprecated wrappers
      that call the `_single` functions through the module, so only the `_single` name may be
      wrapped (wrapping both would count a call twice).
    - older torch (2.5.1 and 2.6.0 checked): only `all_gather_tensor` / `reduce_scatter_tensor`, with the
      same arguments in the same positions, so the same counters apply.
    - `all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag)` and
      `all_reduce(self, reduceOp, group, tag)`: unchanged over the supported range.

    Decided by the attribute's presence, which is what a caller needs."""
    for name in _FUNCTIONAL_FALLBACKS.get(entry_point, (entry_point,)):
        if callable(getattr(ft_c, name, None)):
            return name
    return None


def functional_collectives() -> dict[str, str]:
    """Entry point -> this torch's attribute name, for every functional collective cpbench
    counts (see `functional_collective_name`); entry points this torch lacks are left out."""
    found = {entry: functional_collective_name(entry) for entry in _FUNCTIONAL_FALLBACKS}
    return {entry: name for entry, name in found.items() if name is not None}


# ---------------------------------------------------------------------- tensor subclasses


def _wrapper_subclass_type_fallback(t: type) -> bool:
    """What torch's `is_traceable_wrapper_subclass_type` checks, for torch without it."""
    return (
        issubclass(t, torch.Tensor)
        and t is not torch.Tensor
        and hasattr(t, "__tensor_flatten__")
        and hasattr(t, "__tensor_unflatten__")
    )


_IS_WRAPPER_SUBCLASS_TYPE: Callable[[type], bool] = getattr(
    python_dispatch, "is_traceable_wrapper_subclass_type", _wrapper_subclass_type_fallback
)


def is_traceable_wrapper_subclass_type(t: type[Any]) -> bool:
    """Whether a tensor type is a traceable wrapper subclass (DTensor and the like: it owns no
    storage and runs its ops on inner plain tensors, declared by `__tensor_flatten__` /
    `__tensor_unflatten__`).

    - torch 2.5 and later (2.5.1, 2.6.0 and 2.13 checked):
      `torch.utils._python_dispatch.is_traceable_wrapper_subclass_type`, used as is.
    - earlier torch has only the instance check `is_traceable_wrapper_subclass`; the same test
      on the type is done here, as torch's own function does it.

    Decided by the attribute's presence."""
    return bool(_IS_WRAPPER_SUBCLASS_TYPE(t))
