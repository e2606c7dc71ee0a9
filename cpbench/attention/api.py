"""The public entry point: `cp_attention(q, k, v, mesh, layout=..., mask=...)` on local shards.

The USP composition: docs/internals.md, "The attention package in use"."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.attention.allgather import AllGatherAttention, GatherSpec
from cpbench.attention.kernels import LocalKernel, band_refusal, default_scale, select_kernel
from cpbench.attention.layouts import logical_length, packing, shard_tensor, unshard_tensors
from cpbench.attention.mesh import CPMesh
from cpbench.attention.ring import RingAttention, RingSpec, Variant, ring_plan
from cpbench.attention.ulysses import HeadsToSeq, SeqToHeads
from cpbench.config.constraints import AttentionShape, check_cp_comm, check_mesh
from cpbench.config.geometry import ring_schedule
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import CpComm
from cpbench.errors import CpbenchError, KernelRefused


def resolve_mask(causal: bool | None, mask: MaskSpec | None) -> MaskSpec:
    """The mask of a call: `mask` when given (a `causal` that contradicts it is an error),
    else causal (default) or full from `causal`."""
    if mask is None:
        return MaskSpec(causal=True if causal is None else causal)
    if causal is not None and causal != mask.causal:
        raise CpbenchError(
            f"causal={causal} contradicts the mask {mask.label!r} (causal={mask.causal})"
        )
    return mask


def mask_needs_band(problem: CpProblem) -> bool:
    """Whether the problem's schedule (its mask on its mesh and layout) has band pieces (what
    `select_kernel(..., band=...)` must know to pick a kernel that applies them)."""
    return ring_plan(problem.packing, 0).needs_band


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mesh: CPMesh,
    causal: bool | None = None,
    layout: str = "contiguous",
    kernel: str | LocalKernel = "auto",
    scale: float | None = None,
    kv_replication: int | None = None,
    variant: Variant = "full",
    mask: MaskSpec | None = None,
    cp_comm: CpComm = "p2p",
    heads_k_stride: int | None = None,
) -> torch.Tensor:
    """Context-parallel attention of this rank's shards `q [B, S, h, D]`, `k`/`v [B, S, h_kv, D]`
    (sharded with `shard(..., layout=layout, mask=mask)`); returns this rank's output shard
    `[B, S, h, D]`. Autograd flows through it. `causal` (default true) applies when `mask` is
    None. Raises CpbenchError for a mesh the shapes cannot use, a mask whose documents do not
    fill the sequence, or a kernel that cannot apply the mask's pieces. `cp_comm` says how the
    ring axis exchanges K/V: p2p (the ring) or all_gather (head strides of `heads_k_stride` KV
    heads, None = all in one gather)."""
    if q.dim() != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise CpbenchError(
            f"expected q [B, S, h, D] and k, v [B, S, h_kv, D]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    the_mask = resolve_mask(causal, mask)
    b, s, h, d = q.shape
    run_len = s * mesh.world
    shape = AttentionShape(seq_len=run_len, heads=h, kv_heads=k.shape[2], head_dim=d, batch=b)
    feasible = check_mesh(
        shape, mesh.ulysses, mesh.ring, layout, kv_replication
    ).raise_if_infeasible()
    kv_per_rank = feasible.kv_replication * k.shape[2] // mesh.ulysses
    check_cp_comm(cp_comm, heads_k_stride, kv_per_rank)
    seq_len = logical_length(run_len, mesh.ulysses, mesh.ring, layout, the_mask)
    packed = packing(seq_len, mesh.ulysses, mesh.ring, layout, the_mask)
    plan = ring_plan(packed, mesh.ring_rank)
    if isinstance(kernel, str):
        local_kernel = select_kernel(q.device, q.dtype, kernel, band=plan.needs_band, head_dim=d)
    else:
        local_kernel = kernel
        if plan.needs_band and not getattr(kernel, "supports_band", False):
            raise KernelRefused(band_refusal(kernel.name, q.device, q.dtype))
    skip_comm = variant == "compute"

    if feasible.kv_replication > 1:
        # Each KV head is copied so every Ulysses rank receives one whole head; autograd sums
        # the copies' gradients back onto the original head.
        k = k.repeat_interleave(feasible.kv_replication, dim=2)
        v = v.repeat_interleave(feasible.kv_replication, dim=2)
    kv = torch.stack([k, v], dim=2)  # [B, S, 2, h_kv*c, D]: K and V travel together
    q5 = q.unsqueeze(2)  # [B, S, 1, h, D]
    if mesh.ulysses > 1:
        group = mesh.ulysses_group
        q5 = SeqToHeads.apply(q5, group, mesh.ulysses, ("a2a_q", "a2a_dq"), skip_comm)
        kv = SeqToHeads.apply(kv, group, mesh.ulysses, ("a2a_kv", "a2a_dkv"), skip_comm)
    the_scale = default_scale(d, scale)
    if cp_comm == "all_gather" and mesh.ring > 1:
        schedule = ring_schedule(packed)
        gather = GatherSpec(mesh.ring_group, mesh.ring, mesh.ring_rank)
        out = AllGatherAttention.apply(
            q5.squeeze(2), kv, gather, schedule, the_scale, local_kernel, variant, heads_k_stride
        )
        return _heads_back(out, mesh, skip_comm)
    peers = tuple(mesh.ring_peer(j) for j in range(mesh.ring))
    spec = RingSpec(mesh.ring_group, mesh.ring, mesh.ring_rank, peers)
    out = RingAttention.apply(q5.squeeze(2), kv, spec, plan, the_scale, local_kernel, variant)
    return _heads_back(out, mesh, skip_comm)


def _heads_back(out: torch.Tensor, mesh: CPMesh, skip_comm: bool) -> torch.Tensor:
    """The Ulysses all-to-all back (heads -> sequence); the output itself when U = 1."""
    if mesh.ulysses == 1:
        return out
    return HeadsToSeq.apply(
        out.unsqueeze(2), mesh.ulysses_group, mesh.ulysses, ("a2a_out", "a2a_dout"), skip_comm
    ).squeeze(2)


def shard(
    x: torch.Tensor,
    mesh: CPMesh,
    layout: str = "contiguous",
    dim: int = 1,
    mask: MaskSpec | None = None,
) -> torch.Tensor:
    """This rank's shard of a global tensor (every rank holds the global tensor, of the run
    length `layouts.run_length(mask, L, U, R, layout)` along `dim`)."""
    return shard_tensor(x, mesh.ulysses, mesh.ring, layout, mesh.rank, dim, mask)


def unshard(
    local: torch.Tensor,
    mesh: CPMesh,
    layout: str = "contiguous",
    dim: int = 1,
    mask: MaskSpec | None = None,
) -> torch.Tensor:
    """Gather every rank's shard back into the global tensor (collective over the CP group)."""
    pieces = [torch.empty_like(local) for _ in range(mesh.world)]
    dist.all_gather(pieces, local.contiguous(), group=mesh.cp_group)
    return unshard_tensors(pieces, mesh.ulysses, mesh.ring, layout, dim, mask)
