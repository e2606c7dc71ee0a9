"""Ring attention with a custom backward, driven by the mask's ring schedule.

Q stays local; packed K/V chunks `[B, S, 2, H_kv, D]` travel around the ring of R ranks. The
transfer of the next chunk is posted before the current chunk is computed on, so the two
overlap. Partial results are merged in fp32 with their LSE (the merge's form:
docs/internals.md). Backward circulates K/V again, and an fp32 dK/dV accumulator travels with
each chunk from its first visit, so no step's activations are kept alive: only Q, K/V, the
final output and the LSE are saved. GQA: only the H_kv heads travel; the kernel handles the
head groups locally.

What each step computes is the `RingSchedule` of the mask and layout
(`cpbench.config.geometry`): ring rank j at step t runs exactly its pieces on the chunk of ring
rank (j - t) mod R (a piece is a kernel call on a row x column range, full, top-left causal or
a band), and the ring runs only the schedule's `steps` = k steps (k <= R). The byte protocol
(docs/design.md; the model counts exactly this), per rank:

* forward: K/V hops at steps 0..k-2 to the next neighbour (`p2p_kv`): k - 1 chunks;
* backward: the same k - 1 K/V hops; the own chunk's gradient (step 0) stays home, and the
  fp32 dK/dV accumulator (`p2p_dkv`) of a chunk starts at its first visit (step 1), follows
  the chunk to the next neighbour at steps 1..k-2 and after step k-1 goes straight home, to
  ring rank j - (k-1) (received from j + (k-1)), where the own gradient is added: k - 1 hops
  (a ring whose accumulator leaves with the chunk at step 0, as ring-flash-attn's and torch's
  do, sends k). With k = R the home hop is the next neighbour."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, TypeVar, get_args

import torch
import torch.distributed as dist
from torch.profiler import record_function

from cpbench.attention.comm import PendingExchange, ring_exchange
from cpbench.attention.kernels import LocalKernel
from cpbench.attention.kernels.base import Band
from cpbench.config.geometry import Packing, Piece, ring_schedule

_T = TypeVar("_T")

Variant = Literal["full", "compute", "comm"]
"""`full` the real step; `compute` the same step with communication removed (each rank sees
its own chunk at every step); `comm` the same communication with the kernels removed."""
VARIANTS: tuple[Variant, ...] = get_args(Variant)

KV_MESSAGE_TAG = 0
DKV_MESSAGE_TAG = 1


@dataclass(frozen=True)
class RingSpec:
    """What ring attention needs of the mesh: the ring group, position and peers."""

    group: dist.ProcessGroup | None
    """The ring's process group (None: the default group)."""
    size: int
    """R: ranks in the ring."""
    rank: int
    """This rank's ring rank j."""
    peers: tuple[int, ...]
    """Global rank of every ring rank (the neighbours, and home for the last dK/dV hop)."""

    def peer(self, offset: int) -> int:
        """Global rank of ring rank j + offset (mod R)."""
        return self.peers[(self.rank + offset) % self.size]

    @property
    def send_to(self) -> int:
        """Global rank of ring rank j + 1."""
        return self.peer(1)

    @property
    def recv_from(self) -> int:
        """Global rank of ring rank j - 1."""
        return self.peer(-1)


@dataclass(frozen=True)
class PlannedPiece:
    """One kernel call of a ring step, ready to slice: rows of the local queries, columns of
    the visiting K/V chunk, the mask of the call."""

    rows: slice
    cols: slice
    causal: bool
    """Top-left causal (when `band` is None)."""
    band: Band | None
    """(lo, hi) for a piece that is neither full nor top-left causal; None otherwise."""
    first: bool
    """No earlier piece (this step or before) touched these rows: assign instead of merge."""


@dataclass(frozen=True)
class RingPlan:
    """One ring rank's calls per step, for the steps the ring runs."""

    steps: int
    """k: ring steps run (the schedule's `steps`)."""
    pieces: tuple[tuple[PlannedPiece, ...], ...]
    """pieces[t]: the calls at step t, on the chunk of ring rank (j - t) mod R."""
    needs_band: bool = False
    """Whether any rank of the ring (not only this one) has a band piece: the same answer on
    every rank, so a kernel that cannot apply one is refused everywhere before any exchange."""
    rows_touched: int = 0
    """Local query rows the pieces touch, counted only when every row is assigned by its first
    piece before any merge reads it (0 otherwise): when it is every local row, the fp32 output,
    LSE and dQ start uninitialised instead of filled with zeros / -inf."""


