"""`BenchConfig`: one benchmark point, a `MeshCandidate` plus where it runs. Pure Python."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from functools import cached_property

from cpbench.config.constraints import Feasibility, check_positive_int, is_int, seq_divisor
from cpbench.config.impls import DEFAULT_IMPL, IMPLS
from cpbench.config.inference import InferenceStep, step_rule
from cpbench.config.problem import MeshCandidate, check_choice
from cpbench.config.vocabulary import (
    BACKENDS,
    DEFAULT_CP_COMM,
    DEVICES,
    Backend,
    Device,
    Dtype,
    Layout,
)
from cpbench.errors import CpbenchError

__all__ = ["BenchConfig", "VerifyCase", "factorizations", "is_int"]


def factorizations(world_size: int) -> list[tuple[int, int]]:
    """Every U x R mesh of `world_size` ranks as (U, R), pure ring (U = 1) first: the meshes a
    scenario's `mesh = "all"`, `cpbench verify` and `cpbench recommend` consider."""
    return [(u, world_size // u) for u in range(1, world_size + 1) if world_size % u == 0]


# --------------------------------------------------------------------------------------------
# One benchmark point
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BenchConfig(MeshCandidate):
    """One benchmark point: the attention problem and its step (`MeshCandidate`: shape, mask,
    mesh, layout, exchange, dtype, KV replication, phase, kernel) plus where it runs."""

    kernel: Backend = "auto"
    """Local attention kernel requested (`Backend`; auto picks the best available)."""
    device: Device
    """Where the ranks run: cpu (gloo) or cuda (nccl)."""
    world_size: int
    """Number of ranks (U x R for a feasible point)."""
    nodes: int = 1
    """Hosts the ranks span (torchrun --nnodes)."""
    impl: str = DEFAULT_IMPL
    """Which implementation runs the attention: cpbench's own or an external library
    (`cpbench.config.impls.IMPLS`)."""
    inference: InferenceStep | None = None
    """The inference step the point times (prefill or decode, forward only; its seq_len is
    cached_len + new_tokens and its phase fwd); None = a training step (`phase`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("world_size", "nodes"):
            check_positive_int(name, getattr(self, name))
        for name, allowed in (("kernel", BACKENDS), ("device", DEVICES), ("impl", IMPLS)):
            check_choice(name, getattr(self, name), allowed)
        if self.inference is not None and not isinstance(self.inference, InferenceStep):
            raise CpbenchError(f"inference must be an InferenceStep, got {self.inference!r}")

    @cached_property
    def feasibility(self) -> Feasibility:
        """A training point: the mesh and shape rules (`CpProblem.feasibility`). An inference
        point: the rules of its step (`config.inference.step_rule`: the mesh its scheme runs on,
        Ulysses' head split), forward only over one causal sequence, contiguous shards, by
        cpbench's own implementation; its KV replication is Ulysses' (KV heads copied up to
        W when fewer), else 1."""
        step = self.inference
        if step is None:
            return super().feasibility
        rule = _inference_rule(self, step) or step_rule(self, step)
        if rule is not None:
            return Feasibility(False, f"{step.phase}: {rule}")
        copies = 1
        if step.scheme == "ulysses" and self.kv_heads < self.world:
            copies = self.world // self.kv_heads
        return Feasibility(True, None, copies)

    def ranks(self) -> int:
        """The world size: U x R must fill it."""
        return self.world_size

    @property
    def key(self) -> str:
        """Stable id of the point (the record's "id", used by --resume); differs whenever any
        field differs. kv_replication appears as requested ("repauto" for automatic); the impl
        is appended unless it is cpbench's own, `-ag` (and `-hs<stride>`) only when the ring
        axis all-gathers, the inference step (`InferenceStep.short_key`) only for one (ids of
        earlier results stay valid)."""
        rep = "auto" if self.kv_replication is None else str(self.kv_replication)
        key = (
            f"L{self.seq_len}-B{self.batch}-h{self.heads}-kv{self.kv_heads}-d{self.head_dim}"
            f"-{self.dtype}-{'causal' if self.causal else 'full'}"
            f"-U{self.ulysses}xR{self.ring}-{self.layout}-rep{rep}-{self.kernel}-{self.phase}"
            f"-{self.device}-w{self.world_size}"
        )
        key = key if self.nodes == 1 else f"{key}-n{self.nodes}"
        key = key if self.inference is None else f"{key}-{self.inference.short_key()}"
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
        """The record's "config" dict (see cpbench.results.schema), with the resolved KV
        replication (None keeps the requested value) and the kernel actually used (None when
        not run); the requested kernel is the record's `backend`."""
        skip = ("kernel", "inference")
        step = {} if self.inference is None else {"inference": self.inference.to_dict()}
        return {  # a training point's dict has no "inference" key (as before inference)
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip},
            **step,
            "kv_replication": self.kv_replication if kv_replication is None else kv_replication,
            "documents": None if self.documents is None else list(self.documents),
            "backend": self.kernel,
            "kernel": kernel,
            "scheme": self.scheme,
            "mask": self.mask.kind,
        }

    @classmethod
    def from_dict(cls, d: dict) -> BenchConfig:
        """Rebuild a point from a record's "config" dict (strictly: every field without a
        default is required); extra keys (scheme, mask, kernel used) are ignored. Its
        kv_replication is the recorded (resolved) value."""
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name != "kernel"}
        if "backend" in d:
            values["kernel"] = d["backend"]
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [n for n in required if n not in values]
        if missing:
            raise CpbenchError(f"config record lacks {', '.join(missing)}")
        if values.get("documents") is not None:
            values["documents"] = tuple(values["documents"])
        if values.get("inference") is not None:
            values["inference"] = InferenceStep.from_dict(values["inference"])
        return cls(**values)


def _inference_rule(config: BenchConfig, step: InferenceStep) -> str | None:
    """What an inference point breaks of the rules its kernels keep, or None."""
    if config.phase != "fwd":
        return f"an inference step is forward only (phase fwd), got phase {config.phase}"
    if config.seq_len != step.total:
        return (
            f"seq_len ({config.seq_len}) must be cached_len + new_tokens = {step.cached_len} + "
            f"{step.new_tokens} = {step.total}"
        )
    if not config.mask.causal or not config.mask.plain:
        return f"runs causal attention over one sequence, not mask {config.mask.kind}"
    if config.layout != "contiguous" or config.cp_comm != DEFAULT_CP_COMM:
        return (
            f"shards contiguously by its own scheme (layout contiguous, cp_comm p2p), got layout "
            f"{config.layout}, cp_comm {config.cp_comm}"
        )
    if config.kv_replication is not None or config.impl != DEFAULT_IMPL:
        return "runs on cpbench's own implementation, with automatic KV replication"
    if config.world_size != config.world:
        return f"U x R = {config.world} must fill world_size ({config.world_size})"
    return None


@dataclass(frozen=True, kw_only=True)
class VerifyCase(MeshCandidate):
    """One correctness case of `cpbench verify` (and of the check before every benchmarked
    point): a problem on small tensors drawn from `seed`, run forward and backward."""

    head_dim: int = 16
    """d_h: small heads keep the cases fast."""
    batch: int = 2
    """B: two sequences, so that batch indexing is checked."""
    dtype: Dtype = "float32"
    """float32 unless told: the reference's tolerance is tightest there."""
    layout: Layout = "contiguous"
    kernel: Backend = "auto"
    seed: int = 0
    """Seed of the random Q, K, V and output gradient."""
    impl: str = DEFAULT_IMPL
    """The implementation under test (`IMPLS`)."""

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
            **self.problem_fields(),
            kernel=self.kernel,
            phase="fwd+bwd",
            device=device,
            world_size=self.world,
            impl=self.impl,
        )
