"""Every byte the attention schemes communicate goes through these two functions, so that a
`ByteCounter` can record what each rank hands to the communication library, per phase and per
collective, and a benchmark can remove the communication (`skip=True`) while keeping the data
movement shapes identical (the compute-only variant of a step).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class ByteCounter:
    """Bytes sent by this rank, keyed by (phase, collective tag).

    All-to-all counts what the rank hands in minus its own 1/n share (it is not sent);
    point-to-point counts the sent tensor. `phase` is set by the caller around forward and
    backward (`with counter.phase("bwd"): loss.backward()`)."""

    current_phase: str = "fwd"
    bytes: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self.current_phase = self.current_phase, name
        try:
            yield
        finally:
            self.current_phase = previous

    def record(self, tag: str, nbytes: int) -> None:
        self.bytes[(self.current_phase, tag)] += nbytes
        self.calls[(self.current_phase, tag)] += 1

    def total(self, phase: str | None = None) -> int:
        return sum(b for (p, _), b in self.bytes.items() if phase is None or p == phase)

    def as_dict(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (p, tag), b in sorted(self.bytes.items()):
            out[p][tag] = b
        return dict(out)


_COUNTERS: list[ByteCounter] = []


@contextlib.contextmanager
def counting(counter: ByteCounter) -> Iterator[ByteCounter]:
    """Record every communication of this process into `counter` while the block runs."""
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)


def _record(tag: str, nbytes: int) -> None:
    for counter in _COUNTERS:
        counter.record(tag, nbytes)


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
    dist.all_to_all_single(out, x, group=group)
    _record(tag, x.numel() * x.element_size() * (group_size - 1) // group_size)
    return out


class PendingExchange:
    """A posted ring send/recv pair; `wait()` returns the received tensor."""

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
    works = dist.batch_isend_irecv(ops)
    _record(tag, send.numel() * send.element_size())
    return PendingExchange(works, received)