@lru_cache(maxsize=512)
def ring_plan(packing: Packing, ring_rank: int) -> RingPlan:
    """The plan of ring rank `ring_rank` from the packing's schedule (cached: a step costs no
    Python geometry)."""
    schedule = ring_schedule(packing)
    touched: list[tuple[int, int]] = []
    steps = []
    assigned_before_read = True
    for t in range(schedule.steps):
        planned = []
        for p in schedule.pieces[ring_rank][t]:
            first = all(p.q_end <= a or p.q_start >= b for a, b in touched)
            if not first and _union_length([*touched, (p.q_start, p.q_end)]) != _union_length(
                touched
            ):
                assigned_before_read = False  # a merge would read rows nobody assigned
            touched.append((p.q_start, p.q_end))
            band = piece_band(p)
            planned.append(
                PlannedPiece(
                    slice(p.q_start, p.q_end), slice(p.k_start, p.k_end), p.is_causal, band, first
                )
            )
        steps.append(tuple(planned))
    needs_band = any(piece_band(p) is not None for row in schedule.pieces for ps in row for p in ps)
    rows = _union_length(touched) if assigned_before_read else 0
    return RingPlan(schedule.steps, tuple(steps), needs_band, rows)


def piece_band(piece: Piece) -> Band | None:
    """A piece's mask as the kernels take it: its band (lo, hi), or None for a full or
    top-left causal piece (so kernels without band support run every plain mask)."""
    return None if piece.is_full or piece.is_causal else (piece.lo, piece.hi)


def call_kernel(call: Callable[..., _T], band: Band | None, *args: Any) -> _T:
    """`call(*args)` (a kernel's forward or backward), given `band=` only for a band piece."""
    return call(*args) if band is None else call(*args, band=band)


def _union_length(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of half-open intervals."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def _accumulator(
    shape: tuple[int, ...], covered: bool, fill: float, device: torch.device
) -> torch.Tensor:
    """An fp32 accumulator: uninitialised when every row will be assigned before it is read
    (`covered`), else filled with `fill` (the rows no piece touches keep it)."""
    if covered:
        return torch.empty(shape, dtype=torch.float32, device=device)
    return torch.full(shape, fill, dtype=torch.float32, device=device)


