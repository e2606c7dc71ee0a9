"""`cpbench efficiency`: cpbench's own schemes side by side with the libraries, against a
single-process baseline measured in the same run, so that cpbench's comparisons are not biased
by overhead of its own.

For each world size P and dtype, on one pool of P ranks (gloo on CPU, NCCL on GPU, one thread
per rank by default):

* the cases: the single-process fused SDPA step (the baseline: the whole problem on rank 0,
  with the local kernel cpbench picks, the other ranks idle at a barrier), and every mesh
  U x R of P each implementation can express, with the layouts zigzag and contiguous where
  R > 1 (cpbench: every factorization; torch_cp: U = 1; ring_flash_attn: U = 1; yunchang:
  every factorization; what an implementation refuses is listed with its reason);
* the step: causal forward + backward on random shards (`cpbench.bench.reference.
  random_shards`), through the implementation's adapter (`cpbench.impls`);
* every case is prepared and warmed up on its own first (a case that fails is reported
  `failed`, the others still run); then `rounds` interleaved rounds: round r times every case
  once, in the case order rotated by r, each iteration starting at a barrier; an iteration's
  time is the max over ranks;
* per case: best (min over rounds), median, spread = (max - min) / median, and the parallel
  efficiency `t_single / (P x t_case)` from the best and from the median times; cpbench's
  cases also carry their ratio to the fastest library on the same mesh and layout.

No correctness check runs here (`cpbench verify` and the sweep do that); this measures time.

`profile_steps` is the other half: one ring step and one Ulysses step under torch.profiler
(CPU, plus CUDA device time on a GPU), the time split into attention kernels, copies, fills,
elementwise merge / accumulation, communication calls, waits and the rest (docs/profile.md).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import torch
import torch.distributed as dist

from cpbench.attention.kernels import default_scale, select_kernel
from cpbench.bench.pool import TaskError, WorkerPool, WorldSpec
from cpbench.bench.reference import TORCH_DTYPES, random_shards
from cpbench.config.bench import BenchConfig, factorizations
from cpbench.config.vocabulary import Device, Dtype, Layout
from cpbench.errors import CpbenchError, RunFailure
from cpbench.impls import get_adapter, skip_reason

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


@dataclass(frozen=True)
class EfficiencySettings:
    """The problem and the measurement of one `cpbench efficiency` run."""

    seq_len: int = 8192
    """L: global sequence length in tokens."""
    heads: int = 8
    """h: query heads."""
    kv_heads: int = 8
    """h_kv: key/value heads."""
    head_dim: int = 64
    """d_h: channels per head."""
    batch: int = 1
    """B: sequences per micro-batch."""
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
        for name in ("seq_len", "heads", "kv_heads", "head_dim", "batch", "rounds"):
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
            seq_len=settings.seq_len,
            batch=settings.batch,
            heads=settings.heads,
            kv_heads=settings.kv_heads,
            head_dim=settings.head_dim,
            dtype=dtype,
            causal=True,
            ulysses=self.ulysses,
            ring=self.ring,
            layout=self.layout,
            kv_replication=None,
            kernel="auto",
            phase="fwd+bwd",
            device=settings.device,
            world_size=world,
            impl=self.impl,
        )


@dataclass(frozen=True)
class CaseTiming:
    """What one case measured (or why it did not run)."""

    case: EfficiencyCase
    """The configuration."""
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
    """P: ranks."""
    dtype: Dtype
    """Activation dtype."""
    baseline: CaseTiming
    """The single-process step."""
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
    """The problem and the measurement."""
    groups: tuple[EfficiencyGroup, ...]
    """One per (world size, dtype)."""
    convention: str = CONVENTION
    """How efficiency, best, median, spread and vs peer are defined."""
    host: str = field(default_factory=lambda: platform.processor() or platform.machine())
    """The machine (CPU model or architecture)."""
    torch_version: str = torch.__version__
    """The torch the ranks ran."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- cases


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


