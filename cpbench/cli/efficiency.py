"""`cpbench efficiency`: a thin typer wrapper around `cpbench.app.efficiency`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from cpbench.cli.common import command, emit, err_console, resolve_device
from cpbench.config.vocabulary import DTYPES, LAYOUTS, CliDevice, Dtype, Layout
from cpbench.errors import CpbenchError


def _choices(values: list[str] | None, allowed: tuple[str, ...], option: str) -> list[str]:
    for v in values or []:
        if v not in allowed:
            raise CpbenchError(f"{option} {v!r} is not one of {', '.join(allowed)}")
    return list(values or [])


@command
def efficiency(
    seq_len: Annotated[int, typer.Option(help="Global sequence length L in tokens.")] = 8192,
    heads: Annotated[int, typer.Option(help="Query heads h.")] = 8,
    kv_heads: Annotated[int | None, typer.Option(help="KV heads h_kv (default: heads).")] = None,
    head_dim: Annotated[int, typer.Option(help="Head dimension d_h.")] = 64,
    batch: Annotated[int, typer.Option(help="Micro-batch B.")] = 1,
    world_size: Annotated[
        list[int] | None,
        typer.Option("--world-size", help="World size P (repeat for several; default 2 and 4)."),
    ] = None,
    dtype: Annotated[
        list[str] | None,
        typer.Option("--dtype", help="Dtype (repeat for several; default float32 and bfloat16)."),
    ] = None,
    impl: Annotated[
        list[str] | None,
        typer.Option(
            "--impl",
            help="Implementation (repeat; default cpbench, torch_cp, torch_cp:alltoall, "
            "ring_flash_attn, yunchang, plus transformer_engine on CUDA).",
        ),
    ] = None,
    layout: Annotated[
        list[str] | None,
        typer.Option("--layout", help="Ring layout where R > 1 (repeat; default zigzag and "
                     "contiguous)."),
    ] = None,
    rounds: Annotated[int, typer.Option(help="Interleaved timed rounds (best-of-N).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps per case first.")] = 1,
    device: Annotated[CliDevice, typer.Option(help="auto picks cuda when available.")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads per rank.")] = 1,
    timeout: Annotated[float, typer.Option(help="Seconds one pool task may take.")] = 1800.0,
    profile: Annotated[
        bool,
        typer.Option("--profile", help="Instead: profile --rounds steps of a ring case and of "
                     "a Ulysses case (first world size and dtype) with torch.profiler and "
                     "show each one's median step."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON document here.")] = None,
) -> None:
    """Parallel efficiency of cpbench's schemes and the libraries on every mesh they can
    express, against a single-process fused SDPA baseline in the same run: interleaved
    rounds, best-of-N and median with spread; efficiency = t_single / (P x t_case)."""
    from cpbench.bench.pool import start_forkserver_early  # noqa: PLC0415

    start_forkserver_early(device)  # its imports beside this process's (bench/pool.py)
    from cpbench.app.efficiency.cases import (  # noqa: PLC0415
        DEFAULT_IMPLS,
        DEFAULT_LAYOUTS,
        GPU_IMPLS,
        EfficiencySettings,
    )
    from cpbench.app.efficiency.measure import run_efficiency  # noqa: PLC0415
    from cpbench.app.efficiency.profile import profile_steps  # noqa: PLC0415
    from cpbench.render.efficiency import efficiency_tables, profile_table  # noqa: PLC0415

    dtypes: list[Dtype] = _choices(dtype, DTYPES, "--dtype")  # type: ignore[assignment]
    layouts: list[Layout] = _choices(layout, LAYOUTS, "--layout")  # type: ignore[assignment]
    run_device = resolve_device(device)
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
        profiles = [asdict(p) for p in profile_steps(settings, settings.dtypes[0])]
        document: dict = {"settings": asdict(settings), "profiles": profiles}
        if out is not None:
            out.write_text(json.dumps(document, indent=1))
        emit(document, as_json, lambda: [profile_table(profiles, settings.dtypes[0])])
        return
    report = run_efficiency(settings, progress).to_dict()
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    emit(report, as_json, lambda: efficiency_tables(report))
