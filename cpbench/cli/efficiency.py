"""`cpbench efficiency`: a thin typer wrapper around `cpbench.app.efficiency`."""

from __future__ import annotations

import json
from dataclasses import asdict

from cpbench.cli import options as o
from cpbench.cli.common import command, emit, err_console, resolve_device
from cpbench.config.vocabulary import DTYPES, LAYOUTS, Dtype, Layout
from cpbench.errors import CpbenchError


def _choices(values: list[str] | None, allowed: tuple[str, ...], option: str) -> list[str]:
    for v in values or []:
        if v not in allowed:
            raise CpbenchError(f"{option} {v!r} is not one of {', '.join(allowed)}")
    return list(values or [])


@command
def efficiency(
    seq_len: o.SeqLen = 8192,
    heads: o.Heads = 8,
    kv_heads: o.KvHeadsOrNone = None,
    head_dim: o.HeadDim = 64,
    batch: o.Batch = o.DEFAULTS["batch"],
    world_size: o.WorldSizes = None,
    dtype: o.Dtypes = None,
    impl: o.Impls = None,
    layout: o.Layouts = None,
    rounds: o.Rounds = 5,
    warmup: o.Warmup = 1,
    device: o.DeviceOption = o.DEFAULT_DEVICE,
    threads: o.Threads = 1,
    timeout: o.Timeout = 1800.0,
    profile: o.Profile = False,
    as_json: o.Json = False,
    out: o.Out = None,
) -> None:
    """Parallel efficiency of cpbench's schemes and the libraries on every mesh they can
    express, against a single-process fused SDPA baseline in the same run: interleaved
    rounds, best-of-N and median with spread; efficiency = t_single / (P x t_case).

    --world-size, --dtype, --impl and --layout repeat (defaults: 2 and 4; float32 and bfloat16;
    cpbench, torch_cp, torch_cp:alltoall, ring_flash_attn, yunchang, plus transformer_engine
    on CUDA; zigzag and contiguous, where R > 1); --kv-heads defaults to --heads."""
    dtypes: list[Dtype] = _choices(dtype, DTYPES, "--dtype")  # type: ignore[assignment]
    layouts: list[Layout] = _choices(layout, LAYOUTS, "--layout")  # type: ignore[assignment]
    run_device = resolve_device(device)  # starts the CPU ranks' forkserver before these imports
    from cpbench.app.efficiency.cases import (  # noqa: PLC0415
        DEFAULT_IMPLS,
        DEFAULT_LAYOUTS,
        GPU_IMPLS,
        EfficiencySettings,
    )
    from cpbench.app.efficiency.measure import run_efficiency  # noqa: PLC0415
    from cpbench.app.efficiency.profile import profile_steps  # noqa: PLC0415
    from cpbench.render.efficiency import efficiency_tables, profile_table  # noqa: PLC0415

    impls = tuple(impl) if impl else DEFAULT_IMPLS + (GPU_IMPLS if run_device == "cuda" else ())
    settings = EfficiencySettings(
        seq_len=seq_len,
        heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=head_dim,
        batch=batch,
        world_sizes=tuple(world_size) if world_size else (2, 4),
        dtypes=tuple(dtypes) if dtypes else ("float32", "bfloat16"),
        impls=impls,
        layouts=tuple(layouts) if layouts else DEFAULT_LAYOUTS,
        rounds=rounds,
        warmup=warmup,
        device=run_device,
        threads_per_rank=threads,
        timeout=timeout,
    )

    def progress(message: str) -> None:
        if not as_json:
            err_console.print(f"[efficiency] {message}", markup=False, highlight=False)

    if profile:
        profiles = profile_steps(settings, settings.dtypes[0])
        document: dict = {"settings": asdict(settings), "profiles": [asdict(p) for p in profiles]}
        if out is not None:
            out.write_text(json.dumps(document, indent=1))
        emit(document, as_json, lambda: [profile_table(profiles, settings.dtypes[0])])
        return
    report = run_efficiency(settings, progress)
    plain = report.to_dict()
    if out is not None:
        out.write_text(json.dumps(plain, indent=1))
    emit(plain, as_json, lambda: efficiency_tables(report))
