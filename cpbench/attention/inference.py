"""Context-parallel prefill with a cached prefix, forward only, by one of four schemes.

Usage, shards and pieces: docs/inference.md, "cpbench's prefill and decode schemes"."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.distributed as dist

from cpbench.attention.comm import all_gather_chunks, all_to_all, ring_exchange
from cpbench.attention.kernels import (
    LocalKernel,
    accumulator_dtype,
    default_scale,
    select_kernel,
)
from cpbench.attention.mesh import CPMesh
from cpbench.attention.ring import _merge
from cpbench.attention.ulysses import heads_to_seq, seq_to_heads
from cpbench.config.inference import ulysses_kv_heads, ulysses_rule
from cpbench.errors import CpbenchError
from cpbench.model.inference import (
    DEFAULT_NEW_TOKEN_LAYOUT,
    NewTokenLayout,
    PrefillScheme,
    Segment,
    check_new_token_layout,
    check_scheme,
    kv_block,
    new_token_counts,
    new_token_offsets,
    new_token_segments,
    split_sizes,
    split_starts,
)


class _Shards:
    """Where every rank's cache and new-token shards lie (positions and sizes)."""

    def __init__(self, cached_len: int, new_tokens: int, world: int, layout: str) -> None:
        the_layout = check_new_token_layout(layout)
        self.cached_len = cached_len
        self.new_tokens = new_tokens
        self.layout = the_layout
        self.cache = split_sizes(cached_len, world)
        self.cache_start = split_starts(cached_len, world)
        self.runs = new_token_segments(new_tokens, world, the_layout)
        self.offsets = new_token_offsets(new_tokens, world, the_layout)
        self.new = new_token_counts(new_tokens, world, the_layout)
        self.q_block = max(self.new)
        self.kv_block = kv_block(cached_len, new_tokens, world, the_layout)


def _mesh_rank(mesh: CPMesh, scheme: PrefillScheme) -> int:
    """This rank's shard index; the scheme's mesh shape is checked (ulysses: W x 1, ring
    schemes: 1 x W)."""
    want = (mesh.world, 1) if scheme == "ulysses" else (1, mesh.world)
    if (mesh.ulysses, mesh.ring) != want:
        raise CpbenchError(
            f"prefill scheme {scheme} runs on a U x R = {want[0]} x {want[1]} mesh of "
            f"{mesh.world} ranks, got {mesh.ulysses} x {mesh.ring}"
        )
    return mesh.rank