def _merge(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> None:
    """In place: (out, lse) <- softmax-merge of (out, lse) and a block's (out, lse).

    out [B, S, H, D] fp32, lse [B, H, S] fp32: l = logaddexp(l1, l2), o = o1 e^(l1-l) +
    o2 e^(l2-l). A row still at l1 = -inf (out 0) takes the block's values exactly; NaN only
    if both are -inf, which no piece produces (every row of a piece sees a key)."""
    new_lse = torch.logaddexp(lse, block_lse)
    old_w = torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
    new_w = torch.exp(block_lse - new_lse).transpose(1, 2).unsqueeze(-1)
    out.mul_(old_w).add_(block_out.to(out.dtype) * new_w)
    lse.copy_(new_lse)


def _post_next_kv(
    current: torch.Tensor, spec: RingSpec, step: int, steps: int, skip_comm: bool
) -> PendingExchange | None:
    """Post the transfer of the K/V chunk the next step needs (none after the last step)."""
    if step + 1 >= steps:
        return None
    return ring_exchange(
        current, spec.send_to, spec.recv_from, spec.group, "p2p_kv", KV_MESSAGE_TAG, skip_comm
    )


def _add_grads(
    acc: torch.Tensor | None,
    grads: list[tuple[slice, torch.Tensor, torch.Tensor]],
    like: torch.Tensor,
) -> torch.Tensor:
    """The fp32 dK/dV accumulator `[B, S, 2, H_kv, D]` of a chunk plus this step's piece
    gradients, added into the received one; with none yet, a new one (a piece over every
    column copied in, no zero fill)."""
    if acc is None:
        n = like.shape[1]
        if len(grads) == 1 and grads[0][0].start == 0 and grads[0][0].stop == n:
            acc = torch.empty(like.shape, dtype=torch.float32, device=like.device)
            _, dk, dv = grads[0]
            acc[:, :, 0].copy_(dk)
            acc[:, :, 1].copy_(dv)
            return acc
        acc = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    for cols, dk, dv in grads:
        acc[:, cols, 0] += dk
        acc[:, cols, 1] += dv
    return acc


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        kv: torch.Tensor,
        spec: RingSpec,
        plan: RingPlan,
        scale: float,
        kernel: LocalKernel,
        variant: Variant,
    ) -> torch.Tensor:
        b, n, h, d = q.shape
        skip_comm, skip_compute = variant == "compute", variant == "comm"
        covered = plan.rows_touched == n and not skip_compute
        out = _accumulator((b, n, h, d), covered, 0.0, q.device)
        lse = _accumulator((b, h, n), covered, float("-inf"), q.device)
        current = kv.contiguous()
        for step in range(plan.steps):
            pending = _post_next_kv(current, spec, step, plan.steps, skip_comm)
            for p in () if skip_compute else plan.pieces[step]:
                block_out, block_lse = call_kernel(
                    kernel.forward,
                    p.band,
                    q[:, p.rows],
                    current[:, p.cols, 0],
                    current[:, p.cols, 1],
                    p.causal,
                    scale,
                )
                with record_function("cpbench::merge"):
                    if p.first:
                        out[:, p.rows] = block_out
                        lse[:, :, p.rows] = block_lse
                    else:
                        _merge(out[:, p.rows], lse[:, :, p.rows], block_out, block_lse)
            if pending is not None:
                with record_function("cpbench::wait_kv"):
                    current = pending.wait()
        out_final = out.to(q.dtype)
        ctx.save_for_backward(q, kv, out_final, lse)
        ctx.config = (spec, plan, scale, kernel, variant)
        return out_final

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, kv, out, lse = ctx.saved_tensors
        spec, plan, scale, kernel, variant = ctx.config
        skip_comm, skip_compute = variant == "compute", variant == "comm"
        steps = plan.steps
        covered = plan.rows_touched == q.shape[1] and not skip_compute
        dout = dout.contiguous()
        dq = _accumulator(tuple(q.shape), covered, 0.0, q.device)
        current = kv.contiguous()
        own_grads: list[tuple[slice, torch.Tensor, torch.Tensor]] = []
        dkv_acc: torch.Tensor | None = None
        dkv_pending = None
        for step in range(steps):
            kv_pending = _post_next_kv(current, spec, step, steps, skip_comm)
            grads: list[tuple[slice, torch.Tensor, torch.Tensor]] = []
            for p in () if skip_compute else plan.pieces[step]:
                dq_p, dk_p, dv_p = call_kernel(
                    kernel.backward,
                    p.band,
                    dout[:, p.rows],
                    q[:, p.rows],
                    current[:, p.cols, 0],
                    current[:, p.cols, 1],
                    out[:, p.rows],
                    lse[:, :, p.rows],
                    p.causal,
                    scale,
                )
                with record_function("cpbench::accumulate"):
                    if p.first:
                        dq[:, p.rows] = dq_p
                    else:
                        dq[:, p.rows] += dq_p
                grads.append((p.cols, dk_p, dv_p))
            if step == 0:
                # The own chunk's gradient stays home (in the kernel's dtype) until the
                # accumulator of the later visits comes back: one dK/dV hop fewer than a ring
                # whose accumulator leaves with the chunk at step 0.
                own_grads = grads
            else:
                received = None
                if dkv_pending is not None:
                    with record_function("cpbench::wait_dkv"):
                        received = dkv_pending.wait()
                with record_function("cpbench::accumulate"):
                    dkv_acc = _add_grads(received, grads, kv)
                # The accumulator follows its chunk to the next rank; after the last step it
                # goes straight home, to the chunk's owner j - (k-1) (the next rank when k = R).
                last = step + 1 == steps
                dkv_pending = ring_exchange(
                    dkv_acc,
                    spec.peer(-(steps - 1)) if last else spec.send_to,
                    spec.peer(steps - 1) if last else spec.recv_from,
                    spec.group,
                    "p2p_dkv",
                    DKV_MESSAGE_TAG,
                    skip_comm,
                )
            if kv_pending is not None:
                with record_function("cpbench::wait_kv"):
                    current = kv_pending.wait()
        home = None
        if dkv_pending is not None:
            with record_function("cpbench::wait_dkv"):
                home = dkv_pending.wait()
        with record_function("cpbench::accumulate"):
            dkv_acc = _add_grads(home, own_grads, kv)
        return dq.to(q.dtype), dkv_acc.to(kv.dtype), None, None, None, None, None
