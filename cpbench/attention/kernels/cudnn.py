"""cuDNN's fused attention through PyTorch: `aten._scaled_dot_product_cudnn_attention` and its
`_backward`, which return and take the LSE (the ops PyTorch's own context-parallel ring uses)."""

from __future__ import annotations

import torch

from cpbench import compat
from cpbench.attention.kernels import ops
from cpbench.attention.kernels.base import Band, LocalKernel
from cpbench.attention.kernels.naive import NaiveKernel

CUDNN_MIN_VERSION = 90000
"""cuDNN 9.0: the release PyTorch's cuDNN attention (torch >= 2.5) is built and tested on."""
CUDNN_MIN_CAPABILITY = (8, 0)
"""cuDNN's fused flash attention (fprop and bprop) runs on Ampere and newer."""
ONE_KEY = NaiveKernel()
"""The pieces cuDNN refuses: torch's dispatcher never sends cuDNN a key/value length of 1
(`check_cudnn_tensor_shapes`), and inference makes such calls all the time (one-token turns,
cache shards and decode prefixes of one key). One key is a [S_q, 1] score column: exact and
cheap in float32 einsum."""
TORCH_MIN = (2, 5)
"""torch 2.5 gave the op `attn_bias` and `compute_log_sumexp` and made it a public SDPA backend;
2.4's op was marked not ready for use (pytorch#122695)."""


def cudnn_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the cuDNN kernel cannot run on `device` in `dtype`, None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (got {device.type})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16/bf16 (got {dtype})"
    if not compat.cudnn_attention_usable():
        return f"needs torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]} (installed {torch.__version__})"
    version = ops.cudnn_version()
    if version is None:
        return "needs cuDNN, which this torch cannot use (torch.backends.cudnn.is_available())"
    if version < CUDNN_MIN_VERSION:
        return f"needs cuDNN >= 9.0 (installed {version})"
    capability = ops.device_capability(device)
    if capability is None or capability < CUDNN_MIN_CAPABILITY:
        return f"needs compute capability >= 8.0 (device has {capability})"
    return None


class CudnnKernel(LocalKernel):
    """cuDNN attention (fp16/bf16, Ampere and newer) on [B, H, S, D] views (cuDNN takes any
    strides whose last one is 1). The op's LSE is [B, H, S, 1] (cudnn-frontend#837; 3-D in
    some releases): handed back as [B, H, S], given to the backward dense in the rank the
    forward produced. O and dO are made contiguous together only when their strides differ:
    cuDNN builds its backward graph from both layouts (a copy linear in S)."""

    name = "cudnn"
    bhsd = True
    keeps_rng = True

    def __init__(self) -> None:
        self._lse_4d = True

    def native_gqa(self) -> bool:
        return compat.cudnn_attention_supports_gqa()

    def _delegate(self, k: torch.Tensor) -> LocalKernel | None:
        return ONE_KEY if k.shape[1] == 1 else None

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        res = ops.call_op(
            "_scaled_dot_product_cudnn_attention",
            query=q,
            key=k,
            value=v,
            attn_bias=None,
            compute_log_sumexp=True,
            dropout_p=0.0,
            is_causal=causal,
            return_debug_mask=False,
            scale=scale,
        )
        out, lse = res[0], res[1]
        self._rng = (res[6], res[7])
        self._lse_4d = lse.dim() == 4
        return out, lse.squeeze(-1) if self._lse_4d else lse

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        seed, offset = self._recorded()
        if dout.stride() != out.stride():
            dout, out = dout.contiguous(), out.contiguous()
        dq, dk, dv = ops.call_op(
            "_scaled_dot_product_cudnn_attention_backward",
            grad_out=dout,
            query=q,
            key=k,
            value=v,
            out=out,
            logsumexp=lse.unsqueeze(-1) if self._lse_4d else lse,
            philox_seed=seed,
            philox_offset=offset,
            attn_bias=None,
            cum_seq_q=None,
            cum_seq_k=None,
            max_q=q.shape[2],
            max_k=k.shape[2],
            dropout_p=0.0,
            is_causal=causal,
            scale=scale,
        )[:3]
        return dq, dk, dv
