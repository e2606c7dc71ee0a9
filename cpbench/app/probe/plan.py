"""What a probe measures: its settings (`ProbeSettings`) and the tests they make (`make_plan`).

The collectives, message sizes and kernel tests: docs/probe.md, "What is measured"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate, check_choice, check_phase, check_positive_int
from cpbench.config.vocabulary import (
    BACKENDS,
    DTYPE_BYTES,
    DTYPES,
    PHASE_PASSES,
    Backend,
    Device,
    Dtype,
    Layout,
    Phase,
)
from cpbench.errors import CpbenchError
from cpbench.model.flops import attention_flops
from cpbench.model.formulas import CollectiveKind, comm_volume
from cpbench.model.hardware.profile import HardwareProfile

SMALL_SIZES: tuple[int, ...] = (4096, 65536)
"""Message sizes (bytes, nccl-tests `size`) measured besides the configurations' own, for the
latency: the intercept of the least-squares line is set by them."""
DEFAULT_BUDGET_S = 25.0
"""Seconds of measurement `--budget` asks for by default (rank start-up excluded)."""
CPU_DEFAULTS: dict[str, Any] = {
    "heads": 8, "kv_heads": 8, "head_dim": 64, "seq_lens": (4096, 8192), "dtype": "float32",
}  # fmt: skip
"""Shape of a probe on CPU when none is given: what a CPU sweep runs."""
GPU_DEFAULTS: dict[str, Any] = {
    "heads": 32, "kv_heads": 8, "head_dim": 128, "seq_lens": (32768, 131072), "dtype": "bfloat16",
}  # fmt: skip
"""Shape of a probe on GPU when none is given: a Llama-3-8B-class layer at 32K-128K."""


@dataclass(frozen=True)
class ProbeSettings:
    """What to probe."""

    world_size: int
    """Ranks (one per GPU, or local CPU processes)."""
    device: Device
    """cpu (gloo) or cuda (NCCL)."""
    heads: int
    """Query heads h of the shape whose message sizes are measured."""
    kv_heads: int
    head_dim: int
    seq_lens: tuple[int, ...]
    """Global sequence lengths L whose messages and kernel lengths L/R are measured."""
    dtype: Dtype = "float32"
    """Activation dtype of the messages and the kernel."""
    batch: int = 1
    phase: Phase = "fwd+bwd"
    """fwd or fwd+bwd: which messages (backward adds dK/dV hops) and kernel passes."""
    kernel: Backend = "auto"
    """Local attention kernel to time (auto: what cpbench runs on the device)."""
    layout: Layout = "zigzag"
    """Ring layout (sets which sequence lengths a mesh accepts)."""
    prior: str | None = None
    """Profile to start from (name or path); None: cpu-local on CPU, the GPU's built-in."""
    budget_s: float = DEFAULT_BUDGET_S
    """Seconds of measurement (rank start-up excluded)."""
    name: str | None = None
    """Name of the written profile; None: <prior>-probe."""
    threads_per_rank: int = 1
    timeout_s: float = 600.0


def default_settings(device: Device, world_size: int, **given: Any) -> ProbeSettings:
    """Settings with the device's default shape (`CPU_DEFAULTS`, `GPU_DEFAULTS`) where a value
    is None or absent."""
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    values = defaults | {k: v for k, v in given.items() if v is not None}
    values["seq_lens"] = tuple(int(n) for n in values["seq_lens"])
    return ProbeSettings(world_size=world_size, device=device, **values)


@dataclass(frozen=True)
class CommTest:
    """One collective at one size on one group shape."""

    kind: CollectiveKind
    """all_to_all (a Ulysses group) or send_recv (ring neighbours)."""
    ulysses: int
    """U of the mesh whose groups run it."""
    ring: int
    """R of the mesh."""
    size_bytes: int
    """nccl-tests `size`: bytes a rank hands in (all-to-all, its own part included) or sends."""
    origin: str
    """Which configurations send it, e.g. 'a2a_kv L=8192', or 'small (latency)'."""

    @property
    def group_size(self) -> int:
        """Ranks in the group: U for all-to-all, R for the ring."""
        return self.ulysses if self.kind == "all_to_all" else self.ring

    @property
    def bytes_sent(self) -> float:
        """Bytes a rank puts on the wire per call: size x (n-1)/n for all-to-all, size for
        send/recv (formulas.py's counting, what a profile's busbw divides)."""
        n = self.group_size
        return self.size_bytes * (n - 1) / n if self.kind == "all_to_all" else self.size_bytes

    @property
    def mesh(self) -> str:
        """'UxR'."""
        return f"{self.ulysses}x{self.ring}"


@dataclass(frozen=True)
class KernelTest:
    """One local kernel shape: the ring diagonal block of a mesh (causal over L/R tokens)."""

    seq_len: int
    """Kernel sequence length n = L/R."""
    heads: int
    """Query heads per rank h/U."""
    kv_heads: int
    """KV heads per rank c*h_kv/U."""
    head_dim: int
    batch: int
    meshes: tuple[str, ...]
    """Meshes (UxR at L) that run this shape."""

    def flops(self, phase: Phase) -> float:
        """FLOPs of one causal call in the phase (`cpbench.model.flops` convention)."""
        shape = AttentionShape(self.seq_len, self.heads, self.kv_heads, self.head_dim, self.batch)
        return attention_flops(shape, True, PHASE_PASSES[phase])


