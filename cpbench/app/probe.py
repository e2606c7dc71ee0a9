"""`cpbench probe`: measure this machine's links and local attention kernel, and write a
hardware profile from them, in under a minute.

What is measured (every rank of a persistent `WorkerPool`, gloo on CPU, NCCL on GPU):

- **all-to-all** over the Ulysses groups of every U x R mesh of the world size (U > 1), all
  groups at once, with the groups `cpbench/attention/mesh.py` builds (runs of U consecutive
  ranks), through `cpbench.attention.comm.all_to_all` (the schemes' own call);
- **send/recv** between ring neighbours of every mesh with R > 1 (`comm.ring_exchange`: each
  rank sends to its next and receives from its previous, every ring at once);
- at the message sizes those configurations send (`cpbench.model.formulas`: the per-call
  `size` of `a2a_q`, `a2a_kv`, ... and of one ring hop of K/V and of the fp32 dK/dV, for the
  given shape and sequence lengths), plus `SMALL_SIZES` for the latency;
- as nccl-tests does: time per call = median over repetitions of the max over ranks (each
  repetition starts at a barrier: `cpbench.bench.timing.time_iterations`), algbw = size / time,
  busbw = algbw x `formulas.busbw_factor` ((n-1)/n for all-to-all, 1 for send/recv);
- the **local attention kernel** (causal, the phase asked for) at each mesh's kernel length
  L/R with its heads per rank, on as many ranks at once as the prior has compute slots (CPU
  cores; every rank on GPU): efficiency = attention FLOPs (`cpbench.model.flops` convention:
  4*B*h*n^2*d_h/2 forward causal, backward 2.5x) / (peak x time).

The fit reuses calibration's least squares (`cpbench.model.calibrate.solve_relative`, scipy
`lsq_linear`): per link tier and collective kind, time = latency + bytes / busbw over all the
measured sizes, relative residuals, so the small messages pin the latency (the intercept) and
the large ones the bandwidth. A measurement is attributed to the highest topology tier its
collective crosses (`cpbench.model.topology`, ulysses_low placement: what cpbench runs); on a
flat prior that is the one island of the node. The written profile is the prior (cpu-local on
CPU, the built-in matching the GPU on CUDA) with the measured link latency/busbw (intra_node,
and a one-island `[topology]` when the prior has none, or the measured tiers of its topology)
and the measured kernel curve replaced; each replaced number's source says "measured by
cpbench probe <date>, <machine>".

Services return data; `cpbench.render.probe` prints it.
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import (
    BACKENDS,
    DTYPE_BYTES,
    DTYPES,
    PHASE_PASSES,
    PHASES,
    Backend,
    Device,
    Dtype,
    Layout,
    Phase,
)
from cpbench.errors import CpbenchError
from cpbench.model.calibrate import solve_relative
from cpbench.model.calibrate.stats import rms
from cpbench.model.flops import FLOPS_CONVENTION, attention_flops
from cpbench.model.formulas import CollectiveKind, bandwidths, comm_volume
from cpbench.model.hardware.loading import choose_profile, load_profile
from cpbench.model.hardware.profile import (
    EfficiencyCurve,
    HardwareProfile,
    LinkCost,
    NodeTopology,
    TierKind,
)
from cpbench.model.hardware.transforms import with_cost, with_curve, with_link_cost, with_topology
from cpbench.model.hardware.writer import profile_to_toml, save_profile
from cpbench.model.topology import all_to_all_time, place, ring_hop_time
from cpbench.units import GB, format_bytes

SMALL_SIZES: tuple[int, ...] = (4096, 65536)
"""Message sizes (bytes, nccl-tests `size`) measured besides the configurations' own, for the
latency: the intercept of the least-squares line is set by them."""
COMM_SHARE = 0.3
"""Share of `--budget` for the link measurements (the rest: the kernel)."""
MIN_ITERS = 5
"""Timed repetitions of one collective at least (the median of 5)."""
MAX_ITERS = 30
"""Timed repetitions of one collective at most."""
MIN_REPS = 1
"""Timed kernel calls of one shape at least (after one warm-up call)."""
MAX_REPS = 5
"""Timed kernel calls of one shape at most."""
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


# --------------------------------------------------------------------------------- settings


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
    """KV heads h_kv."""
    head_dim: int
    """Head dimension d_h."""
    seq_lens: tuple[int, ...]
    """Global sequence lengths L whose messages and kernel lengths L/R are measured."""
    dtype: Dtype = "float32"
    """Activation dtype of the messages and the kernel."""
    batch: int = 1
    """Micro-batch B."""
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
    """CPU threads per rank."""
    timeout_s: float = 600.0
    """Seconds the pool task may take."""


def default_settings(device: Device, world_size: int, **given: Any) -> ProbeSettings:
    """Settings with the device's default shape (`CPU_DEFAULTS`, `GPU_DEFAULTS`) where a value
    is None or absent."""
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    values = {k: v for k, v in given.items() if v is not None}
    for key, value in defaults.items():
        values.setdefault(key, value)
    values["seq_lens"] = tuple(int(n) for n in values["seq_lens"])
    return ProbeSettings(world_size=world_size, device=device, **values)


# ------------------------------------------------------------------------------------ plan


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
    """d_h."""
    batch: int
    """B."""
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
    """The settings it was made from."""
    meshes: tuple[tuple[int, int], ...]
    """(U, R) of the meshes that accept at least one sequence length."""
    skipped: tuple[str, ...]
    """(mesh, L) pairs left out, with the rule that excludes them."""
    comm_tests: tuple[CommTest, ...]
    """Collectives to time."""
    kernel_tests: tuple[KernelTest, ...]
    """Kernel shapes to time."""
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
    for label, value in (
        ("heads", s.heads),
        ("kv heads", s.kv_heads),
        ("head dim", s.head_dim),
        ("batch", s.batch),
        ("threads per rank", s.threads_per_rank),
    ):
        if value < 1:
            raise CpbenchError(f"{label} must be a positive integer, got {value}")
    if s.heads % s.kv_heads:
        raise CpbenchError(
            f"heads ({s.heads}) must be a multiple of kv heads ({s.kv_heads}): "
            f"{s.heads} % {s.kv_heads} = {s.heads % s.kv_heads}"
        )
    if not s.seq_lens or any(n < 1 for n in s.seq_lens):
        raise CpbenchError(f"sequence lengths must be positive integers, got {list(s.seq_lens)}")
    if not (s.budget_s > 0 and math.isfinite(s.budget_s)):
        raise CpbenchError(f"budget must be a positive number of seconds, got {s.budget_s}")
    if s.dtype not in DTYPES:
        raise CpbenchError(f"dtype {s.dtype!r} is not one of {', '.join(DTYPES)}")
    if s.phase not in PHASES:
        raise CpbenchError(f"phase {s.phase!r} is not one of {', '.join(PHASES)}")
    if s.kernel not in BACKENDS:
        raise CpbenchError(f"kernel {s.kernel!r} is not one of {', '.join(BACKENDS)}")


# ------------------------------------------------------------------------------- the ranks


@dataclass(frozen=True)
class RankResult:
    """What one rank returns: the max-over-ranks samples (the same on every rank) and its
    environment."""

    comm: tuple[tuple[float, ...], ...]
    """Per comm test, the seconds of each timed repetition (max over ranks)."""
    kernel: tuple[tuple[float, ...], ...]
    """Per kernel test, the seconds of each timed call (max over the computing ranks); empty
    on ranks that do not compute."""
    hostname: str
    """The rank's host."""
    device_name: str
    """Its device ('cpu: <model>' or the GPU's name)."""


