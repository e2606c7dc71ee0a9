"""`run_probe`: spawn the ranks, measure, fit, build the profile and write it; `probe_report`,
its typed report (`--json` is its model_dump). `cpbench.render.probe` prints it."""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cpbench.app.probe import schema as out
from cpbench.app.probe.fit import (
    CommMeasurement,
    KernelMeasurement,
    LinkFit,
    attribution,
    fit_links,
)
from cpbench.app.probe.plan import ProbePlan, ProbeSettings, check_settings, make_plan
from cpbench.app.probe.profile import measured_profile
from cpbench.app.probe.ranks import RankResult, probe_on_rank
from cpbench.app.probe.schema import ProbeReport
from cpbench.errors import CpbenchError
from cpbench.model.flops import FLOPS_CONVENTION
from cpbench.model.formulas import bandwidths
from cpbench.model.hardware.file_schema import profile_to_toml, save_profile
from cpbench.model.hardware.loading import choose_profile, load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.units import GB

COMM_SHARE = 0.3
"""Share of `--budget` for the link measurements (the rest: the kernel)."""


@dataclass(frozen=True)
class ProbeResult:
    """Everything `cpbench probe` measured and the profile it made."""

    plan: ProbePlan
    prior: HardwareProfile
    """The profile started from."""
    prior_reason: str
    profile: HardwareProfile
    """The prior with the measured numbers."""
    comm: tuple[CommMeasurement, ...]
    fits: tuple[LinkFit, ...]
    kernels: tuple[KernelMeasurement, ...]
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
    for test, samples in zip(plan.comm_tests, first.comm, strict=True):
        seconds = statistics.median(samples)
        alg, bus = bandwidths(test.size_bytes, seconds, test.kind, test.group_size)
        _, tier, _ = attribution(prior, test)
        comm.append(CommMeasurement(test, seconds, len(samples), alg, bus, tier))
    fits = fit_links(prior, [(m.test, m.seconds) for m in comm])
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
        plan, prior, reason, profile, tuple(comm), fits, tuple(kernels), family, machine, date,
        time.perf_counter() - started, measure_s, written, tuple(notes),
    )  # fmt: skip


def probe_report(result: ProbeResult) -> ProbeReport:
    """The report of a probe (seconds, bytes, bytes/s; GB = 1e9 bytes)."""
    s, curve = result.plan.settings, result.profile.curve(result.kernel_family)
    return ProbeReport(
        machine=result.machine,
        date=result.date,
        wall_s=result.wall_s,
        measure_s=result.measure_s,
        settings=out.Settings.of(s),
        prior=out.Prior(name=result.prior.name, reason=result.prior_reason),
        meshes=[f"{u}x{r}" for u, r in result.plan.meshes],
        comm=[
            out.CommRow.of(
                m.test, time_s=m.seconds, repetitions=m.repetitions, algbw_GBps=m.algbw / GB,
                busbw_GBps=m.busbw / GB, tier=m.tier,
            )
            for m in result.comm
        ],
        links=[
            out.LinkRow.of(
                f, latency_us=f.latency_s * 1e6, busbw_GBps=f.busbw / GB,
                prior_latency_us=f.prior_latency_s * 1e6, prior_busbw_GBps=f.prior_busbw / GB,
            )
            for f in result.fits
        ],
        kernel=out.Kernel(
            family=result.kernel_family,
            ranks_at_once=result.plan.kernel_ranks,
            peak_tflops=result.prior.peak_tflops.get(s.dtype),
            flops_convention=FLOPS_CONVENTION,
            shapes=[
                out.KernelShape.of(
                    m.test, time_s=m.seconds, repetitions=m.repetitions, flops=m.flops,
                    tflops=m.tflops, efficiency=m.efficiency,
                )
                for m in result.kernels
            ],
            curve=out.Curve(seq_len=list(curve.seq_lens), efficiency=list(curve.values)),
        ),
        profile=result.profile.name,
        profile_toml=profile_to_toml(result.profile),
        output=result.output,
        notes=list(result.notes),
    )  # fmt: skip
