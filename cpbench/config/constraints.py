"""Feasibility rules for a context-parallel configuration, in one place: the attention code, the
harness and the recommender all ask `check_mesh` whether a (shape, U x R mesh, layout) can run,
so every rule and its message lives here. Pure Python: no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from cpbench.config.vocabulary import CP_COMMS, LAYOUTS, Scheme
from cpbench.errors import CpbenchError

MAX_CPU_RANKS = 64
"""Most gloo ranks cpbench starts on one host: each is a process that imports torch (about
0.3 GiB resident), so more is an out-of-memory machine, not a measurement; a launched world
(torchrun, srun) is not bounded."""


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (TOML and Python both let True pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(name: str, value: object) -> None:
    if not is_int(value) or value <= 0:
        raise CpbenchError(f"{name} must be a positive integer, got {value!r}")


def check_cpu_world(world_size: int) -> None:
    """CpbenchError unless 1 <= `world_size` <= MAX_CPU_RANKS local CPU ranks."""
    if not 1 <= world_size <= MAX_CPU_RANKS:
        raise CpbenchError(
            f"world size ({world_size}) on the CPU must be 1 to {MAX_CPU_RANKS} local ranks "
            f"(each is a process that imports torch); launch more with torchrun"
        )


def scheme_of(ulysses: int, ring: int, cp_comm: str = "p2p") -> Scheme:
    """The scheme a U x R mesh runs: single (U = R = 1), ulysses (R = 1); on a ring axis
    (R > 1) ring (U = 1) or usp (U > 1) with p2p K/V exchange, allgather (U = 1) or
    usp_allgather (U > 1) when the ring axis all-gathers K/V (`cp_comm="all_gather"`)."""
    if ring == 1:
        return "single" if ulysses == 1 else "ulysses"
    if cp_comm == "all_gather":
        return "allgather" if ulysses == 1 else "usp_allgather"
    return "ring" if ulysses == 1 else "usp"


def check_cp_comm(cp_comm: object, heads_k_stride: object, kv_heads_per_rank: int | None) -> None:
    """CpbenchError unless `cp_comm` is a `CpComm` and `heads_k_stride` is None or (with
    all_gather only) a positive divisor of the KV heads a rank holds on the ring axis
    (`c x h_kv / U`, when known)."""
    if cp_comm not in CP_COMMS:
        raise CpbenchError(f"cp_comm {cp_comm!r} is not one of {', '.join(CP_COMMS)}")
    if heads_k_stride is None:
        return
    if not is_int(heads_k_stride) or heads_k_stride <= 0:
        raise CpbenchError(f"heads_k_stride must be a positive integer, got {heads_k_stride!r}")
    if cp_comm != "all_gather":
        raise CpbenchError(
            f"heads_k_stride ({heads_k_stride}) applies to cp_comm all_gather only, "
            f"not {cp_comm!r} (the ring sends every KV head at every hop)"
        )
    if kv_heads_per_rank is not None and kv_heads_per_rank % heads_k_stride:
        raise CpbenchError(
            f"heads_k_stride ({heads_k_stride}) must divide the KV heads a rank gathers "
            f"(c x h_kv / U = {kv_heads_per_rank}): {kv_heads_per_rank} % {heads_k_stride} = "
            f"{kv_heads_per_rank % heads_k_stride}"
        )


@dataclass(frozen=True)
class AttentionShape:
    """The attention problem of one layer, global (before any sharding)."""

    seq_len: int
    """L: global sequence length in tokens."""
    heads: int
    """h: query heads."""
    kv_heads: int
    """h_kv: key/value heads (GQA when smaller than heads; MHA when equal)."""
    head_dim: int
    """d_h: channels per head."""
    batch: int = 1
    """B: sequences per micro-batch."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "heads", "kv_heads", "head_dim", "batch"):
            check_positive_int(name, getattr(self, name))
        if self.heads % self.kv_heads != 0:
            raise CpbenchError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads}) "
                f"(GQA groups query heads evenly over KV heads)"
            )