def _budgeted(estimate: float, budget: float, low: int, high: int) -> int:
    if estimate <= 0:
        return high
    return int(min(high, max(low, budget // estimate)))


def probe_on_rank(plan: ProbePlan, comm_budget_s: float, kernel_budget_s: float) -> RankResult:
    """Every rank: time the plan's collectives, then (the first `kernel_ranks` ranks) its
    kernel shapes. Collective over the default group: every rank runs the same tests in the
    same order, and the repetition counts come from max-over-ranks times (the same on every
    rank), so the collectives stay matched."""
    import torch  # noqa: PLC0415 - runs in the ranks
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.attention.comm import all_to_all, ring_exchange  # noqa: PLC0415
    from cpbench.attention.kernels import default_scale, select_kernel  # noqa: PLC0415
    from cpbench.attention.mesh import build_mesh  # noqa: PLC0415
    from cpbench.bench.environment import rank_environment  # noqa: PLC0415
    from cpbench.bench.timing import time_iterations  # noqa: PLC0415

    settings = plan.settings
    cuda = settings.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = getattr(torch, settings.dtype)
    element = DTYPE_BYTES[settings.dtype]
    comm_samples: list[tuple[float, ...]] = []
    remaining = comm_budget_s
    for index, test in enumerate(plan.comm_tests):
        mesh = build_mesh(test.ulysses, test.ring)
        elements = test.size_bytes // element
        if test.kind == "all_to_all":
            x = torch.ones(test.ulysses, elements // test.ulysses, dtype=dtype, device=device)

            def step(x: Any = x, mesh: Any = mesh) -> object:
                return all_to_all(x, mesh.ulysses_group, mesh.ulysses, "probe")

        else:
            x = torch.ones(elements, dtype=dtype, device=device)

            def step(x: Any = x, mesh: Any = mesh) -> object:
                return ring_exchange(
                    x, mesh.ring_next, mesh.ring_prev, mesh.ring_group, "probe"
                ).wait()

        first = time_iterations(step, 1, 1, device)[0]
        share = remaining / (len(plan.comm_tests) - index)
        iters = _budgeted(first, share, MIN_ITERS, MAX_ITERS)
        samples = time_iterations(step, 0, iters, device)
        remaining -= first + sum(samples)
        comm_samples.append(tuple(samples))
    rank = dist.get_rank()
    ranks = plan.kernel_ranks
    group = None if ranks >= settings.world_size else dist.new_group(list(range(ranks)))
    kernel_samples: list[tuple[float, ...]] = []
    if rank < ranks:
        kernel = select_kernel(device, dtype, settings.kernel)
        generator = torch.Generator(device="cpu").manual_seed(rank)
        remaining = kernel_budget_s
        backward = settings.phase == "fwd+bwd"
        for index, shape in enumerate(plan.kernel_tests):
            scale = default_scale(shape.head_dim)

            def tensor(heads: int, shape: KernelTest = shape) -> Any:
                size = (shape.batch, shape.seq_len, heads, shape.head_dim)
                t = torch.randn(size, generator=generator, dtype=torch.float32)
                return t.to(device=device, dtype=dtype)

            q, dout = tensor(shape.heads), tensor(shape.heads)
            k, v = tensor(shape.kv_heads), tensor(shape.kv_heads)

            def call(
                q: Any = q, k: Any = k, v: Any = v, dout: Any = dout, scale: float = scale
            ) -> object:
                out, lse = kernel.forward(q, k, v, True, scale)
                if backward:
                    return kernel.backward(dout, q, k, v, out, lse, True, scale)
                return out

            first = time_iterations(call, 0, 1, device, group=group)[0]
            share = remaining / (len(plan.kernel_tests) - index)
            reps = _budgeted(first, share - first, MIN_REPS, MAX_REPS)
            samples = time_iterations(call, 0, reps, device, group=group)
            remaining -= first + sum(samples)
            kernel_samples.append(tuple(samples))
            del q, k, v, dout
    dist.barrier()
    env = rank_environment(settings.device)
    return RankResult(
        tuple(comm_samples), tuple(kernel_samples), str(env["hostname"]), str(env["device"])
    )


# -------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CommMeasurement:
    """One timed collective, in nccl-tests terms."""

    test: CommTest
    """What was timed."""
    seconds: float
    """Time per call: median over repetitions of the max over ranks."""
    repetitions: int
    """Timed repetitions."""
    algbw: float
    """size / time, bytes/s."""
    busbw: float
    """algbw x busbw_factor ((n-1)/n all-to-all, 1 send/recv), bytes/s."""
    tier: str
    """The topology tier it is attributed to (the highest its collective crosses)."""


@dataclass(frozen=True)
class LinkFit:
    """The least-squares line of one tier and collective kind."""

    tier: str
    """Topology tier kind (the node's one island on a flat profile)."""
    level: int
    """Index of the tier in the profile's node tiers (innermost 0)."""
    kind: CollectiveKind
    """all_to_all or send_recv."""
    latency_s: float
    """Fitted latency (intercept), seconds."""
    busbw: float
    """Fitted busbw (1 / slope), bytes/s."""
    prior_latency_s: float
    """The prior's latency."""
    prior_busbw: float
    """The prior's busbw."""
    points: int
    """Measurements on the line."""
    residual: float
    """RMS relative error of the line on its points."""
    sizes: tuple[int, int]
    """Smallest and largest size fitted (bytes)."""


@dataclass(frozen=True)
class KernelMeasurement:
    """One timed kernel shape."""

    test: KernelTest
    """What was timed."""
    seconds: float
    """Median time of one call (max over the computing ranks)."""
    repetitions: int
    """Timed calls."""
    flops: float
    """FLOPs of one call (`cpbench.model.flops` convention, causal)."""
    efficiency: float
    """flops / (peak x seconds), against the prior's peak of the dtype."""

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s (1e12 FLOP/s)."""
        return self.flops / self.seconds / 1e12


@dataclass(frozen=True)
class ProbeResult:
    """Everything `cpbench probe` measured and the profile it made."""

    plan: ProbePlan
    """The tests."""
    prior: HardwareProfile
    """The profile started from."""
    prior_reason: str
    """Why that prior."""
    profile: HardwareProfile
    """The prior with the measured numbers."""
    comm: tuple[CommMeasurement, ...]
    """Timed collectives."""
    fits: tuple[LinkFit, ...]
    """Link lines."""
    kernels: tuple[KernelMeasurement, ...]
    """Timed kernel shapes."""
    kernel_family: str
    """The efficiency family the curve was written to."""
    machine: str
    """'<host>, <world> x <device>'."""
    date: str
    """When (UTC)."""
    wall_s: float
    """Seconds of the whole probe (rank start-up included)."""
    measure_s: float
    """Seconds of the measurement task alone."""
    output: str | None = None
    """Where the profile was written, if anywhere."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What was clipped or left out."""


def _attribution(prior: HardwareProfile, test: CommTest) -> tuple[int, str, float]:
    """(tier index, tier kind, effective bytes): the highest tier the collective crosses in
    the ulysses_low placement and the bytes per device across it, so that the time on it is
    latency + effective bytes / busbw (`cpbench.model.topology`)."""
    placement = place(test.ulysses, test.ring, prior, prior.devices_per_node)
    if test.kind == "all_to_all":
        t = all_to_all_time(placement, test.bytes_sent)
    else:
        t = ring_hop_time(placement, test.bytes_sent)
    top = len(t.levels) - 1
    level = placement.tiers[top]
    return top, _tier_kind(prior, top), t.levels[top].seconds * level.cost(test.kind).busbw


def _tier_kind(prior: HardwareProfile, level: int) -> TierKind:
    """The kind of a node tier as the written profile names it: a flat CPU node's one
    island is a NUMA node (the local ranks share one memory)."""
    if prior.topology is None and prior.device_kind == "cpu":
        return "numa_node"
    return prior.node_tiers()[level].kind


def fit_links(
    prior: HardwareProfile, measurements: Sequence[tuple[CommTest, float]]
) -> tuple[LinkFit, ...]:
    """One line per (tier, kind): time = latency + bytes / busbw, least squares on relative
    residuals (`solve_relative`, the calibration's solver), unknowns scaled by the prior."""
    groups: dict[tuple[int, str, CollectiveKind], list[tuple[CommTest, float, float]]] = {}
    for test, seconds in measurements:
        level, kind_name, effective = _attribution(prior, test)
        groups.setdefault((level, kind_name, test.kind), []).append((test, effective, seconds))
    fits = []
    tiers = prior.node_tiers()
    for (level, tier_kind, kind), rows in sorted(groups.items()):
        old = tiers[level].cost(kind)
        design = np.array([[1.0, effective] for _, effective, _ in rows])
        target = np.array([seconds for *_, seconds in rows])
        prior_x = np.array([max(old.latency_s, 1e-7), 1.0 / old.busbw])
        latency, inverse = solve_relative(design, target, prior_x)
        residual = rms(
            [(float(design[i] @ [latency, inverse]) - t) / t for i, t in enumerate(target)]
        )
        sizes = [t.size_bytes for t, _, _ in rows]
        fits.append(
            LinkFit(
                tier_kind,
                level,
                kind,
                float(latency),
                float(1.0 / inverse),
                old.latency_s,
                old.busbw,
                len(rows),
                residual,
                (min(sizes), max(sizes)),
            )
        )
    return tuple(fits)


def measured_profile(
    prior: HardwareProfile,
    fits: Sequence[LinkFit],
    kernels: Sequence[KernelMeasurement],
    family: str,
    dtype: str,
    phase: Phase,
    stamp: str,
    name: str | None = None,
) -> tuple[HardwareProfile, list[str]]:
    """The prior with the fitted links and the measured kernel curve (efficiency against the
    prior's peak of `dtype`, written to `family`); `stamp` is '<date>, <machine>' for the
    sources. Notes say what was clipped."""
    notes: list[str] = []
    profile = prior
    tiers = list(prior.node_tiers())
    for fit in fits:
        cost = LinkCost(
            fit.latency_s,
            fit.busbw,
            f"measured by cpbench probe {stamp}: {fit.kind} over {fit.points} sizes "
            f"{format_bytes(fit.sizes[0], '.3g')} - {format_bytes(fit.sizes[1], '.3g')}, median "
            f"of repetitions, max over ranks, least-squares latency + bytes / busbw",
            fit.residual,
        )
        tiers[fit.level] = with_cost(tiers[fit.level], fit.kind, cost)
    kinds: tuple[CollectiveKind, ...] = ("all_to_all", "send_recv")
    for kind in kinds:
        measured = [f for f in fits if f.kind == kind]
        if measured:  # the flat view of the node: its outermost measured tier
            top = max(measured, key=lambda f: f.level)
            profile = with_link_cost(profile, "intra_node", kind, tiers[top.level].cost(kind))
    if prior.topology is None:
        # the flat node's one tier (prior.node_tiers()) with the measured costs
        kind_name = "numa_node" if prior.device_kind == "cpu" else tiers[0].kind
        island = replace(tiers[0], kind=kind_name)
        topology = NodeTopology((island,), f"one island (a flat node): cpbench probe {stamp}")
    else:
        topology = NodeTopology(
            tuple(tiers), f"{prior.topology.source}; tiers measured by cpbench probe {stamp}"
        )
    profile = with_topology(profile, topology)
    if kernels:
        by_len: dict[int, list[KernelMeasurement]] = {}
        for m in kernels:
            by_len.setdefault(m.test.seq_len, []).append(m)
        lengths = sorted(by_len)
        values = []
        peak = prior.peak_flops(dtype)
        for n in lengths:
            ms = by_len[n]
            eff = sum(m.flops for m in ms) / (peak * sum(m.seconds for m in ms))
            if eff > 1.0:
                notes.append(
                    f"measured kernel efficiency {eff:.2f} at L/R={n} exceeds the prior's peak: "
                    f"clipped to 1 (the peak of the prior is too low)"
                )
            values.append(min(1.0, eff))
        curve = EfficiencyCurve(
            tuple(lengths),
            tuple(values),
            f"measured by cpbench probe {stamp}: {family}, causal, "
            f"{phase}, median call (max over the ranks "
            f"computing at once); efficiency = causal attention FLOPs (2*B*h*n^2*d_h forward, "
            f"x3.5 fwd+bwd) / (peak x time)",
        )
        profile = with_curve(profile, family, curve)
    profile = replace(
        profile,
        name=name or f"{prior.name}-probe",
        description=f"{prior.description} (links and kernel measured by cpbench probe {stamp})",
        origin="probe",
    )
    return profile, notes


def run_probe(
    settings: ProbeSettings,
    output: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Spawn the ranks, measure, fit, build the profile (and write it to `output`)."""
    import torch  # noqa: PLC0415

    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415

    started = time.perf_counter()
    check_settings(settings)
    say = progress or (lambda _message: None)
    names: list[str] = []
    if settings.device == "cuda":
        count = torch.cuda.device_count()
        if count < settings.world_size:
            raise CpbenchError(
                f"world size ({settings.world_size}) needs {settings.world_size} GPUs, found "
                f"{count}"
            )
        names = [torch.cuda.get_device_name(i) for i in range(settings.world_size)]
    choice = choose_profile(
        names,
        cpu=settings.device == "cpu",
        given=settings.prior,
        subject="the ranks",
        names_from="torch.cuda.get_device_name",
    )
    prior, reason = load_profile(choice.name), choice.reason
    plan = make_plan(settings, prior)
    say(
        f"{len(plan.comm_tests)} collectives on meshes "
        f"{', '.join(f'{u}x{r}' for u, r in plan.meshes)}, {len(plan.kernel_tests)} kernel "
        f"shapes on {plan.kernel_ranks} rank(s) at once; budget {settings.budget_s:g} s"
    )
    comm_budget = settings.budget_s * COMM_SHARE
    kernel_budget = settings.budget_s - comm_budget
    spec = WorldSpec(settings.world_size, settings.device, settings.threads_per_rank)
    with WorkerPool(spec) as pool:
        say(f"{settings.world_size} ranks up after {time.perf_counter() - started:.1f} s")
        t0 = time.perf_counter()
        per_rank = pool.run(
            probe_on_rank, plan, comm_budget, kernel_budget, timeout=settings.timeout_s
        )
        measure_s = time.perf_counter() - t0
    first: RankResult = per_rank[0]
    devices = sorted({r.device_name for r in per_rank})
    hosts = sorted({r.hostname for r in per_rank})
    machine = f"{', '.join(hosts)}, {settings.world_size} x {', '.join(devices)}"
    now = datetime.datetime.now(datetime.timezone.utc)
    date = now.strftime("%Y-%m-%d %H:%M UTC")
    stamp = f"{date}, {machine}"
    comm = []
    timed: list[tuple[CommTest, float]] = []
    for test, samples in zip(plan.comm_tests, first.comm, strict=True):
        seconds = statistics.median(samples)
        alg, bus = bandwidths(test.size_bytes, seconds, test.kind, test.group_size)
        _, tier, _ = _attribution(prior, test)
        comm.append(CommMeasurement(test, seconds, len(samples), alg, bus, tier))
        timed.append((test, seconds))
    fits = fit_links(prior, timed)
    family = prior.kernel_for(settings.kernel, settings.dtype)
    peak = prior.peak_flops(settings.dtype)
    kernels = []
    for shape, samples in zip(plan.kernel_tests, first.kernel, strict=True):
        seconds = statistics.median(samples)
        flops = shape.flops(settings.phase)
        kernels.append(
            KernelMeasurement(shape, seconds, len(samples), flops, flops / (peak * seconds))
        )
    profile, notes = measured_profile(
        prior, fits, kernels, family, settings.dtype, settings.phase, stamp, settings.name
    )
    notes = list(plan.skipped) + notes
    written = None
    if output:
        header = (
            f"Measured by `cpbench probe` on {machine}, {date} (prior {prior.name}).\n"
            f"Links: {len(comm)} collectives; kernel: {len(kernels)} shapes. "
            f"Load with --hardware {output}"
        )
        written = str(save_profile(profile, output, header))
    return ProbeResult(
        plan,
        prior,
        reason,
        profile,
        tuple(comm),
        fits,
        tuple(kernels),
        family,
        machine,
        date,
        time.perf_counter() - started,
        measure_s,
        written,
        tuple(notes),
    )


# ----------------------------------------------------------------------------------- report


def probe_report(result: ProbeResult) -> dict[str, Any]:
    """The JSON document of a probe (seconds, bytes, bytes/s; GB = 1e9 bytes)."""
    s = result.plan.settings
    return {
        "machine": result.machine,
        "date": result.date,
        "wall_s": result.wall_s,
        "measure_s": result.measure_s,
        "settings": {
            "world_size": s.world_size,
            "device": s.device,
            "heads": s.heads,
            "kv_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "batch": s.batch,
            "seq_lens": list(s.seq_lens),
            "dtype": s.dtype,
            "phase": s.phase,
            "kernel": s.kernel,
            "budget_s": s.budget_s,
        },  # fmt: skip
        "prior": {"name": result.prior.name, "reason": result.prior_reason},
        "meshes": [f"{u}x{r}" for u, r in result.plan.meshes],
        "comm": [
            {
                "kind": m.test.kind,
                "mesh": m.test.mesh,
                "group_size": m.test.group_size,
                "size_bytes": m.test.size_bytes,
                "bytes_sent": m.test.bytes_sent,
                "origin": m.test.origin,
                "time_s": m.seconds,
                "repetitions": m.repetitions,
                "algbw_GBps": m.algbw / GB,
                "busbw_GBps": m.busbw / GB,
                "tier": m.tier,
            }  # fmt: skip
            for m in result.comm
        ],
        "links": [
            {
                "tier": f.tier,
                "kind": f.kind,
                "points": f.points,
                "latency_us": f.latency_s * 1e6,
                "busbw_GBps": f.busbw / GB,
                "prior_latency_us": f.prior_latency_s * 1e6,
                "prior_busbw_GBps": f.prior_busbw / GB,
                "residual": f.residual,
            }  # fmt: skip
            for f in result.fits
        ],
        "kernel": {
            "family": result.kernel_family,
            "ranks_at_once": result.plan.kernel_ranks,
            "peak_tflops": result.prior.peak_tflops.get(s.dtype),
            "flops_convention": FLOPS_CONVENTION,
            "shapes": [
                {
                    "seq_len": m.test.seq_len,
                    "heads": m.test.heads,
                    "kv_heads": m.test.kv_heads,
                    "meshes": list(m.test.meshes),
                    "time_s": m.seconds,
                    "repetitions": m.repetitions,
                    "flops": m.flops,
                    "tflops": m.tflops,
                    "efficiency": m.efficiency,
                }  # fmt: skip
                for m in result.kernels
            ],
            "curve": {
                "seq_len": list(result.profile.curve(result.kernel_family).seq_lens),
                "efficiency": list(result.profile.curve(result.kernel_family).values),
            },
        },
        "profile": result.profile.name,
        "profile_toml": profile_to_toml(result.profile),
        "output": result.output,
        "notes": list(result.notes),
    }
