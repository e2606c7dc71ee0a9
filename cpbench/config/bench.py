"""`BenchConfig`: one benchmark point, the configuration type every layer shares.

Pure Python (no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TypeGuard

from cpbench.config.constraints import (
    AttentionShape,
    Feasibility,
    check_cp_comm,
    check_mesh,
    scheme_of,
    seq_divisor,
)
from cpbench.config.impls import DEFAULT_IMPL, IMPLS
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import (
    BACKENDS,
    DEFAULT_CP_COMM,
    DEVICES,
    DTYPES,
    LAYOUTS,
    PHASES,
    Backend,
    CpComm,
    Device,
    Dtype,
    Layout,
    Phase,
    Scheme,
)
from cpbench.errors import CpbenchError


def factorizations(world_size: int) -> list[tuple[int, int]]:
    """Every U x R mesh of `world_size` ranks as (U, R), pure ring (U = 1) first: the meshes a
    scenario's `mesh = "all"`, `cpbench verify` and `cpbench recommend` consider."""
    return [(u, world_size // u) for u in range(1, world_size + 1) if world_size % u == 0]


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (TOML and Python both let True pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------
# One benchmark point
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark point: a model shape on a U x R mesh with a layout, kernel and phase."""

    seq_len: int
    """L: global sequence length in tokens."""
    batch: int
    """B: sequences per micro-batch."""
    heads: int
    """h: query heads."""
    kv_heads: int
    """h_kv: key/value heads (GQA when smaller than heads)."""
    head_dim: int
    """d_h: channels per head."""
    dtype: Dtype
    """Element type of Q, K, V and the output."""
    causal: bool
    """Causal (decoder) mask when true, full attention when false."""
    ulysses: int
    """U: Ulysses (all-to-all) degree."""
    ring: int
    """R: ring degree."""
    layout: Layout
    """How the sequence is cut over the ring: contiguous, zigzag or striped."""
    kv_replication: int | None
    """Copies of each KV head before the Ulysses exchange; None = as many as the mesh needs,
    1 = none allowed."""
    backend: Backend
    """Local attention kernel requested (auto picks the best available)."""
    phase: Phase
    """What is timed: the forward pass, or forward plus backward."""
    device: Device
    """Where the ranks run: cpu (gloo) or cuda (nccl)."""
    world_size: int
    """Number of ranks (U x R for a feasible point)."""
    nodes: int = 1
    """Hosts the ranks span (torchrun --nnodes)."""
    impl: str = DEFAULT_IMPL
    """Which implementation runs the attention: cpbench's own or an external library
    (`cpbench.config.impls.IMPLS`)."""
    documents: tuple[int, ...] | None = None
    """Lengths of the documents packed into each sequence (summing to seq_len); None = one
    document. A query sees only keys of its own document (`cpbench.config.masks`)."""
    window: int | None = None
    """Sliding window W: a query sees the last W keys, itself included; None = unbounded."""
    cp_comm: CpComm = DEFAULT_CP_COMM
    """How the ring axis (R > 1) exchanges K/V: p2p (the ring) or all_gather (the Llama 3
    scheme: all-gather K/V in head strides, reduce-scatter dK/dV). Ignored when R = 1."""
    heads_k_stride: int | None = None
    """all_gather only: KV heads per gather (the next stride travels while one is computed
    on); None = all the KV heads a rank holds in one gather."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch", "heads", "kv_heads", "head_dim", "ulysses", "ring"):
            check_positive_int(name, getattr(self, name))
        for name in ("world_size", "nodes"):
            check_positive_int(name, getattr(self, name))
        for name, allowed in (
            ("dtype", DTYPES),
            ("layout", LAYOUTS),
            ("backend", BACKENDS),
            ("phase", PHASES),
            ("device", DEVICES),
            ("impl", IMPLS),
        ):
            if getattr(self, name) not in allowed:
                raise CpbenchError(
                    f"{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}"
                )
        if not isinstance(self.causal, bool):
            raise CpbenchError(f"causal must be true or false, got {self.causal!r}")
        if self.kv_replication is not None:
            check_positive_int("kv_replication", self.kv_replication)
        check_cp_comm(self.cp_comm, self.heads_k_stride, None)
        self.mask.check_length(self.seq_len)

    @property
    def mask(self) -> MaskSpec:
        """The attention mask: causal or full, documents, window."""
        return MaskSpec(causal=self.causal, documents=self.documents, window=self.window)

    @property
    def shape(self) -> AttentionShape:
        """The global attention problem (raises CpbenchError if kv_heads does not divide heads)."""
        return AttentionShape(
            seq_len=self.seq_len,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            batch=self.batch,
        )

    def feasibility(self) -> Feasibility:
        """Whether the point can run, why not, and the KV replication it uses."""
        try:
            shape = self.shape
        except CpbenchError as exc:
            return Feasibility(False, str(exc))
        feasible = check_mesh(
            shape, self.ulysses, self.ring, self.layout, self.kv_replication, self.world_size
        )
        if feasible.ok and self.heads_k_stride is not None:
            per_rank = feasible.kv_replication * self.kv_heads // self.ulysses
            try:
                check_cp_comm(self.cp_comm, self.heads_k_stride, per_rank)
            except CpbenchError as exc:
                return Feasibility(False, str(exc))
        return feasible

    @property
    def scheme(self) -> Scheme:
        """single (U = R = 1), ulysses (R = 1); ring / usp with p2p, allgather /
        usp_allgather with all_gather on the ring axis (`scheme_of`)."""
        return scheme_of(self.ulysses, self.ring, self.cp_comm)

    @property
    def key(self) -> str:
        """Stable id of the point (the record's "id", used by --resume); differs whenever any
        field differs. kv_replication appears as requested ("repauto" for automatic); the impl
        is appended unless it is cpbench's own, `-ag` (and `-hs<stride>`) only when the ring
        axis all-gathers (ids of earlier results stay valid)."""
        rep = "auto" if self.kv_replication is None else str(self.kv_replication)
        key = (
            f"L{self.seq_len}-B{self.batch}-h{self.heads}-kv{self.kv_heads}-d{self.head_dim}"
            f"-{self.dtype}-{'causal' if self.causal else 'full'}"
            f"-U{self.ulysses}xR{self.ring}-{self.layout}-rep{rep}-{self.backend}-{self.phase}"
            f"-{self.device}-w{self.world_size}"
        )
        key = key if self.nodes == 1 else f"{key}-n{self.nodes}"
        mask = self.mask
        key = key if mask.plain else f"{key}-{mask.short_key()}"
        if self.cp_comm != DEFAULT_CP_COMM:
            key = f"{key}-ag"
            key = key if self.heads_k_stride is None else f"{key}-hs{self.heads_k_stride}"
        return key if self.impl == DEFAULT_IMPL else f"{key}-impl_{self.impl}"

    def check_seq_len(self, max_seq_len: int) -> int:
        """Sequence length of the correctness check: min(seq_len, max_seq_len) rounded down to
        a multiple the mesh and layout accept (never below one such multiple); TransformerEngine
        also needs 2P equal chunks."""
        divisor = seq_divisor(self.ulysses, self.ring, self.layout)
        if self.layout == "doc_zigzag":  # the check runs the padded length too
            divisor = self.ulysses * self.ring
        if self.impl.startswith("transformer_engine"):
            divisor = math.lcm(divisor, 2 * self.world_size)
        length = min(self.seq_len, max_seq_len) // divisor * divisor
        return max(length, divisor)

    def to_dict(self, kv_replication: int | None = None, kernel: str | None = None) -> dict:
        """The record's "config" dict (see cpbench.results.schema), with the resolved KV replication
        (None keeps the requested value) and the kernel actually used (None when not run)."""
        return {
            "seq_len": self.seq_len,
            "batch": self.batch,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "causal": self.causal,
            "ulysses": self.ulysses,
            "ring": self.ring,
            "layout": self.layout,
            "kv_replication": self.kv_replication if kv_replication is None else kv_replication,
            "backend": self.backend,
            "kernel": kernel,
            "device": self.device,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "phase": self.phase,
            "scheme": self.scheme,
            "impl": self.impl,
            "mask": self.mask.kind,
            "documents": None if self.documents is None else list(self.documents),
            "window": self.window,
            "cp_comm": self.cp_comm,
            "heads_k_stride": self.heads_k_stride,
        }

    @classmethod
    def from_dict(cls, d: dict) -> BenchConfig:
        """Rebuild a point from a record's "config" dict; extra keys (scheme, kernel) are
        ignored. Its kv_replication is the recorded (resolved) value; a record without "impl"
        (written before the impl axis) is cpbench's own, one without "cp_comm" p2p."""
        names = [f.name for f in fields(cls)]
        optional = ("nodes", "impl", "documents", "window", "cp_comm", "heads_k_stride")
        missing = [n for n in names if n not in d and n not in optional]
        if missing:
            raise CpbenchError(f"config record lacks {', '.join(missing)}")
        values = {n: d[n] for n in names if n in d}
        if values.get("documents") is not None:
            values["documents"] = tuple(values["documents"])
        return cls(**values)


def check_positive_int(name: str, value: object) -> None:
    if not is_int(value) or value <= 0:
        raise CpbenchError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class VerifyCase:
    """One correctness case of `cpbench verify` (and of the check before every benchmarked
    point): a mesh, layout, mask and GQA shape on small tensors drawn from `seed`."""

    ulysses: int
    ring: int
    layout: Layout
    causal: bool
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int = 16
    batch: int = 2
    dtype: Dtype = "float32"
    kernel: Backend = "auto"
    seed: int = 0
    impl: str = DEFAULT_IMPL
    documents: tuple[int, ...] | None = None
    """Packed document lengths (sum = seq_len), None = one document."""
    window: int | None = None
    """Sliding window, None = unbounded."""
    cp_comm: CpComm = DEFAULT_CP_COMM
    """How the ring axis exchanges K/V: p2p (ring) or all_gather."""
    heads_k_stride: int | None = None
    """all_gather: KV heads per gather, None = all."""

    @property
    def scheme(self) -> Scheme:
        return scheme_of(self.ulysses, self.ring, self.cp_comm)

    @property
    def mask(self) -> MaskSpec:
        return MaskSpec(causal=self.causal, documents=self.documents, window=self.window)

    @property
    def label(self) -> str:
        label = (
            f"{self.scheme} U{self.ulysses}xR{self.ring} {self.layout} "
            f"{self.mask.label} h{self.heads}/kv{self.kv_heads}"
        )
        if self.heads_k_stride is not None:
            label = f"{label} stride {self.heads_k_stride}"
        return label if self.impl == DEFAULT_IMPL else f"{self.impl} {label}"

    def bench_config(self, device: Device) -> BenchConfig:
        """The case as a BenchConfig (fwd+bwd), for the impl adapters' capability checks."""
        return BenchConfig(
            seq_len=self.seq_len,
            batch=self.batch,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            causal=self.causal,
            ulysses=self.ulysses,
            ring=self.ring,
            layout=self.layout,
            kv_replication=None,
            backend=self.kernel,
            phase="fwd+bwd",
            device=device,
            world_size=self.ulysses * self.ring,
            impl=self.impl,
            documents=self.documents,
            window=self.window,
            cp_comm=self.cp_comm,
            heads_k_stride=self.heads_k_stride,
        )
