"""The measurement of `cpbench efficiency`, on one pool of P ranks per world size.

Interleaved rounds, best / median / spread, efficiency: docs/profile.md, "Efficiency runs"."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from cpbench.app.efficiency.cases import (
    PROBLEM_FIELDS,
    SINGLE,
    CaseTiming,
    EfficiencyCase,
    EfficiencyGroup,
    EfficiencyReport,
    EfficiencySettings,
    case_reason,
    cases_of,
)
from cpbench.attention.kernels import default_scale, select_kernel
from cpbench.bench.measure import adapter_step
from cpbench.bench.pool import TaskError, WorkerPool, WorldSpec
from cpbench.bench.reference import TORCH_DTYPES, random_shards
from cpbench.bench.timing import step_timer
from cpbench.config.vocabulary import Dtype
from cpbench.errors import CpbenchError, RunFailure
from cpbench.impls import get_adapter

# ------------------------------------------------------------------ rank side (pool tasks)

_PREPARED: dict[tuple[Any, ...], Callable[[], None]] = {}
"""Per rank: the step closures of the prepared cases (tensors and runners stay alive)."""


def _key(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype) -> tuple[Any, ...]:
    return (case, *(getattr(settings, name) for name in PROBLEM_FIELDS), dtype, settings.device)


def rank_device(settings: EfficiencySettings) -> torch.device:
    if settings.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _single_step(settings: EfficiencySettings, dtype: Dtype) -> Callable[[], None]:
    """The baseline: the local kernel cpbench picks, forward + backward on the whole problem
    (global tensors on one rank), no autograd."""
    device = rank_device(settings)
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
    """A case's step: the library step kind's (`bench.measure.adapter_step`), fwd+bwd."""
    config = case.config(settings, dtype, dist.get_world_size())
    runner = get_adapter(case.impl).prepare(config)
    return adapter_step(runner, random_shards(config, rank_device(settings)))


def prepared_step(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype
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


def prepare_task(case: EfficiencyCase, settings: EfficiencySettings, dtype: Dtype) -> bool:
    """Pool task: build the case's step and run its warm-up steps."""
    step = prepared_step(case, settings, dtype)
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
    device = rank_device(settings)
    steps = [prepared_step(case, settings, dtype) for case in cases]
    n = len(cases)
    elapsed = step_timer(device)
    samples = [[0.0] * settings.rounds for _ in cases]
    for r in range(settings.rounds):
        for j in range(n):
            i = (r + j) % n
            dist.barrier()  # start together: the max over ranks is the step, not the skew
            if cases[i].impl == SINGLE and dist.get_rank() != 0:
                continue
            samples[i][r] = elapsed(steps[i])
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
        peers = [
            p for p in timings
            if p.status == "ok" and p.case.impl not in ("cpbench", SINGLE) and p.median
            and (p.case.ulysses, p.case.ring, p.case.layout)
            == (t.case.ulysses, t.case.ring, t.case.layout)
        ]
        if t.case.impl != "cpbench" or t.status != "ok" or t.median is None or not peers:
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
        reason = case_reason(case, settings, dtype, world)
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

