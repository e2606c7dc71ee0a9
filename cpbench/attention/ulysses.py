"""Ulysses all-to-all: sequence shards with all heads <-> the whole (ring-level) sequence with
a head shard, as autograd functions whose backward is the opposite exchange.

Tensors carry a group axis G so that K and V travel in one all-to-all: `[B, S, G, H, D]`
(Q and O: G = 1; packed K/V: G = 2). Heads are split per group, so head shard u of K and of V
land on the same rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from cpbench.attention.comm import all_to_all


def seq_to_heads(
    x: torch.Tensor, group: dist.ProcessGroup | None, size: int, tag: str, skip: bool = False
) -> torch.Tensor:
    """[B, S, G, H, D] on each of `size` ranks -> [B, size*S, G, H/size, D]."""
    b, s, g, h, d = x.shape
    send = x.view(b, s, g, size, h // size, d).permute(3, 0, 1, 2, 4, 5)
    with record_function("cpbench::a2a"):  # the exchange is blocking: its time is a wait
        recv = all_to_all(send, group, size, tag, skip)  # [src, B, S, G, H/size, D]
    return recv.permute(1, 0, 2, 3, 4, 5).reshape(b, size * s, g, h // size, d)


def heads_to_seq(
    x: torch.Tensor, group: dist.ProcessGroup | None, size: int, tag: str, skip: bool = False
) -> torch.Tensor:
    """[B, size*S, G, H/size, D] -> [B, S, G, H, D] (inverse of `seq_to_heads`)."""
    b, s_all, g, h_local, d = x.shape
    s = s_all // size
    send = x.view(b, size, s, g, h_local, d).permute(1, 0, 2, 3, 4, 5)
    with record_function("cpbench::a2a"):
        recv = all_to_all(send, group, size, tag, skip)  # [head shard, B, S, G, H/size, D]
    return recv.permute(1, 2, 3, 0, 4, 5).reshape(b, s, g, size * h_local, d)


class SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: Any, size: int, tags: tuple[str, str], skip: bool
    ) -> torch.Tensor:
        ctx.args = (group, size, tags[1], skip)
        return seq_to_heads(x, group, size, tags[0], skip)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return heads_to_seq(grad, *ctx.args), None, None, None, None


class HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: Any, size: int, tags: tuple[str, str], skip: bool
    ) -> torch.Tensor:
        ctx.args = (group, size, tags[1], skip)
        return heads_to_seq(x, group, size, tags[0], skip)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return seq_to_heads(grad, *ctx.args), None, None, None, None
