"""The one configuration object: `CpProblem`, and what the layers add to it (`MeshCandidate`).

The hierarchy and the derived properties: docs/design.md section 3. Pure Python (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any, TypeVar

from cpbench.config.constraints import (
    AttentionShape,
    Feasibility,
    check_cp_comm,
    check_mesh,
    check_positive_int,
    scheme_of,
)
from cpbench.config.geometry import Packing, check_packing, pack, ring_counts
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import (
    DEFAULT_CP_COMM,
    DTYPE_BYTES,
    GLOBAL_LAYOUTS,
    KERNEL_NAMES,
    LAYOUTS,
    PHASES,
    CpComm,
    Dtype,
    Layout,
    Phase,
    Scheme,
    canonical_dtype,
)
from cpbench.errors import CpbenchError

Choice = TypeVar("Choice", bound=str)


def check_choice(name: str, value: object, allowed: tuple[Choice, ...]) -> Choice:
    """`value` as one of `allowed` (a `Literal`'s options); CpbenchError naming it otherwise."""
    for option in allowed:
        if value == option:
            return option
    raise CpbenchError(f"{name} {value!r} is not one of {', '.join(allowed)}")


def check_phase(value: object) -> Phase:
    """`value` as a `Phase`; CpbenchError naming it when it is none."""
    return check_choice("phase", value, PHASES)


P = TypeVar("P", bound="CpProblem")


@dataclass(frozen=True, kw_only=True)
class CpProblem:
    """One attention layer on a U x R context-parallel mesh (immutable; geometry cached)."""

    seq_len: int
    """L: global sequence length in tokens."""
    batch: int = 1
    """B: sequences per micro-batch."""
    heads: int
    """h: query heads."""
    kv_heads: int
    """h_kv: key/value heads (GQA when smaller than heads)."""
    head_dim: int
    """d_h: channels per head."""
    dtype: Dtype = "bfloat16"
    """Element type of Q, K, V, the output and the exchanges (aliases such as bf16 accepted)."""
    causal: bool = True
    """Causal (decoder) mask when true, full attention when false."""
    documents: tuple[int, ...] | None = None
    """Lengths of the documents packed into each sequence (summing to seq_len); None = one
    document. A query sees only keys of its own document (`cpbench.config.masks`)."""
    window: int | None = None
    """Sliding window W: a query sees the last W keys, itself included; None = unbounded."""
    ulysses: int = 1
    """U: Ulysses (all-to-all) degree."""
    ring: int = 1
    """R: ring degree."""
    layout: Layout = "contiguous"
    """How the sequence is cut over the ring (`LAYOUTS`)."""
    kv_replication: int | None = None
    """Copies of each KV head before the Ulysses exchange, as requested: None = as many as the
    mesh needs, 1 = none allowed. `replication` is the value in force."""
    cp_comm: CpComm = DEFAULT_CP_COMM
    """How the ring axis (R > 1) exchanges K/V: p2p (the ring) or all_gather (the Llama 3
    scheme: all-gather K/V in head strides, reduce-scatter dK/dV). Ignored when R = 1."""
    heads_k_stride: int | None = None
    """all_gather only: KV heads per gather; None = all the KV heads a rank holds at once."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch", "heads", "kv_heads", "head_dim", "ulysses", "ring"):
            check_positive_int(name, getattr(self, name))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        check_choice("layout", self.layout, LAYOUTS)
        if self.kv_replication is not None:
            check_positive_int("kv_replication", self.kv_replication)
        if self.documents is not None and not isinstance(self.documents, tuple):
            object.__setattr__(self, "documents", tuple(self.documents))
        check_cp_comm(self.cp_comm, self.heads_k_stride, None)
        mask = MaskSpec(causal=self.causal, documents=self.documents, window=self.window)
        mask.check_length(self.seq_len)
        object.__setattr__(self, "documents", mask.normalized().documents)  # one doc is none

    @classmethod
    def for_shape(cls: type[P], shape: AttentionShape, **problem: Any) -> P:
        """The problem of `shape` (its five sizes) with the other fields given by name."""
        sizes = ("seq_len", "batch", "heads", "kv_heads", "head_dim")
        return cls(**{f: getattr(shape, f) for f in sizes}, **problem)

    def problem_fields(self) -> dict[str, Any]:
        """The attention problem's fields by name: what a candidate or a benchmark point of
        this problem is built from (`MeshCandidate(**p.problem_fields(), phase=...)`)."""
        return {f.name: getattr(self, f.name) for f in fields(CpProblem)}

    def masked(self: P, mask: MaskSpec) -> P:
        """The same problem under `mask` (its causal flag, documents and window)."""
        return replace(self, causal=mask.causal, documents=mask.documents, window=mask.window)

    # ------------------------------------------------------------------------ the problem

    @cached_property
    def mask(self) -> MaskSpec:
        """The attention mask (causal or full, documents, window)."""
        return MaskSpec(causal=self.causal, documents=self.documents, window=self.window)

    @cached_property
    def shape(self) -> AttentionShape:
        """The global attention sizes (CpbenchError when kv_heads does not divide heads)."""
        return AttentionShape(self.seq_len, self.heads, self.kv_heads, self.head_dim, self.batch)

    @cached_property
    def feasibility(self) -> Feasibility:
        """Whether the problem runs on its mesh, why not, and the KV replication it uses."""
        try:
            shape = self.shape
        except CpbenchError as exc:
            return Feasibility(False, str(exc))
        feasible = check_mesh(
            shape, self.ulysses, self.ring, self.layout, self.kv_replication, self.ranks()
        )
        if feasible.ok and self.heads_k_stride is not None:
            per_rank = feasible.kv_replication * self.kv_heads // self.ulysses
            try:
                check_cp_comm(self.cp_comm, self.heads_k_stride, per_rank)
            except CpbenchError as exc:
                return Feasibility(False, str(exc))
        return feasible

    def ranks(self) -> int | None:
        """The ranks the mesh must fill: None for a problem, a benchmark point's world size."""
        return None

    def require_feasible(self: P) -> P:
        """This problem; CpbenchError with the rule (and its numbers) when it cannot run."""
        self.feasibility.raise_if_infeasible()
        return self

    @property
    def replication(self) -> int:
        """c: KV copies in force (the mesh's need when none is requested); CpbenchError when
        the problem cannot run."""
        return self.require_feasible().feasibility.kv_replication

    @property
    def world(self) -> int:
        """P = U x R ranks."""
        return self.ulysses * self.ring

    @property
    def scheme(self) -> Scheme:
        """single (U = R = 1), ulysses (R = 1); ring / usp with p2p, allgather /
        usp_allgather with all_gather on the ring axis (`scheme_of`)."""
        return scheme_of(self.ulysses, self.ring, self.cp_comm)

    @property
    def all_gather(self) -> bool:
        """True when the ring axis (R > 1) all-gathers K/V instead of passing it."""
        return self.cp_comm == "all_gather" and self.ring > 1

    @property
    def bytes_per_element(self) -> int:
        """e: bytes per element of `dtype`."""
        return DTYPE_BYTES[self.dtype]

    # ------------------------------------------------------------------------- geometry

    @property
    def plain_geometry(self) -> bool:
        """Causal or full attention over one sequence on a global layout: the closed forms
        apply (every ring step runs, nothing is padded), no packing is needed."""
        return self.mask.plain and self.layout in GLOBAL_LAYOUTS

    @cached_property
    def packing(self) -> Packing:
        """The sequence as it runs on the ring (`cpbench.config.geometry.pack`): documents,
        padding, each ring rank's positions; CpbenchError when the layout cannot cut it."""
        check_packing(self.seq_len, self.ulysses, self.ring, self.layout)
        return pack(self.mask, self.seq_len, self.ulysses, self.ring, self.layout)

    @property
    def run_len(self) -> int:
        """L_run: tokens the ranks hold (L plus doc_zigzag's padding)."""
        return self.seq_len if self.plain_geometry else self.packing.seq_len

    @property
    def padding(self) -> int:
        """Padding tokens the layout adds (doc_zigzag only)."""
        return self.run_len - self.seq_len

    @cached_property
    def ring_steps(self) -> int:
        """k: ring steps the mask needs (R for causal or full attention over one sequence)."""
        if self.plain_geometry or self.ring == 1:
            return self.ring
        return ring_counts(self.packing).steps

    @property
    def kv_hops(self) -> int:
        """K/V hops per pass: k - 1."""
        return self.ring_steps - 1

    @property
    def dkv_hops(self) -> int:
        """fp32 dK/dV hops in the backward: k - 1 (the own chunk's gradient stays home; each
        accumulator starts on the chunk's first visit and its last hop goes straight home)."""
        return self.ring_steps - 1

    @property
    def tokens_per_rank(self) -> int:
        """S = L_run / (U*R): tokens a rank holds before and after attention."""
        return self.run_len // self.world

    @property
    def ring_shard(self) -> int:
        """L_run / R: tokens of a ring shard (what a rank sees after the Ulysses exchange)."""
        return self.run_len // self.ring

    @property
    def heads_per_rank(self) -> int:
        """h / U: query heads a rank attends for after the Ulysses exchange."""
        return self.heads // self.ulysses

    @property
    def kv_heads_per_rank(self) -> int:
        """c * h_kv / U: KV heads a rank holds after the Ulysses exchange."""
        return self.replication * self.kv_heads // self.ulysses

    @property
    def gather_stride(self) -> int:
        """hs: KV heads per all-gather call (c*h_kv/U when no stride is set)."""
        return self.kv_heads_per_rank if self.heads_k_stride is None else self.heads_k_stride

    @property
    def gathers(self) -> int:
        """All-gather calls per pass: (c*h_kv/U) / hs (1 without a stride)."""
        return self.kv_heads_per_rank // self.gather_stride

    def symbols(self) -> dict[str, int]:
        """Value of every symbol the formulas use (`hs` only when the ring axis all-gathers)."""
        extra = {"hs": self.gather_stride} if self.all_gather else {}
        return extra | {
            "B": self.batch,
            "L": self.seq_len,
            "L_run": self.run_len,
            "k": self.ring_steps,
            "h": self.heads,
            "h_kv": self.kv_heads,
            "d_h": self.head_dim,
            "d": self.heads * self.head_dim,
            "d_kv": self.kv_heads * self.head_dim,
            "U": self.ulysses,
            "R": self.ring,
            "c": self.replication,
            "e": self.bytes_per_element,
        }


@dataclass(frozen=True, kw_only=True)
class MeshCandidate(CpProblem):
    """A problem to predict: the attention problem plus what a step runs (phase, kernel)."""

    layout: Layout = "zigzag"
    """Token layout (`LAYOUTS`); zigzag unless told (the causal-balanced default)."""
    phase: Phase = "fwd+bwd"
    """What a step is: the forward pass, or forward plus backward (training)."""
    kernel: str = "auto"
    """Local attention kernel: a `Backend` for a benchmark point; the cost model also takes
    the family names and aliases of `KERNEL_NAMES` and resolves them on a profile."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_phase(self.phase)
        if not isinstance(self.kernel, str) or self.kernel.strip().lower() not in KERNEL_NAMES:
            raise CpbenchError(f"kernel {self.kernel!r} is not one of {', '.join(KERNEL_NAMES)}")

    @classmethod
    def from_record(cls, config: Any) -> MeshCandidate:
        """From a results record's `config` dict, leniently (records of other tools and of
        every schema version): the four sizes are required, the rest default; the kernel is
        the one used when the record names one of `KERNEL_NAMES`, else the one requested,
        else auto."""
        missing = [k for k in ("seq_len", "heads", "kv_heads", "head_dim") if k not in config]
        if missing:
            raise CpbenchError(f"results config lacks {', '.join(missing)}")
        named = (config.get("kernel"), config.get("backend"))
        kernel = next((str(k) for k in named if str(k).strip().lower() in KERNEL_NAMES), "auto")
        documents = config.get("documents")
        optional = {
            name: config[name]
            for name in ("kv_replication", "window", "heads_k_stride")
            if config.get(name) is not None
        }
        return cls(
            **{k: int(config[k]) for k in ("seq_len", "heads", "kv_heads", "head_dim")},
            batch=int(config.get("batch", 1)),
            ulysses=int(config.get("ulysses", 1)),
            ring=int(config.get("ring", 1)),
            layout=str(config.get("layout", "contiguous")),  # type: ignore[arg-type]
            dtype=str(config.get("dtype", "float32")),  # type: ignore[arg-type]
            causal=bool(config.get("causal", True)),
            phase=str(config.get("phase", "fwd+bwd")),  # type: ignore[arg-type]
            kernel=kernel,
            documents=tuple(int(d) for d in documents) if documents else None,
            cp_comm=str(config.get("cp_comm") or DEFAULT_CP_COMM),  # type: ignore[arg-type]
            **optional,
        )
