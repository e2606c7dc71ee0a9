"""All-gather context parallelism (the Llama 3 scheme; Megatron's `--cp-comm-type all_gather`;
ring-flash-attention's `llama3_*` functions). Why it exists and its costs: docs/design.md section 1.

Per rank, group of A ranks, chunk = the rank's K/V `[B, n, 2, h_kv, D]`, K/V in head strides of
`heads_k_stride` KV heads (the next stride's gather posted before computing on the current one;
the own chunk of a stride computed on before waiting for its gather):
- forward: all-gather of the K/V, `(A - 1)` chunks received (tag `ag_kv`), in `h_kv / stride`
  collectives;
- backward: the same all-gather again (nothing gathered is kept alive), then a reduce-scatter
  of the fp32 dK/dV of every chunk, `(A - 1)` fp32 chunks sent (tag `rs_dkv`).
The blocks computed are the mask's pieces (`cpbench.config.geometry`): the same `Piece`s the ring
computes at its steps, all against K/V already present."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention.comm import (
    PendingExchange,
    all_gather_chunks,
    reduce_scatter_chunks,
)
from cpbench.attention.kernels import LocalKernel
from cpbench.attention.ring import _merge, call_kernel, piece_band
from cpbench.config.geometry import RingSchedule
from cpbench.errors import CpbenchError

KV_GATHER_TAG = "ag_kv"
DKV_SCATTER_TAG = "rs_dkv"


@dataclass(frozen=True)
class GatherSpec:
    """The all-gather group: its process group, size and this rank's index in it."""

    group: dist.ProcessGroup | None
    size: int
    rank: int


def _gather(
    kv: torch.Tensor, g: int, stride: int, spec: GatherSpec, skip_comm: bool
) -> PendingExchange:
    """Post the all-gather of KV head stride `g` (`stride` KV heads) of this rank's chunk."""
    chunk = kv[:, :, :, g * stride : (g + 1) * stride]
    return all_gather_chunks(chunk, spec.group, spec.size, KV_GATHER_TAG, skip_comm)


def _strides(kv_heads: int, heads_k_stride: int | None) -> int:
    stride = kv_heads if heads_k_stride is None else heads_k_stride
    if stride <= 0 or kv_heads % stride:
        raise CpbenchError(
            f"heads_k_stride ({stride}) must be a positive divisor of the KV heads each rank "
            f"holds ({kv_heads})"
        )
    return stride


def _sources(spec: GatherSpec) -> tuple[int, ...]:
    """The other ranks' chunks, in the order they are computed on (after the own one)."""
    return tuple((spec.rank - t) % spec.size for t in range(1, spec.size))


