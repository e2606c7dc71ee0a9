"""FlashAttention-3 (flash-attention's `hopper/`, module `flash_attn_interface`) on Hopper.

Why it calls by the installed signature's names: docs/internals.md, "Local attention kernels"."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from types import ModuleType
from typing import Any

import torch

from cpbench.attention.kernels.flash_attn import FlashKernel
from cpbench.attention.kernels.ops import call_with_signature, last_dim_contiguous

MODULE = "flash_attn_interface"
"""FA3's Python interface, a top-level module of the `flash_attn_3` wheel (hopper/setup.py)."""
FA3_DISTRIBUTIONS = ("flash_attn_3", "flashattn-hopper")
"""Distribution names FA3 has been installed under (its version, for the record). Wheels built
from hopper/ between 2025-01 and 2025-07 are named `flash_attn` (version 3.x): those are found
as the distribution that provides the module (`packages_distributions`)."""
WINDOW = ("window_size", "window_size_left")
"""The window's parameter in the 2024 betas and 2025 (a tuple), and from late 2025 (two ints).
FA3 before 2024-08-29 has neither: it cannot apply a band."""

_UNUSED_INPUTS = tuple(
    "k_new v_new qv out_ cu_seqlens_q cu_seqlens_k cu_seqlens_k_new seqused_q seqused_k sequed_q"
    " sequed_k max_seqlen_q max_seqlen_k page_table kv_batch_idx leftpad_k rotary_cos rotary_sin"
    " seqlens_rotary q_descale k_descale v_descale descale_q descale_k descale_v"
    " scheduler_metadata pack_gqa".split()
)
"""Parameters of some FA3 release that cpbench leaves unset (None): varlen, paged KV, rotary,
FP8 descaling, scheduling hints."""
_SETTINGS: dict[str, Any] = {
    "window_size": (-1, -1),
    "window_size_left": -1,
    "window_size_right": -1,
    "attention_chunk": 0,
    "sink_token_length": 0,
    "softcap": 0.0,
    "rotary_interleaved": True,
    "num_splits": 1,
    "sm_margin": 0,
    "gqa_parallel": False,
    "deterministic": False,
}
"""Full (unwindowed) attention without softcapping, one split, no SM margin."""


def flash_attn3_interface() -> ModuleType | None:
    """FA3's interface module, or None when it does not import (any error: a wheel built for
    another torch or CUDA fails with OSError/RuntimeError rather than ImportError)."""
    try:
        module = importlib.import_module(MODULE)
    except Exception:  # any failure to import means FA3 is not usable here
        return None
    if not all(hasattr(module, f) for f in ("_flash_attn_forward", "_flash_attn_backward")):
        return None
    return module


def flash_attn3_version() -> str | None:
    """The installed FA3 distribution's version, None when none is installed: the
    distribution that provides `flash_attn_interface`, else one of `FA3_DISTRIBUTIONS`."""
    providers = importlib.metadata.packages_distributions().get(MODULE, [])
    for dist in (*providers, *FA3_DISTRIBUTIONS):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def flash_attn3_available() -> bool:
    """FA3's interface imports and has the private forward/backward the kernel calls."""
    return flash_attn3_interface() is not None


def takes_window(module: ModuleType) -> bool:
    """Whether this FA3's forward has a window parameter (it can apply a band)."""
    fn = module._flash_attn_forward
    return bool(set(WINDOW) & set(inspect.signature(getattr(fn, "_init_fn", fn)).parameters))


def _known(left: int, right: int, **values: Any) -> dict[str, Any]:
    """What a call can pass to any FA3 release (`call_with_signature`): the unused inputs
    (None), `_SETTINGS`, `values` and the window (left, right) under every release's names."""
    known = dict.fromkeys(_UNUSED_INPUTS)
    known.update(_SETTINGS, **values)
    known.update(window_size=(left, right), window_size_left=left, window_size_right=right)
    return known


def _required(left: int, right: int, *causal: str) -> tuple[tuple[str, ...], ...]:
    """What the call must be able to pass (`call_with_signature`): the scale, the causal flag
    and, for a window, the window; dropping any of them would change the result."""
    window = (WINDOW,) if (left, right) != (-1, -1) else ()
    return (("softmax_scale",), causal, *window)


def _new_api(fn: Any) -> bool:
    """2025 on: `(out, softmax_lse, ...)`; the 2024 betas returned `(out, q, k, v,
    out_padded, softmax_lse, S_dmask)`. The releases differ in `k_new` (added in 2025), and
    the kernel also checks the 7-tuple before reading the LSE at index 5."""
    return "k_new" in inspect.signature(getattr(fn, "_init_fn", fn)).parameters


class FlashAttn3Kernel(FlashKernel):
    """FlashAttention-3 on Hopper (fp16/bf16): native GQA, [B, S, H, D] layout, LSE out,
    backward with given out/LSE. Inputs whose last dimension is contiguous go in as they are
    (FA3 copies only the others, as flash-attn 2 does); the LSE goes in dense. A band goes in
    as the window (`window_size` or `window_size_left/right`, whichever the release names)
    with `causal=False`, in the calls `flash_calls` makes exact (the 2024 betas clamp windows
    as flash-attn 2 does). A release without a window cannot apply a band (`supports_band`
    False, and a call with one is an error, never full attention)."""

    name = "flash_attn3"

    def __init__(self, module: ModuleType | None = None) -> None:
        fa = module or flash_attn3_interface()
        if fa is None:
            raise ImportError(f"{MODULE} (FlashAttention-3) does not import")
        self._fa = fa
        self._beta = not _new_api(fa._flash_attn_forward)
        self.supports_band = takes_window(fa)
        """Whether a mask band (document / sliding-window piece) can be applied."""

    def _call(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        left: int, right: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        res = call_with_signature(
            self._fa._flash_attn_forward,
            _known(left, right, out=None, softmax_scale=scale, causal=causal),
            last_dim_contiguous(q),
            last_dim_contiguous(k),
            last_dim_contiguous(v),
            required=_required(left, right, "causal"),
        )
        lse = res[5] if self._beta and len(res) == 7 else res[1]
        return res[0], lse.float()

    def _call_backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, left: int, right: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        def fresh(x: torch.Tensor) -> torch.Tensor:  # contiguous, as FA3 wants its outputs
            return torch.empty(x.shape, dtype=x.dtype, device=x.device)

        dq, dk, dv = fresh(q), fresh(k), fresh(v)
        known = _known(
            left, right, dq=dq, dk=dk, dv=dv, softmax_scale=scale, causal=causal, is_causal=causal
        )
        call_with_signature(
            self._fa._flash_attn_backward,
            known,
            last_dim_contiguous(dout),
            last_dim_contiguous(q),
            last_dim_contiguous(k),
            last_dim_contiguous(v),
            last_dim_contiguous(out),
            lse.contiguous(),
            required=_required(left, right, "causal", "is_causal"),
        )
        return dq, dk, dv