@dataclass(frozen=True)
class ProbePlan:
    """What the ranks will measure."""

    settings: ProbeSettings
    meshes: tuple[tuple[int, int], ...]
    """(U, R) of the meshes that accept at least one sequence length."""
    skipped: tuple[str, ...]
    """(mesh, L) pairs left out, with the rule that excludes them."""
    comm_tests: tuple[CommTest, ...]
    kernel_tests: tuple[KernelTest, ...]
    kernel_ranks: int
    """Ranks that run the kernel at once (the prior's compute slots, at most the world)."""


def _feasible(settings: ProbeSettings, u: int, r: int, seq_len: int) -> tuple[Any, str]:
    """(the candidate or None, why not) of one mesh at one length."""
    try:
        candidate = MeshCandidate(
            seq_len=seq_len, batch=settings.batch, heads=settings.heads,
            kv_heads=settings.kv_heads, head_dim=settings.head_dim, ulysses=u, ring=r,
            layout=settings.layout, dtype=settings.dtype, phase=settings.phase,
        )
        return candidate.require_feasible(), ""
    except CpbenchError as exc:
        return None, str(exc)


def _rounded(size: int, u: int, element: int) -> int:
    """`size` bytes rounded up to whole elements that split evenly over u ranks."""
    unit = element * u
    return max(unit, math.ceil(size / unit) * unit)


def make_plan(settings: ProbeSettings, prior: HardwareProfile) -> ProbePlan:
    """The tests of a probe; CpbenchError on bad settings or when no mesh accepts the shape."""
    check_settings(settings)
    if settings.world_size > prior.devices_per_node:
        raise CpbenchError(
            f"world size ({settings.world_size}) > devices per node of the prior {prior.name} "
            f"({prior.devices_per_node}): cpbench probe measures one node"
        )
    from cpbench.config.bench import factorizations  # noqa: PLC0415

    element = DTYPE_BYTES[settings.dtype]
    passes = ("forward",) if settings.phase == "fwd" else ("forward", "backward")
    meshes: list[tuple[int, int]] = []
    skipped: list[str] = []
    comm: dict[tuple[str, int, int, int], list[str]] = {}
    kernels: dict[tuple[int, int, int], list[str]] = {}
    for u, r in factorizations(settings.world_size):
        ok = False
        for seq_len in settings.seq_lens:
            config, why = _feasible(settings, u, r, seq_len)
            if config is None:
                skipped.append(f"{u}x{r} at L={seq_len}: {why}")
                continue
            ok = True
            volume = comm_volume(config)
            for phase in passes:
                for c in volume.collectives(phase):  # type: ignore[arg-type]
                    key = (c.kind, u, r, c.bytes_per_call)
                    comm.setdefault(key, []).append(f"{c.name} L={seq_len}")
            kernel_key = (config.ring_shard, config.heads_per_rank, config.kv_heads_per_rank)
            kernels.setdefault(kernel_key, []).append(f"{u}x{r} L={seq_len}")
        if ok:
            meshes.append((u, r))
            shapes = [("all_to_all", u)] if u > 1 else []
            shapes += [("send_recv", r)] if r > 1 else []
            for kind, n in shapes:
                for small in SMALL_SIZES:
                    size = _rounded(small, n if kind == "all_to_all" else 1, element)
                    comm.setdefault((kind, u, r, size), []).append("small (latency)")
    if not meshes:
        raise CpbenchError(
            f"no U x R mesh of world size {settings.world_size} accepts the shape at any of "
            f"L = {', '.join(map(str, settings.seq_lens))}: " + "; ".join(skipped)
        )
    tests = tuple(
        CommTest(kind, u, r, size, ", ".join(dict.fromkeys(origins)))  # type: ignore[arg-type]
        for (kind, u, r, size), origins in sorted(comm.items())
    )
    kernel_tests = tuple(
        KernelTest(n, h, hk, settings.head_dim, settings.batch, tuple(names))
        for (n, h, hk), names in sorted(kernels.items())
    )
    slots = prior.compute_slots_per_node
    ranks = settings.world_size if slots is None else max(1, min(slots, settings.world_size))
    return ProbePlan(settings, tuple(meshes), tuple(skipped), tests, kernel_tests, ranks)


def check_settings(settings: ProbeSettings) -> None:
    """CpbenchError naming the value and the rule on bad settings."""
    s = settings
    if isinstance(s.world_size, bool) or s.world_size < 2:
        raise CpbenchError(
            f"world size must be at least 2 (a probe times collectives between ranks), got "
            f"{s.world_size}"
        )
    for name in ("heads", "kv_heads", "head_dim", "batch", "threads_per_rank"):
        check_positive_int(name.replace("_", " "), getattr(s, name))
    if s.heads % s.kv_heads:
        raise CpbenchError(
            f"heads ({s.heads}) must be a multiple of kv heads ({s.kv_heads}): "
            f"{s.heads} % {s.kv_heads} = {s.heads % s.kv_heads}"
        )
    if not s.seq_lens or any(n < 1 for n in s.seq_lens):
        raise CpbenchError(f"sequence lengths must be positive integers, got {list(s.seq_lens)}")
    if not (s.budget_s > 0 and math.isfinite(s.budget_s)):
        raise CpbenchError(f"budget must be a positive number of seconds, got {s.budget_s}")
    check_choice("dtype", s.dtype, DTYPES)
    check_phase(s.phase)
    check_choice("kernel", s.kernel, BACKENDS)