def shard_prefill(
    q_new: torch.Tensor,
    k_all: torch.Tensor,
    v_all: torch.Tensor,
    mesh: CPMesh,
    cached_len: int,
    new_token_layout: NewTokenLayout = DEFAULT_NEW_TOKEN_LAYOUT,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's shards of global `q_new [B, T, h, D]` and `k_all`/`v_all [B, P+T, h_kv, D]`:
    its new-token queries (its runs of `new_token_layout`, in increasing position), and its
    cache shard followed by the same new tokens of K and V."""
    t = q_new.shape[1]
    if k_all.shape[1] != cached_len + t or v_all.shape != k_all.shape:
        raise CpbenchError(
            f"k and v must hold cached_len + new_tokens = {cached_len} + {t} = "
            f"{cached_len + t} tokens; got k {tuple(k_all.shape)}, v {tuple(v_all.shape)}"
        )
    shards = _Shards(cached_len, t, mesh.world, new_token_layout)
    r = mesh.rank
    c0, c1 = shards.cache_start[r], shards.cache_start[r + 1]

    def new(x: torch.Tensor) -> list[torch.Tensor]:
        return [x[:, start : start + n] for start, n in shards.runs[r]]

    def kv(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, c0:c1], *new(x[:, cached_len:])], dim=1)

    q = torch.cat(new(q_new), dim=1) if shards.runs[r] else q_new[:, :0]
    return q.contiguous(), kv(k_all), kv(v_all)


def unshard_prefill(
    local: torch.Tensor,
    mesh: CPMesh,
    new_tokens: int,
    new_token_layout: NewTokenLayout = DEFAULT_NEW_TOKEN_LAYOUT,
) -> torch.Tensor:
    """Gather every rank's output shard `[B, t_r, h, D]` back into `[B, T, h, D]` in position
    order (collective over the CP group; shards travel padded to the largest)."""
    the_layout = check_new_token_layout(new_token_layout)
    sizes = new_token_counts(new_tokens, mesh.world, the_layout)
    padded = _pad_rows(local, max(sizes))
    pieces = [torch.empty_like(padded) for _ in range(mesh.world)]
    dist.all_gather(pieces, padded.contiguous(), group=mesh.cp_group)
    held = torch.cat([p[:, :n] for p, n in zip(pieces, sizes, strict=True)], dim=1)
    order = new_token_offsets(new_tokens, mesh.world, the_layout)  # row i holds offset order[i]
    out = torch.empty_like(held)
    out[:, torch.tensor(order, dtype=torch.long, device=held.device)] = held
    return out


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with dim 1 zero-padded to `rows`."""
    if x.shape[1] == rows:
        return x
    pad = x.new_zeros((x.shape[0], rows - x.shape[1], *x.shape[2:]))
    return torch.cat([x, pad], dim=1)


def _attend_chunk(
    kernel: LocalKernel,
    q: torch.Tensor,
    q_runs: tuple[Segment, ...],
    chunk: torch.Tensor,
    owner: int,
    shards: _Shards,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> None:
    """Merge into (out, lse) the attention of `q` (new-token rows: the runs `q_runs`, in
    increasing position) to the K/V chunk `[B, L, 2, h_kv, D]` of rank `owner`: its cache part
    (full) and each run of its new part (top-left causal for the query run it is, full for the
    query runs after it: a suffix of the rows, one call; nothing for the runs before it)."""
    if q.shape[1] == 0:
        return
    cached = shards.cache[owner]
    pieces: list[tuple[int, int, int, int, bool]] = []  # rows [r0, r1) x keys [c0, c1)
    if cached:
        pieces.append((0, q.shape[1], 0, cached, False))
    col = cached
    for k_start, k_len in shards.runs[owner]:
        row, full_from = 0, None
        for q_start, q_len in q_runs:
            if q_start == k_start and q_len == k_len:
                pieces.append((row, row + q_len, col, col + k_len, True))
            elif q_start >= k_start + k_len:
                full_from = row if full_from is None else full_from
            elif q_start + q_len > k_start:  # runs of one partition never overlap otherwise
                raise CpbenchError(
                    f"new-token runs overlap unexpectedly: queries from {q_start} ({q_len} "
                    f"rows), keys from {k_start} ({k_len} rows)"
                )
            row += q_len
        if full_from is not None:
            pieces.append((full_from, row, col, col + k_len, False))
        col += k_len
    for r0, r1, c0, c1, causal in _coalesced(pieces):
        block_out, block_lse = kernel.forward(
            q[:, r0:r1], chunk[:, c0:c1, 0], chunk[:, c0:c1, 1], causal, scale
        )
        _merge(out[:, r0:r1], lse[:, :, r0:r1], block_out, block_lse)


def _coalesced(
    pieces: list[tuple[int, int, int, int, bool]],
) -> list[tuple[int, int, int, int, bool]]:
    """`pieces` with each full piece joined to the full piece before it when both cover the
    same rows and their key columns meet (the cache and a run wholly before the queries: one
    kernel call instead of two)."""
    joined: list[tuple[int, int, int, int, bool]] = []
    for piece in pieces:
        if joined and not piece[4] and not joined[-1][4]:
            r0, r1, c0, c1, _ = joined[-1]
            if (r0, r1, c1) == (piece[0], piece[1], piece[2]):
                joined[-1] = (r0, r1, c0, piece[3], False)
                continue
        joined.append(piece)
    return joined


def merge_accumulators(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The empty softmax merge of queries `q [B, n, h, D]`: out 0 `[B, n, h, D]` and LSE -inf
    `[B, h, n]`, in `accumulator_dtype`."""
    b, n, h, d = q.shape
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros((b, n, h, d), dtype=acc, device=q.device)
    lse = torch.full((b, h, n), float("-inf"), dtype=acc, device=q.device)
    return out, lse


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mesh: CPMesh,
    cached_len: int,
    new_tokens: int,
    scheme: PrefillScheme = "pass_kv",
    kernel: str | LocalKernel = "auto",
    scale: float | None = None,
    new_token_layout: NewTokenLayout = DEFAULT_NEW_TOKEN_LAYOUT,
) -> torch.Tensor:
    """Prefill attention of this rank's shards (`shard_prefill` with the same
    `new_token_layout`): `q [B, t_r, h, D]`, `k`/`v [B, c_r + t_r, h_kv, D]`; returns this
    rank's output rows `[B, t_r, h, D]`, in its queries' order. Forward only (no autograd).
    Collective over the mesh's ring group (ring schemes) or Ulysses group."""
    scheme = check_scheme(scheme)
    rank = _mesh_rank(mesh, scheme)
    shards = _Shards(cached_len, new_tokens, mesh.world, new_token_layout)
    want_q, want_kv = shards.new[rank], shards.cache[rank] + shards.new[rank]
    if q.dim() != 4 or q.shape[1] != want_q or k.shape[1] != want_kv or v.shape != k.shape:
        raise CpbenchError(
            f"rank {rank} of {mesh.world} holds {want_q} new tokens and {want_kv} K/V tokens "
            f"(P = {cached_len}, T = {new_tokens}); got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise CpbenchError(
            f"q heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]}) and the "
            f"head dims equal ({q.shape[3]} vs {k.shape[3]})"
        )
    if isinstance(kernel, str):
        kernel = select_kernel(q.device, q.dtype, kernel, band=False, head_dim=q.shape[3])
    the_scale = default_scale(q.shape[3], scale)
    with torch.no_grad():
        kv = torch.stack([k, v], dim=2)  # [B, L, 2, h_kv, D]: K and V travel together
        if scheme == "ulysses":
            return _ulysses(q, kv, mesh, shards, kernel, the_scale)
        if scheme == "pass_q":
            return _pass_q(q, kv, mesh, shards, kernel, the_scale)
        return _pass_kv(q, kv, mesh, shards, kernel, the_scale, scheme == "all_gather")


def _circulate(x: torch.Tensor, mesh: CPMesh, tag: str) -> Iterator[tuple[int, torch.Tensor]]:
    """(step, the block held at that step) of `x` hopping W - 1 times round the ring: each hop
    is posted before the step computes and waited for after it."""
    for step in range(mesh.world):
        pending = None
        if step + 1 < mesh.world:
            pending = ring_exchange(x, mesh.ring_next, mesh.ring_prev, mesh.ring_group, tag)
        yield step, x
        if pending is not None:
            x = pending.wait()


def _pass_kv(
    q: torch.Tensor,
    kv: torch.Tensor,
    mesh: CPMesh,
    shards: _Shards,
    kernel: LocalKernel,
    scale: float,
    gather: bool,
) -> torch.Tensor:
    """Ring pass-KV (the chunk hops W - 1 times, each hop posted before the step computes), or
    with `gather` one all-gather of every rank's chunk (posted before the own chunk computes)."""
    w, r = mesh.world, mesh.rank
    out, lse = merge_accumulators(q)
    q_runs = shards.runs[r]
    chunk = _pad_rows(kv, shards.kv_block)
    if gather:  # the own chunk is computed while the gather travels, then the others
        gathering = all_gather_chunks(chunk, mesh.ring_group, w, "allgather_kv")
        _attend_chunk(kernel, q, q_runs, chunk, r, shards, scale, out, lse)
        chunks = gathering.wait()
        for owner in (o for o in range(w) if o != r):
            _attend_chunk(kernel, q, q_runs, chunks[owner], owner, shards, scale, out, lse)
        return out.to(q.dtype)
    for step, current in _circulate(chunk, mesh, "p2p_kv"):
        _attend_chunk(kernel, q, q_runs, current, (r - step) % w, shards, scale, out, lse)
    return out.to(q.dtype)


def _pass_q(
    q: torch.Tensor,
    kv: torch.Tensor,
    mesh: CPMesh,
    shards: _Shards,
    kernel: LocalKernel,
    scale: float,
) -> torch.Tensor:
    """Ring pass-Q: the query block hops W - 1 times while K/V stay; each rank keeps the
    partial output and LSE of every block it saw, and one all-to-all (outputs, then LSEs)
    brings them home, where they are merged."""
    w, r = mesh.world, mesh.rank
    b, _, h, d = q.shape
    tq = shards.q_block
    part_out = q.new_zeros((w, b, tq, h, d))
    acc = accumulator_dtype(q.dtype)
    part_lse = torch.full((w, b, h, tq), float("-inf"), dtype=acc, device=q.device)
    for step, current in _circulate(_pad_rows(q, tq), mesh, "p2p_q"):
        owner = (r - step) % w
        n = shards.new[owner]
        rows = current[:, :n]
        block_out, block_lse = merge_accumulators(rows)
        _attend_chunk(kernel, rows, shards.runs[owner], kv, r, shards, scale, block_out, block_lse)
        part_out[owner, :, :n] = block_out.to(q.dtype)
        part_lse[owner, :, :, :n] = block_lse
    got_out = all_to_all(part_out, mesh.ring_group, w, "a2a_out")  # [source rank, B, tq, h, D]
    got_lse = all_to_all(part_lse, mesh.ring_group, w, "a2a_lse")
    n = shards.new[r]
    out, lse = merge_accumulators(q)
    for src in range(w):
        _merge(out, lse, got_out[src, :, :n], got_lse[src, :, :, :n])
    return out.to(q.dtype)


def _ulysses(
    q: torch.Tensor,
    kv: torch.Tensor,
    mesh: CPMesh,
    shards: _Shards,
    kernel: LocalKernel,
    scale: float,
) -> torch.Tensor:
    """Ulysses: all-to-all to the whole sequence on W-th of the heads (KV heads replicated up
    to W when fewer), the cache part (full) and the new part (causal) merged, and back."""
    w, r = mesh.world, mesh.rank
    h, h_kv = q.shape[2], kv.shape[3]
    rule = ulysses_rule(h, h_kv, w)
    if rule is not None:
        raise CpbenchError(rule)
    copies = ulysses_kv_heads(h_kv, w) // h_kv
    if copies > 1:
        kv = kv.repeat_interleave(copies, dim=3)
    tq, lkv = shards.q_block, shards.kv_block
    group = mesh.ulysses_group
    q_all = seq_to_heads(_pad_rows(q, tq).unsqueeze(2), group, w, "a2a_q")[:, :, 0]
    kv_all = seq_to_heads(_pad_rows(kv, lkv), group, w, "a2a_kv")  # [B, W*lkv, 2, h_kv', D]
    q_rows, cache_rows, new_rows = _ulysses_rows(
        shards.cached_len, shards.new_tokens, w, shards.layout, q.device
    )
    queries = q_all[:, q_rows]
    out, lse = merge_accumulators(queries)
    for rows, causal in ((cache_rows, False), (new_rows, True)):
        if rows is not None:
            keys = kv_all[:, rows]
            block_out, block_lse = kernel.forward(
                queries, keys[:, :, 0], keys[:, :, 1], causal, scale
            )
            _merge(out, lse, block_out, block_lse)
    padded = q_all.new_zeros(q_all.shape)
    padded[:, q_rows] = out.to(q.dtype)
    back = heads_to_seq(padded.unsqueeze(2), group, w, "a2a_out")[:, :, 0]
    return back[:, : shards.new[r]]


@functools.lru_cache(maxsize=256)
def _ulysses_rows(
    cached_len: int, new_tokens: int, world: int, layout: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Index tensors on `device` of the gathered rows of every rank's block: (queries, cache
    keys or None, new keys or None), the new ones in position order (the causal piece needs
    queries and keys in the same increasing order). Built once per shape: a list copied to a
    GPU is a blocking host-to-device copy, which would land inside every timed step."""
    shards = _Shards(cached_len, new_tokens, world, layout)
    tq, lkv = shards.q_block, shards.kv_block
    held = [(s, i) for s in range(world) for i in range(shards.new[s])]
    by_position = [held[j] for j in sorted(range(len(held)), key=shards.offsets.__getitem__)]
    q_rows = [s * tq + i for s, i in by_position]
    cache_rows = [s * lkv + i for s in range(world) for i in range(shards.cache[s])]
    new_rows = [s * lkv + shards.cache[s] + i for s, i in by_position]

    def index(rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=device)

    return (
        index(q_rows),
        index(cache_rows) if cache_rows else None,
        index(new_rows) if new_rows else None,
    )
