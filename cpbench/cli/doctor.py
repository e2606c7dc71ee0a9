"""`cpbench doctor`: a thin typer wrapper around `cpbench.app.doctor.collect`."""

from __future__ import annotations

from cpbench.cli import options as o
from cpbench.cli.common import command, emit


@command
def doctor(as_json: o.Json = False) -> None:
    """Report what a sweep needs and what this machine has: torch, CUDA, NCCL, cuDNN and the
    attention libraries' versions, the visible GPUs and their interconnect (NVLink / PCIe, as
    `nvidia-smi topo -m`), NVML, which kernels, implementations and distributed backends can
    run here, and for each that cannot, why. Run it first on a new machine."""
    from cpbench.app.doctor import collect  # noqa: PLC0415
    from cpbench.render.doctor import render_doctor  # noqa: PLC0415

    report = collect()
    emit(report.model_dump(mode="json"), as_json, lambda: render_doctor(report), highlight=False)
