"""`cpbench doctor`: what a user needs to know before a sweep, as one typed report.

What it reports, and how it reads GPUs without a CUDA context: docs/internals.md."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

from cpbench.app.doctor.gpus import (
    as_text,
    cuda_uuids_from_torch,
    nvml_gpus,
    torch_gpus,
    try_nvml,
)
from cpbench.app.doctor.schema import DoctorReport, Gpu, Nvml
from cpbench.app.doctor.statuses import (
    backend_statuses,
    impl_statuses,
    kernel_statuses,
    probe_config,
)
from cpbench.app.doctor.topology import read_topology
from cpbench.app.doctor.versions import cuda_reason, cudnn_release, nccl_version, package_versions
from cpbench.bench.nvml import load_nvml
from cpbench.config.vocabulary import DEFAULT_DTYPE, Device


def summary_lines(report: DoctorReport) -> list[str]:
    """Plain sentences: where sweeps run, and what is not usable."""
    if report.cuda_available and report.gpus:
        names = sorted({g.name for g in report.gpus})
        lines = [f"{len(report.gpus)} GPU{'s' if len(report.gpus) > 1 else ''} visible "
                 f"({', '.join(names)}): sweeps run on CUDA with NCCL"]
    else:
        seen = (f", though NVML sees {len(report.gpus)} GPU{'s' if len(report.gpus) > 1 else ''}"
                if report.gpus else "")
        lines = [f"no GPU: CUDA not available ({report.cuda_reason}{seen}); sweeps run on CPU "
                 "with gloo"]
    dtype = DEFAULT_DTYPE[report.device]
    lines.append(f"kernels usable in {dtype}: {', '.join(report.usable_kernels(dtype)) or 'none'}")
    usable = [i.name for i in report.impls if i.usable]
    lines.append(f"implementations usable: {', '.join(usable) or 'none'}")
    if report.device == "cuda" and not report.nvml.available:
        lines.append(f"NVML is not available ({report.nvml.reason}): no NVML memory peaks")
    return lines


def collect(env: dict[str, str] | None = None) -> DoctorReport:
    """Run every check and return the report."""
    import socket  # noqa: PLC0415

    # torch here, not at the top: reading a saved report (`schema`, the acceptance summary)
    # needs none of it, and importing it costs seconds
    import torch  # noqa: PLC0415

    from cpbench import __version__  # noqa: PLC0415

    start = time.perf_counter()
    env = dict(os.environ) if env is None else env
    cuda = torch.cuda.is_available()
    nvml: Any = None
    nvml_reason = None
    try:
        nvml = load_nvml()
    except Exception as exc:  # noqa: BLE001 - any NVML failure: the report says which
        nvml_reason = f"{type(exc).__name__}: {exc}"
    driver = cuda_driver = None
    gpus: list[Gpu] = []
    if nvml is not None:
        version = try_nvml(nvml.nvmlSystemGetDriverVersion)
        driver = as_text(version) if version is not None else None
        code = try_nvml(nvml.nvmlSystemGetCudaDriverVersion)
        cuda_driver = f"{int(code) // 1000}.{int(code) % 1000 // 10}" if code else None
        try:
            gpus = nvml_gpus(
                nvml,
                env.get("CUDA_VISIBLE_DEVICES"),
                env.get("CUDA_DEVICE_ORDER"),
                cuda_uuids_from_torch if cuda else None,
            )
        except Exception as exc:  # noqa: BLE001 - a GPU NVML cannot read: torch lists them
            nvml_reason = f"listing the GPUs failed: {type(exc).__name__}: {exc}"
    count = torch.cuda.device_count() if cuda else 0
    if cuda and len(gpus) != count:  # no NVML, or a CUDA_VISIBLE_DEVICES it cannot map (MIG)
        gpus = torch_gpus()
    device: Device = "cuda" if cuda and gpus else "cpu"
    topology = read_topology(nvml, gpus)
    if nvml is not None:
        try_nvml(nvml.nvmlShutdown)
    world = len(gpus) if device == "cuda" else 2
    config = probe_config(device, world)
    report = DoctorReport(
        cpbench=__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        hostname=socket.gethostname(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        nccl=nccl_version(),
        cudnn=cudnn_release(),
        cuda_available=cuda,
        cuda_reason=cuda_reason(),
        cuda_device_count=count,
        device=device,
        gpus=gpus,
        nvml=Nvml(available=nvml is not None, driver_version=driver,
                  cuda_driver_version=cuda_driver, reason=nvml_reason),
        topology=topology,
        packages=package_versions(),
        kernels=kernel_statuses(device),
        probe_config=(
            f"{config.scheme} {config.ulysses}x{config.ring} {config.layout} causal, "
            f"{config.dtype}, {config.device}, world {config.world_size}"
        ),
        impls=impl_statuses(config),
        backends=backend_statuses(len(gpus) if device == "cuda" else 0),
        summary=[],
        elapsed_seconds=0.0,
    )
    report.summary = summary_lines(report)
    report.elapsed_seconds = round(time.perf_counter() - start, 3)
    return report