@dataclass(frozen=True)
class Feasibility:
    """Answer of `check_mesh`: whether a mesh runs, why not, and the KV replication it uses."""

    ok: bool
    """True when the configuration can run."""
    reason: str | None
    """The rule that rejects it, with the numbers; None when ok."""
    kv_replication: int = 1
    """Copies of each KV head made before the Ulysses exchange (1 = none)."""

    def raise_if_infeasible(self) -> Feasibility:
        if not self.ok:
            raise CpbenchError(self.reason or "infeasible configuration")
        return self


def required_kv_replication(kv_heads: int, ulysses: int) -> int | None:
    """KV copies needed so that every Ulysses rank gets whole KV heads; None if impossible.

    `U | h_kv` needs none; `h_kv < U` with `U % h_kv == 0` needs `U / h_kv` copies (each rank
    then holds exactly one KV head, and its query heads all map to it).
    """
    if kv_heads % ulysses == 0:
        return 1
    if ulysses % kv_heads == 0:
        return ulysses // kv_heads
    return None


def seq_divisor(ulysses: int, ring: int, layout: str) -> int:
    """The sequence length must be a multiple of this for the layout on a U x R mesh.

    Every layout gives each of the U*R ranks L/(U*R) tokens; zigzag also cuts the sequence into
    2*R chunks, so L must be a multiple of lcm(U*R, 2*R). doc_zigzag pads every document to a
    multiple of 2*R (and the ring shard to a multiple of U), so any length fits when R > 1.
    """
    if layout == "doc_zigzag" and ring > 1:
        return 1
    if layout == "zigzag":
        return math.lcm(ulysses * ring, 2 * ring)
    return ulysses * ring


def check_mesh(
    shape: AttentionShape,
    ulysses: int,
    ring: int,
    layout: str = "contiguous",
    kv_replication: int | None = None,
    world_size: int | None = None,
) -> Feasibility:
    """Check a U x R mesh for a shape; never raises for an infeasible mesh, returns the reason.

    `kv_replication=None` chooses the replication automatically; `1` forbids it; any other
    value must equal the one the mesh needs.
    """
    for name, value in (("ulysses", ulysses), ("ring", ring)):
        if not is_int(value) or value <= 0:
            return Feasibility(False, f"{name} degree must be a positive integer, got {value!r}")
    if layout not in LAYOUTS:
        return Feasibility(False, f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if world_size is not None and ulysses * ring != world_size:
        return Feasibility(
            False,
            f"ulysses ({ulysses}) x ring ({ring}) = {ulysses * ring} != world size ({world_size})",
        )
    if shape.heads % ulysses != 0:
        return Feasibility(
            False,
            f"ulysses ({ulysses}) must divide heads ({shape.heads}): "
            f"the all-to-all gives each rank heads / ulysses query heads",
        )
    needed = required_kv_replication(shape.kv_heads, ulysses)
    if needed is None:
        return Feasibility(
            False,
            f"ulysses ({ulysses}) and kv_heads ({shape.kv_heads}) do not divide each other: "
            f"need ulysses | kv_heads, or kv_heads | ulysses to replicate KV heads; "
            f"use a ulysses degree that divides {shape.kv_heads} and a larger ring",
        )
    if kv_replication is not None:
        if kv_replication == 1 and needed > 1:
            return Feasibility(
                False,
                f"ulysses {ulysses} needs {ulysses} | kv_heads ({shape.kv_heads}): "
                f"replicate KV x{needed} or use ring >= {needed} with ulysses {ulysses // needed}",
            )
        if kv_replication != needed:
            return Feasibility(
                False,
                f"kv_replication ({kv_replication}) is not what ulysses ({ulysses}) with "
                f"kv_heads ({shape.kv_heads}) needs ({needed})",
            )
    divisor = seq_divisor(ulysses, ring, layout)
    if shape.seq_len % divisor != 0:
        rule = (
            f"lcm(ulysses x ring = {ulysses * ring}, 2 x ring = {2 * ring}) = {divisor}"
            if layout == "zigzag"
            else f"ulysses ({ulysses}) x ring ({ring}) = {divisor}"
        )
        return Feasibility(
            False, f"seq_len ({shape.seq_len}) must be divisible by {rule} for the {layout} layout"
        )
    return Feasibility(True, None, needed)
