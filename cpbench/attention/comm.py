"""Every byte the attention schemes communicate goes through these functions, so that a
benchmark can remove the communication (`skip=True`) while keeping the data movement shapes
identical (the compute-only variant of a step), and so that each call to torch.distributed is
announced under the analytic model's name of its collective (`boundary.labelled`). The bytes
are counted at the torch.distributed boundary (`counting`, `cpbench.attention.boundary`): what
the call receives, as an external library's are, not what these functions say they send.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.attention.boundary import ByteCounter, boundary_counting, labelled

__all__ = ["ByteCounter", "PendingExchange", "all_to_all", "counting", "ring_exchange"]


counting = boundary_counting
"""Record every communication of this process into a `ByteCounter` while the block runs: what
each call hands to torch.distributed (`cpbench.attention.boundary`), under the analytic model's
name of the collective the scheme is running."""


def all_to_all(
    x: torch.Tensor,
    group: dist.ProcessGroup | None,
    group_size: int,
    tag: str,
    skip: bool = False,
) -> torch.Tensor:
    """All-to-all of `x` ([group_size, ...], chunk i goes to group rank i) on `group` (None:
    the default group)."""
    x = x.contiguous()
    if skip:
        # Same output shape and one copy, as the real exchange; nothing crosses the wire.
        return x.clone()
    out = torch.empty_like(x)
    with labelled(tag):
        dist.all_to_all_single(out, x, group=group)
    return out


class PendingExchange:
    """A posted ring send/recv pair, or a posted collective; `wait()` returns the tensor it
    fills (the received one)."""

    def __init__(self, works: list, received: torch.Tensor) -> None:
        self._works = works
        self._received = received

    def wait(self) -> torch.Tensor:
        for work in self._works:
            work.wait()
        return self._received


def ring_exchange(
    send: torch.Tensor,
    send_to: int,
    recv_from: int,
    group: dist.ProcessGroup | None,
    tag: str,
    message_tag: int = 0,
    skip: bool = False,
) -> PendingExchange:
    """Post an async send of `send` to global rank `send_to` and a receive of a tensor of the
    same shape from `recv_from` (batch_isend_irecv), returning before they complete so the
    caller computes while the transfer runs. `message_tag` keeps two concurrent streams between
    the same peers (K/V and dK/dV in backward) apart on transports that match by tag."""
    if skip:
        # The compute-only variant sees its own chunk again: same shapes, no transfer.
        return PendingExchange([], send)
    send = send.contiguous()
    received = torch.empty_like(send)
    ops = [
        dist.P2POp(dist.isend, send, send_to, group, message_tag),
        dist.P2POp(dist.irecv, received, recv_from, group, message_tag),
    ]
    with labelled(tag):
        works = dist.batch_isend_irecv(ops)
    return PendingExchange(works, received)


def _single(name: str, legacy: str, *args: object, **kwargs: object) -> object:
    """`dist.<name>` where this torch has it (torch >= 2.13: all_gather_single,
    reduce_scatter_single), else `dist.<legacy>` (the `*_tensor` names, which 2.13 warns on).
    Looked up at each call, so that the boundary counter sees the call."""
    function = getattr(dist, name, None) or getattr(dist, legacy)
    return function(*args, **kwargs)


def all_gather_chunks(
    x: torch.Tensor,
    group: dist.ProcessGroup | None,
    size: int,
    tag: str,
    skip: bool = False,
) -> PendingExchange:
    """Post an all-gather of `x` over the group: the result is `[A, *x.shape]` in group order.
    Counts the `(A - 1)` chunks that reach this rank from the others (what crosses the wire per
    rank; nccl-tests' algbw of an all-gather divides the whole output by the time)."""
    x = x.contiguous()
    out = torch.empty((size, *x.shape), dtype=x.dtype, device=x.device)
    if skip or size == 1:
        # compute-only variant: the own chunk in every slot, same shapes, nothing sent
        out.copy_(x.unsqueeze(0).expand_as(out))
        return PendingExchange([], out)
    # the output is one tensor of A stacked inputs along dim 0 (gloo wants it flat there)
    flat = out.view(size * x.shape[0], *x.shape[1:])
    with labelled(tag):
        work = _single(
            "all_gather_single", "all_gather_into_tensor", flat, x, group=group, async_op=True
        )
    return PendingExchange([work], out)


def reduce_scatter_chunks(
    x: torch.Tensor,
    group: dist.ProcessGroup | None,
    size: int,
    rank: int,
    tag: str,
    skip: bool = False,
) -> PendingExchange:
    """Post a sum reduce-scatter of `x` `[A, ...]`: this rank gets the sum of every rank's slot
    `rank`. Counts the `(A - 1)` slots this rank sends to the others."""
    x = x.contiguous()
    if skip or size == 1:
        return PendingExchange([], x[rank].clone())
    out = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
    flat = x.view(size * x.shape[1], *x.shape[2:])
    with labelled(tag):
        work = _single(
            "reduce_scatter_single", "reduce_scatter_tensor", out, flat, group=group, async_op=True
        )
    return PendingExchange([work], out)