def _case_reason(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype, world: int
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


# ------------------------------------------------------------------ rank side (pool tasks)

_PREPARED: dict[tuple[Any, ...], Callable[[], None]] = {}
"""Per rank: the step closures of the prepared cases (tensors and runners stay alive)."""


def _key(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype) -> tuple[Any, ...]:
    return (case, settings.seq_len, settings.heads, settings.kv_heads, settings.head_dim,
            settings.batch, dtype, settings.device)


def _device(settings: EfficiencySettings) -> torch.device:
    if settings.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _single_step(settings: EfficiencySettings, dtype: Dtype) -> Callable[[], None]:
    """The baseline: the local kernel cpbench picks, forward + backward on the whole problem
    (global tensors on one rank), no autograd."""
    device = _device(settings)
    torch_dtype = TORCH_DTYPES[dtype]
    g = torch.Generator(device=device).manual_seed(0)
    shape = (settings.batch, settings.seq_len)

    def rand(heads: int) -> torch.Tensor:
        return torch.randn(*shape, heads, settings.head_dim, generator=g, device=device,
                           dtype=torch_dtype)

    q, k, v, dout = rand(settings.heads), rand(settings.kv_heads), rand(settings.kv_heads), \
        rand(settings.heads)
    kernel = select_kernel(device, torch_dtype, "auto")
    scale = default_scale(settings.head_dim)

    def step() -> None:
        out, lse = kernel.forward(q, k, v, True, scale)
        kernel.backward(dout, q, k, v, out, lse, True, scale)

    return step


def _case_step(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype
               ) -> Callable[[], None]:
    config = case.config(settings, dtype, dist.get_world_size())
    runner = get_adapter(case.impl).prepare(config)
    q, k, v, dout = random_shards(config, _device(settings))

    def step() -> None:
        for t in (q, k, v):
            t.grad = None
        with runner.context():
            out = runner.forward(q, k, v)
            out.backward(dout)

    return step


def _step(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype
          ) -> Callable[[], None]:
    key = _key(case, settings, dtype)
    if key not in _PREPARED:
        if case.impl == SINGLE:
            # Only rank 0 runs the baseline; the other ranks hold nothing for it.
            _PREPARED[key] = (
                _single_step(settings, dtype) if dist.get_rank() == 0 else (lambda: None)
            )
        else:
            _PREPARED[key] = _case_step(case, settings, dtype)
    return _PREPARED[key]


def _elapsed(step: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def prepare_task(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype) -> bool:
    """Pool task: build the case's step and run its warm-up steps."""
    step = _step(case, settings, dtype)
    for _ in range(settings.warmup):
        dist.barrier()
        step()
    if settings.device == "cuda":
        torch.cuda.synchronize()
    return True


def rounds_task(
    cases: list[EfficiencyCase], settings: EfficiencySettings, dtype: Dtype
) -> list[list[float]]:
    """Pool task: `settings.rounds` interleaved rounds over `cases` (round r in the order
    rotated by r); per case, each round's seconds, max over ranks."""
    device = _device(settings)
    steps = [_step(case, settings, dtype) for case in cases]
    n = len(cases)
    samples = [[0.0] * settings.rounds for _ in cases]
    for r in range(settings.rounds):
        for j in range(n):
            i = (r + j) % n
            dist.barrier()  # start together: the max over ranks is the step, not the skew
            if cases[i].impl == SINGLE and dist.get_rank() != 0:
                continue
            samples[i][r] = _elapsed(steps[i], device)
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [[float(x) for x in row] for row in t.tolist()]


def clear_task() -> int:
    """Pool task: drop every prepared case (between dtypes)."""
    count = len(_PREPARED)
    _PREPARED.clear()
    return count


# ------------------------------------------------------------------------ parent side


def _timing(case: EfficiencyCase, samples: list[float], single: list[float] | None, world: int
            ) -> CaseTiming:
    best, median = min(samples), statistics.median(samples)
    spread = (max(samples) - best) / median if median > 0 else 0.0
    eff_best = eff_median = None
    if single is not None:
        eff_best = min(single) / (world * best) if best > 0 else None
        eff_median = statistics.median(single) / (world * median) if median > 0 else None
    return CaseTiming(case, "ok", None, tuple(samples), best, median, spread, eff_best,
                      eff_median)


def with_peers(timings: list[CaseTiming]) -> list[CaseTiming]:
    """cpbench's ok cases with `vs_peer`: their median over the fastest other
    implementation's median on the same mesh and layout."""
    out = []
    for t in timings:
        if t.case.impl != "cpbench" or t.status != "ok" or t.median is None:
            out.append(t)
            continue
        peers = [
            p for p in timings
            if p.status == "ok" and p.case.impl not in ("cpbench", SINGLE) and p.median
            and (p.case.ulysses, p.case.ring, p.case.layout)
            == (t.case.ulysses, t.case.ring, t.case.layout)
        ]
        if not peers:
            out.append(t)
            continue
        fastest = min(peers, key=lambda p: p.median or 0.0)
        out.append(replace(t, vs_peer=t.median / (fastest.median or 1.0),
                           peer=fastest.case.impl))
    return out


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def measure_group(
    pool: WorkerPool,
    settings: EfficiencySettings,
    world: int,
    dtype: Dtype,
    progress: Callable[[str], None] | None = None,
) -> EfficiencyGroup:
    """One world size and dtype on `pool` (of `world` ranks): prepare each case, then the
    interleaved rounds of the baseline and every case that prepared."""
    t0, load0 = time.monotonic(), _load()
    say = progress or (lambda _msg: None)
    baseline_case = EfficiencyCase(SINGLE, 1, 1, "contiguous")
    timings: dict[EfficiencyCase, CaseTiming] = {}
    runnable = [baseline_case]
    for case in cases_of(settings, world):
        reason = _case_reason(case, settings, dtype, world)
        if reason is not None:
            timings[case] = CaseTiming(case, "skipped", reason)
            continue
        say(f"P={world} {dtype}: preparing {case.label}")
        try:
            pool.run(prepare_task, case, settings, dtype, timeout=settings.timeout)
        except RunFailure as exc:
            timings[case] = CaseTiming(case, "failed", str(exc))
            continue
        runnable.append(case)
    say(f"P={world} {dtype}: baseline warm-up")
    pool.run(prepare_task, baseline_case, settings, dtype, timeout=settings.timeout)
    say(f"P={world} {dtype}: {settings.rounds} interleaved rounds of {len(runnable)} cases")
    try:
        samples = pool.run(rounds_task, runnable, settings, dtype, timeout=settings.timeout)[0]
    except TaskError as exc:
        raise RunFailure(f"P={world} {dtype}: the timed rounds failed: {exc}") from exc
    single = samples[0]
    baseline = _timing(baseline_case, single, single, 1)
    for case, s in zip(runnable[1:], samples[1:], strict=True):
        timings[case] = _timing(case, s, single, world)
    ordered = [timings[c] for c in cases_of(settings, world)]
    pool.run(clear_task)
    return EfficiencyGroup(world, dtype, baseline, tuple(with_peers(ordered)),
                           (load0, _load()), time.monotonic() - t0)


def run_efficiency(
    settings: EfficiencySettings, progress: Callable[[str], None] | None = None
) -> EfficiencyReport:
    """Every world size and dtype of `settings`, one pool per world size."""
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise CpbenchError("device 'cuda' requested but torch sees no CUDA device")
    if settings.device == "cuda" and torch.cuda.device_count() < max(settings.world_sizes):
        raise CpbenchError(
            f"world size {max(settings.world_sizes)} needs as many GPUs; torch sees "
            f"{torch.cuda.device_count()}"
        )
    groups = []
    for world in settings.world_sizes:
        with WorkerPool(WorldSpec(world, settings.device, settings.threads_per_rank)) as pool:
            for dtype in settings.dtypes:
                groups.append(measure_group(pool, settings, world, dtype, progress))
    return EfficiencyReport(settings, tuple(groups))


# ----------------------------------------------------------------------------- profile

ProfileBucket = Literal[
    "attention kernels", "copies", "fills", "merge / accumulate", "comm calls", "waits",
    "other ops & autograd",
]
PROFILE_BUCKETS: tuple[ProfileBucket, ...] = (
    "attention kernels", "copies", "fills", "merge / accumulate", "comm calls", "waits",
    "other ops & autograd",
)
_ELEMENTWISE = {
    "add", "add_", "mul", "mul_", "sub", "sub_", "logaddexp", "exp", "exp_", "sigmoid",
    "log_sigmoid_forward", "log", "div", "div_", "sum", "neg", "masked_fill", "where", "lerp_",
}


def bucket_of(name: str) -> ProfileBucket:
    """The profile bucket of a profiler event name (an aten op, a c10d call, a CUDA kernel,
    or a cpbench record_function range)."""
    low = name.lower()
    if low.startswith("cpbench::wait") or low.startswith("cpbench::a2a"):
        return "waits"
    if low.startswith(("c10d::", "nccl", "gloo", "record_param_comms")):
        return "comm calls"
    if any(s in low for s in ("scaled_dot_product", "flash", "fmha", "attention_kernel")):
        return "attention kernels"
    op = low.removeprefix("aten::")
    if op in ("copy_", "cat", "_to_copy", "clone", "contiguous") or "memcpy" in low:
        return "copies"
    if op in ("fill_", "zero_") or "memset" in low or "fill" in low:
        return "fills"
    if op in _ELEMENTWISE or "elementwise" in low or "reduce" in low:
        return "merge / accumulate"
    return "other ops & autograd"


@dataclass(frozen=True)
class StepProfile:
    """Where one step's time goes on rank 0 (self times of the profiler's events): of the
    profiled steps, the one whose wall time is the median (a whole step, not a mix of steps)."""

    label: str
    """The case profiled (single process, cpbench U1xR2 zigzag, ...)."""
    wall: float
    """Seconds of the step shown (wall clock, rank 0): the median of `walls` (the lower middle
    one for an even count: a step that ran)."""
    cpu: dict[str, float]
    """Seconds of host (self CPU) time per bucket; on CPU this is where the step runs."""
    device: dict[str, float]
    """Seconds of device (self CUDA) time per bucket; empty on CPU."""
    walls: tuple[float, ...] = ()
    """Wall seconds of every profiled step, in order (their spread is the run's noise)."""


def profile_task(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype
                 ) -> StepProfile | None:
    """Pool task: one warm step, then `settings.rounds` steps of `case`, each under its own
    torch.profiler; rank 0's buckets of the median step (None on the other ranks)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    step = _step(case, settings, dtype)
    device = _device(settings)
    dist.barrier()
    step()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    steps: list[tuple[float, dict[str, float], dict[str, float]]] = []
    for _ in range(settings.rounds):
        dist.barrier()
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        cpu: dict[str, float] = dict.fromkeys(PROFILE_BUCKETS, 0.0)
        dev: dict[str, float] = (
            dict.fromkeys(PROFILE_BUCKETS, 0.0) if device.type == "cuda" else {}
        )
        for event in prof.key_averages():
            bucket = bucket_of(event.key)
            cpu[bucket] += event.self_cpu_time_total / 1e6
            if dev:
                dev[bucket] += getattr(event, "self_device_time_total", 0.0) / 1e6
        steps.append((wall, cpu, dev))
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    walls = tuple(w for w, _, _ in steps)
    wall, cpu, dev = sorted(steps, key=lambda s: s[0])[(len(steps) - 1) // 2]
    return StepProfile(case.label, wall, cpu, dev, walls)


def profile_steps(
    settings: EfficiencySettings,
    dtype: Dtype,
    cases: tuple[EfficiencyCase, ...] = (
        EfficiencyCase("cpbench", 1, 2, "zigzag"),
        EfficiencyCase("cpbench", 2, 1, "contiguous"),
    ),
) -> list[StepProfile]:
    """The baseline, then each case (default: one ring step, one Ulysses step), each profiled
    for `settings.rounds` steps on a pool of `settings.world_sizes[0]` ranks (the median step
    is shown)."""
    world = settings.world_sizes[0]
    profiles = []
    with WorkerPool(WorldSpec(world, settings.device, settings.threads_per_rank)) as pool:
        for case in (EfficiencyCase(SINGLE, 1, 1, "contiguous"), *cases):
            result = pool.run(profile_task, case, settings, dtype, timeout=settings.timeout)[0]
            if result is not None:
                profiles.append(result)
        pool.run(clear_task)
    return profiles
