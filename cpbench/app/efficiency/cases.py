"""What `cpbench efficiency` compares and reports: the cases (the single-process baseline and
every mesh each implementation can express), settings, timings, groups, the report.
The cases: docs/profile.md, "Efficiency runs"."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from cpbench.config.bench import BenchConfig, factorizations
from cpbench.config.vocabulary import Device, Dtype, Layout
from cpbench.errors import CpbenchError
from cpbench.impls import skip_reason

SINGLE = "single"
"""The impl name of the single-process baseline case."""
DEFAULT_IMPLS: tuple[str, ...] = (
    "cpbench",
    "torch_cp",
    "torch_cp:alltoall",
    "ring_flash_attn",
    "yunchang",
)
"""The implementations compared by default (TransformerEngine is added on a GPU)."""
GPU_IMPLS: tuple[str, ...] = ("transformer_engine",)
DEFAULT_LAYOUTS: tuple[Layout, ...] = ("zigzag", "contiguous")
CONVENTION = (
    "efficiency = t_single / (P x t_case): t_single = single-process fused SDPA causal "
    "fwd+bwd of the whole problem (rank 0 alone, the other ranks idle), t_case = step time, "
    "max over ranks; best = min over the interleaved rounds, median over them, spread = "
    "(max - min) / median; vs peer = cpbench median / fastest library median on the same mesh "
    "and layout (< 1: cpbench faster)"
)
CaseStatus = Literal["ok", "skipped", "failed"]
PROBLEM_FIELDS = ("seq_len", "heads", "kv_heads", "head_dim", "batch")
"""The `EfficiencySettings` fields that are the attention problem (`BenchConfig`'s names)."""


@dataclass(frozen=True)
class EfficiencySettings:
    """The problem and the measurement of one `cpbench efficiency` run."""

    # the attention problem (`PROBLEM_FIELDS`: `CpProblem`'s fields of these names)
    seq_len: int = 8192
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    batch: int = 1
    world_sizes: tuple[int, ...] = (2, 4)
    """P: the pool sizes measured, one pool each."""
    dtypes: tuple[Dtype, ...] = ("float32", "bfloat16")
    """Activation dtypes measured."""
    impls: tuple[str, ...] = DEFAULT_IMPLS
    """Implementations compared (cpbench's own schemes among them)."""
    layouts: tuple[Layout, ...] = DEFAULT_LAYOUTS
    """Ring layouts of the meshes with R > 1 (R = 1 is always contiguous)."""
    rounds: int = 5
    """Interleaved timed rounds: every case is timed once per round."""
    warmup: int = 1
    """Untimed steps per case before the rounds."""
    device: Device = "cpu"
    """Where the ranks run: cpu (gloo) or cuda (nccl)."""
    threads_per_rank: int = 1
    """CPU threads of each rank (and of the baseline, which runs on rank 0)."""
    timeout: float = 1800.0
    """Seconds one pool task (the preparation of one case, or all rounds) may take."""

    def __post_init__(self) -> None:
        for name in (*PROBLEM_FIELDS, "rounds"):
            if getattr(self, name) < 1:
                raise CpbenchError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise CpbenchError(f"warmup must be >= 0, got {self.warmup}")
        if any(p < 2 for p in self.world_sizes) or not self.world_sizes:
            raise CpbenchError(
                f"world sizes must be >= 2 (P = 1 is the baseline itself), got "
                f"{list(self.world_sizes)}"
            )


@dataclass(frozen=True)
class EfficiencyCase:
    """One measured configuration: an implementation on a U x R mesh with a layout."""

    impl: str
    """`single` (the baseline) or an implementation name (cpbench, torch_cp, ...)."""
    ulysses: int
    """U: Ulysses degree (1 for the baseline)."""
    ring: int
    """R: ring degree (1 for the baseline)."""
    layout: Layout
    """Ring layout (contiguous when R = 1)."""

    @property
    def mesh(self) -> str:
        return f"U{self.ulysses}xR{self.ring}"

    @property
    def label(self) -> str:
        if self.impl == SINGLE:
            return "single process"
        return f"{self.impl} {self.mesh} {self.layout}"

    def config(self, settings: EfficiencySettings, dtype: Dtype, world: int) -> BenchConfig:
        """The benchmark point of this case (not for the baseline)."""
        return BenchConfig(
            **{name: getattr(settings, name) for name in PROBLEM_FIELDS},
            dtype=dtype,
            causal=True,
            ulysses=self.ulysses,
            ring=self.ring,
            layout=self.layout,
            phase="fwd+bwd",
            device=settings.device,
            world_size=world,
            impl=self.impl,
        )


@dataclass(frozen=True)
class CaseTiming:
    """What one case measured (or why it did not run)."""

    case: EfficiencyCase
    status: CaseStatus
    """ok, skipped (the implementation cannot express it or is not installed), failed."""
    reason: str | None = None
    """Why it was skipped or failed; None when ok."""
    samples: tuple[float, ...] = ()
    """Seconds per round, in round order (max over ranks)."""
    best: float | None = None
    """Seconds: min over the rounds."""
    median: float | None = None
    """Seconds: median over the rounds."""
    spread: float | None = None
    """(max - min) / median of the rounds: the noise of this case (a fraction)."""
    efficiency_best: float | None = None
    """t_single(best) / (P x best): 1.0 is perfect scaling."""
    efficiency_median: float | None = None
    """t_single(median) / (P x median)."""
    vs_peer: float | None = None
    """cpbench cases: median / the fastest library's median on the same mesh and layout
    (< 1: cpbench faster); None for libraries and where no library runs the mesh."""
    peer: str | None = None
    """The fastest library on the same mesh and layout (cpbench cases)."""


@dataclass(frozen=True)
class EfficiencyGroup:
    """One world size and dtype: the baseline and every case, measured in one interleaved run."""

    world_size: int
    dtype: Dtype
    baseline: CaseTiming
    cases: tuple[CaseTiming, ...]
    """Every case, ok, skipped or failed."""
    load_average: tuple[float, float] = (0.0, 0.0)
    """The 1-minute load average of the machine before and after the group (shared-machine
    noise indicator; 0 where the OS does not report it)."""
    seconds: float = 0.0
    """Wall-clock seconds the group took."""


@dataclass(frozen=True)
class EfficiencyReport:
    """Every group of one run, with what the numbers mean."""

    settings: EfficiencySettings
    groups: tuple[EfficiencyGroup, ...]
    convention: str = CONVENTION
    """How efficiency, best, median, spread and vs peer are defined."""
    host: str = field(default_factory=lambda: platform.processor() or platform.machine())
    """The machine (CPU model or architecture)."""
    torch_version: str = torch.__version__

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cases_of(settings: EfficiencySettings, world: int) -> list[EfficiencyCase]:
    """Every (impl, mesh, layout) to try at world size `world`: each factorization U x R of
    `world`, the settings' layouts where R > 1 and contiguous where R = 1."""
    cases = []
    for impl in settings.impls:
        for u, r in factorizations(world):
            if r == 1 and u == 1:
                continue
            layouts: tuple[Layout, ...] = settings.layouts if r > 1 else ("contiguous",)
            for layout in layouts:
                cases.append(EfficiencyCase(impl, u, r, layout))
    return cases


def case_reason(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype, world: int
                 ) -> str | None:
    """Why a case cannot run (the mesh's feasibility, then the implementation's rules)."""
    try:
        config = case.config(settings, dtype, world)
    except CpbenchError as exc:
        return str(exc)
    feasible = config.feasibility
    if not feasible.ok:
        return feasible.reason or "infeasible mesh"
    return skip_reason(config)

