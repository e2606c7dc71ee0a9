"""`cpbench probe`: a thin typer wrapper around `cpbench.app.probe`; the tables are
`cpbench.render.probe`'s."""

from __future__ import annotations

from cpbench.cli import options as o
from cpbench.cli.common import command, emit, err_console, resolve_device


@command
def probe(
    world_size: o.WorldSizeOption = 4,
    device: o.DeviceOption = o.DEFAULT_DEVICE,
    hardware: o.Hardware = None,
    heads: o.HeadsOrNone = None,
    kv_heads: o.KvHeadsOrNone = None,
    head_dim: o.HeadDimOrNone = None,
    seq_len: o.SeqLens = None,
    batch: o.Batch = o.DEFAULTS["batch"],
    dtype: o.DtypeOrNone = None,
    phase: o.PhaseChoice = o.DEFAULTS["phase"],
    kernel: o.KernelChoice = o.DEFAULTS["kernel"],
    budget: o.Budget = 25.0,
    name: o.Name = None,
    threads: o.Threads = 1,
    output: o.OutputOrNone = None,
    as_json: o.Json = False,
) -> None:
    """Measure this machine's all-to-all and send/recv (every U x R mesh of the world size, at
    the sizes its configurations send, nccl-tests algbw/busbw, latency from small messages)
    and the local attention kernel at the L/R lengths; write a hardware profile that
    `recommend --hardware` and `calibrate` accept.

    Defaults by device (CPU / GPU): --heads 8 / 32, --kv-heads 8, --head-dim 64 / 128, --dtype
    float32 / bfloat16, --seq-len (repeatable) 4096 and 8192 / 32768 and 131072."""
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
