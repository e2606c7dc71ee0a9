"""Ring attention with a custom backward.

Q stays local; packed K/V chunks `[B, S, 2, H_kv, D]` travel around the ring of R ranks. The
transfer of the next chunk is posted before the current chunk is computed on, so the two
overlap. Partial results are merged in fp32 with their LSE. Backward circulates K/V again, and
an fp32 dK/dV accumulator travels with each chunk (R hops: the last one brings it home), so no
step's activations are kept alive: only Q, K/V, the final output and the LSE are saved.
GQA: only the H_kv heads travel; the kernel handles the head groups locally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cpbench.attention.comm import PendingExchange, ring_exchange
from cpbench.attention.kernels import LocalKernel
from cpbench.attention.layouts import ring_block_pieces

Variant = Literal["full", "compute", "comm"]
"""`full` the real step; `compute` the same step with communication removed (each rank sees
its own chunk at every step); `comm` the same communication with the kernels removed."""
VARIANTS: tuple[Variant, ...] = get_args(Variant)

KV_MESSAGE_TAG = 0
DKV_MESSAGE_TAG = 1


@dataclass(frozen=True)
class RingSpec:
    """What ring attention needs of the mesh: the ring group, position and neighbours."""

    group: dist.ProcessGroup | None
    size: int
    rank: int
    send_to: int
    recv_from: int


def _merge(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> None:
    """In place: (out, lse) <- softmax-merge of (out, lse) and a block's (out, lse).

    out [B, S, H, D] fp32, lse [B, H, S] fp32. Written as sigmoid/logsigmoid of the LSE
    difference, which is the stable form of o = o1 e^(l1-l) + o2 e^(l2-l), l = log(e^l1 + e^l2).
    """
    diff = (block_lse - lse).transpose(1, 2).unsqueeze(-1)  # [B, S, H, 1]
    out.sub_(torch.sigmoid(diff) * (out - block_out.float()))
    lse.sub_(F.logsigmoid(lse - block_lse))


def _post_next_kv(
    current: torch.Tensor, spec: RingSpec, step: int, skip_comm: bool
) -> PendingExchange | None:
    """Post the transfer of the K/V chunk the next step needs (none after the last step)."""
    if step + 1 >= spec.size:
        return None
    return ring_exchange(
        current, spec.send_to, spec.recv_from, spec.group, "p2p_kv", KV_MESSAGE_TAG, skip_comm
    )


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        kv: torch.Tensor,
        spec: RingSpec,
        layout: str,
        causal: bool,
        scale: float,
        kernel: LocalKernel,
        variant: Variant,
    ) -> torch.Tensor:
        b, n, h, d = q.shape
        skip_comm, skip_compute = variant == "compute", variant == "comm"
        out = torch.zeros(b, n, h, d, dtype=torch.float32, device=q.device)
        lse = torch.full((b, h, n), float("-inf"), dtype=torch.float32, device=q.device)
        current = kv.contiguous()
        for step in range(spec.size):
            pending = _post_next_kv(current, spec, step, skip_comm)
            source = (spec.rank - step) % spec.size
            for p in ring_block_pieces(layout, causal, spec.rank, source, n):
                if skip_compute:
                    break
                block_out, block_lse = kernel.forward(
                    q[:, p.q_start : p.q_end],
                    current[:, p.k_start : p.k_end, 0],
                    current[:, p.k_start : p.k_end, 1],
                    p.causal,
                    scale,
                )
                if step == 0:  # the own block covers every row: it initialises the merge
                    out[:, p.q_start : p.q_end] = block_out.float()
                    lse[:, :, p.q_start : p.q_end] = block_lse
                else:
                    _merge(
                        out[:, p.q_start : p.q_end],
                        lse[:, :, p.q_start : p.q_end],
                        block_out,
                        block_lse,
                    )
            if pending is not None:
                current = pending.wait()
        out_final = out.to(q.dtype)
        ctx.save_for_backward(q, kv, out_final, lse)
        ctx.config = (spec, layout, causal, scale, kernel, variant)
        return out_final

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, kv, out, lse = ctx.saved_tensors
        spec, layout, causal, scale, kernel, variant = ctx.config
        skip_comm, skip_compute = variant == "compute", variant == "comm"
        n = q.shape[1]
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        current = kv.contiguous()
        dkv_acc: torch.Tensor | None = None
        dkv_pending = None
        for step in range(spec.size):
            kv_pending = _post_next_kv(current, spec, step, skip_comm)
            source = (spec.rank - step) % spec.size
            block_dkv: torch.Tensor | None = None
            for p in ring_block_pieces(layout, causal, spec.rank, source, n):
                if skip_compute:
                    break
                rows, cols = slice(p.q_start, p.q_end), slice(p.k_start, p.k_end)
                dq_p, dk_p, dv_p = kernel.backward(
                    dout[:, rows],
                    q[:, rows],
                    current[:, cols, 0],
                    current[:, cols, 1],
                    out[:, rows],
                    lse[:, :, rows],
                    p.causal,
                    scale,
                )
                dq[:, rows] += dq_p
                if block_dkv is None:
                    block_dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
                block_dkv[:, cols, 0] += dk_p
                block_dkv[:, cols, 1] += dv_p
            if dkv_pending is not None:
                received = dkv_pending.wait()
                dkv_acc = received if block_dkv is None else received.add_(block_dkv)
            else:
                dkv_acc = (
                    block_dkv
                    if block_dkv is not None
                    else torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
                )
            if spec.size > 1:
                # The accumulator follows its chunk to the next rank; after the last step
                # this hop brings it back to the chunk's owner.
                dkv_pending = ring_exchange(
                    dkv_acc,
                    spec.send_to,
                    spec.recv_from,
                    spec.group,
                    "p2p_dkv",
                    DKV_MESSAGE_TAG,
                    skip_comm,
                )
            if kv_pending is not None:
                current = kv_pending.wait()
        dkv = dkv_pending.wait() if dkv_pending is not None else dkv_acc
        if dkv is None:  # unreachable: the loop runs at least once
            raise RuntimeError("ring backward produced no dK/dV")
        return dq.to(q.dtype), dkv.to(kv.dtype), None, None, None, None, None, None