class AllGatherAttention(torch.autograd.Function):
    """q `[B, n, H, D]`, packed kv `[B, n, 2, H_kv, D]` (this rank's chunk) -> out `[B, n, H, D]`."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        kv: torch.Tensor,
        spec: GatherSpec,
        schedule: RingSchedule,
        scale: float,
        kernel: LocalKernel,
        variant: str,
        heads_k_stride: int | None,
    ) -> torch.Tensor:
        b, n, h, d = q.shape
        kv_heads = kv.shape[3]
        stride = _strides(kv_heads, heads_k_stride)
        group_heads = h // kv_heads
        skip_comm, skip_compute = variant == "compute", variant == "comm"
        out = torch.zeros(b, n, h, d, dtype=torch.float32, device=q.device)
        lse = torch.full((b, h, n), float("-inf"), dtype=torch.float32, device=q.device)
        strides = kv_heads // stride
        order = _sources(spec)
        pending = _gather(kv, 0, stride, spec, skip_comm)
        for g in range(strides):
            heads = slice(g * stride * group_heads, (g + 1) * stride * group_heads)
            own = kv[:, :, :, g * stride : (g + 1) * stride]

            def attend(source: int, chunk: torch.Tensor, heads: slice = heads) -> None:
                step = (spec.rank - source) % spec.size
                for p in schedule.pieces[spec.rank][step]:
                    rows, cols = slice(p.q_start, p.q_end), slice(p.k_start, p.k_end)
                    block_out, block_lse = call_kernel(
                        kernel.forward,
                        piece_band(p),
                        q[:, rows, heads],
                        chunk[:, cols, 0],
                        chunk[:, cols, 1],
                        p.is_causal,
                        scale,
                    )
                    _merge(out[:, rows, heads], lse[:, heads, rows], block_out, block_lse)

            if not skip_compute:  # the own chunk is here: computed while the gather travels
                attend(spec.rank, own)
            gathered = pending.wait()
            if g + 1 < strides:  # the next stride travels while this one is computed on
                pending = _gather(kv, g + 1, stride, spec, skip_comm)
            if skip_compute:
                continue
            for source in order:
                attend(source, gathered[source])
        out_final = out.to(q.dtype)
        ctx.save_for_backward(q, kv, out_final, lse)
        ctx.config = (spec, schedule, scale, kernel, variant, stride)
        return out_final

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, kv, out, lse = ctx.saved_tensors
        spec, schedule, scale, kernel, variant, stride = ctx.config
        skip_comm, skip_compute = variant == "compute", variant == "comm"
        kv_heads = kv.shape[3]
        group_heads = q.shape[2] // kv_heads
        strides = kv_heads // stride
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dkv = torch.empty(kv.shape, dtype=torch.float32, device=kv.device)
        scatters: list[tuple[int, PendingExchange]] = []
        order = _sources(spec)
        pending = _gather(kv, 0, stride, spec, skip_comm)
        for g in range(strides):
            heads = slice(g * stride * group_heads, (g + 1) * stride * group_heads)
            own = kv[:, :, :, g * stride : (g + 1) * stride]
            dgathered = torch.zeros((spec.size, *own.shape), dtype=torch.float32, device=kv.device)

            def grads(
                source: int,
                chunk: torch.Tensor,
                heads: slice = heads,
                dgathered: torch.Tensor = dgathered,
            ) -> None:
                step = (spec.rank - source) % spec.size
                for p in schedule.pieces[spec.rank][step]:
                    rows, cols = slice(p.q_start, p.q_end), slice(p.k_start, p.k_end)
                    dq_p, dk_p, dv_p = call_kernel(
                        kernel.backward,
                        piece_band(p),
                        dout[:, rows, heads],
                        q[:, rows, heads],
                        chunk[:, cols, 0],
                        chunk[:, cols, 1],
                        out[:, rows, heads],
                        lse[:, heads, rows],
                        p.is_causal,
                        scale,
                    )
                    dq[:, rows, heads] += dq_p
                    dgathered[source][:, cols, 0] += dk_p
                    dgathered[source][:, cols, 1] += dv_p

            if not skip_compute:  # the own chunk first, while the gather travels
                grads(spec.rank, own)
            gathered = pending.wait()
            if g + 1 < strides:
                pending = _gather(kv, g + 1, stride, spec, skip_comm)
            for source in order if not skip_compute else ():
                grads(source, gathered[source])
            # each chunk's dK/dV goes home while the next stride is computed on; the one
            # before is waited for now, so at most two strides of fp32 dK/dV are alive
            scatter = reduce_scatter_chunks(
                dgathered, spec.group, spec.size, spec.rank, DKV_SCATTER_TAG, skip_comm
            )
            scatters.append((g, scatter))
            if len(scatters) > 1:
                done, oldest = scatters.pop(0)
                dkv[:, :, :, done * stride : (done + 1) * stride] = oldest.wait()
        for g, scatter in scatters:
            dkv[:, :, :, g * stride : (g + 1) * stride] = scatter.wait()
        return dq.to(q.dtype), dkv.to(kv.dtype), None, None, None, None, None, None
