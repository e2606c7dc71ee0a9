"""`cpbench probe`: a thin typer wrapper around `cpbench.app.probe`; the tables are
`cpbench.render.probe`'s."""

from __future__ import annotations

from typing import Annotated

import typer

from cpbench.cli.common import command, emit, err_console, resolve_device
from cpbench.config.vocabulary import Backend, CliDevice, Dtype, Phase


@command
def probe(
    world_size: Annotated[int, typer.Option(help="Ranks to probe (GPUs, or CPU processes).")] = 4,
    device: Annotated[CliDevice, typer.Option(help="auto picks cuda when available.")] = "auto",
    hardware: Annotated[
        str | None,
        typer.Option(
            "--hardware",
            help=(
                "Prior profile (name or TOML file) whose measured numbers are replaced. "
                "Default: cpu-local on CPU, the built-in profile matching the GPU."
            ),
        ),
    ] = None,
    heads: Annotated[
        int | None, typer.Option(help="Query heads h (default 8 on CPU, 32 on GPU).")
    ] = None,
    kv_heads: Annotated[
        int | None, typer.Option(help="KV heads h_kv (default 8 on CPU and GPU).")
    ] = None,
    head_dim: Annotated[
        int | None, typer.Option(help="Head dimension d_h (default 64 on CPU, 128 on GPU).")
    ] = None,
    seq_len: Annotated[
        list[int] | None,
        typer.Option(
            "--seq-len",
            help="Global sequence length L (repeat; default 4096 and 8192 on CPU, 32768 and "
            "131072 on GPU).",
        ),
    ] = None,
    batch: Annotated[int, typer.Option(help="Micro-batch B.")] = 1,
    dtype: Annotated[
        Dtype | None, typer.Option(help="Dtype (default float32 on CPU, bfloat16 on GPU).")
    ] = None,
    phase: Annotated[Phase, typer.Option(help="fwd or fwd+bwd (adds the dK/dV hops).")] = (
        "fwd+bwd"
    ),
    kernel: Annotated[Backend, typer.Option(help="Local attention kernel to time.")] = "auto",
    budget: Annotated[
        float, typer.Option(help="Seconds of measurement (rank start-up excluded).")
    ] = 25.0,
    name: Annotated[
        str | None, typer.Option(help="Name of the written profile (default PRIOR-probe).")
    ] = None,
    threads: Annotated[int, typer.Option(help="CPU threads per rank.")] = 1,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Write the profile to this TOML file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Measure this machine's all-to-all and send/recv (every U x R mesh of the world size, at
    the sizes its configurations send, nccl-tests algbw/busbw, latency from small messages)
    and the local attention kernel at the L/R lengths; write a hardware profile that
    `recommend --hardware` and `calibrate` accept."""
    from cpbench.app.probe.plan import default_settings  # noqa: PLC0415
    from cpbench.app.probe.run import probe_report, run_probe  # noqa: PLC0415
    from cpbench.render.probe import render_probe  # noqa: PLC0415

    settings = default_settings(
        resolve_device(device),
        world_size,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        seq_lens=tuple(seq_len) if seq_len else None,
        batch=batch,
        dtype=dtype,
        phase=phase,
        kernel=kernel,
        prior=hardware,
        budget_s=budget,
        name=name,
        threads_per_rank=threads,
    )

    def progress(message: str) -> None:
        if not as_json:
            err_console.print(f"[probe] {message}", markup=False, highlight=False)

    report = probe_report(run_probe(settings, output, progress))
    emit(report.model_dump(mode="json"), as_json, lambda: render_probe(report))
