"""`cpbench verify`: a thin typer wrapper around `cpbench.app.verify.run_verify`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from cpbench.cli import options as o
from cpbench.cli.common import command, console, resolve_device
from cpbench.config.vocabulary import CP_COMM_CHOICES, DEFAULT_DTYPE
from cpbench.errors import EXIT_WRONG_RESULT
from cpbench.render.tables import verify_tables

if TYPE_CHECKING:
    from cpbench.app.verify import VerifyRow


@command
def verify(
    world_size: o.WorldSizeOrNone = None,
    device: o.DeviceOption = o.DEFAULT_DEVICE,
    dtype: o.DtypeOrNone = None,
    kernel: o.KernelChoice = o.DEFAULTS["kernel"],
    as_json: o.Json = False,
    impl: o.ImplChoice = o.DEFAULTS["impl"],
    masks: o.Masks = True,
    cp_comm: o.CpCommBoth = "both",
    inference: o.Inference = False,
) -> None:
    """Check every scheme x layout x mask x GQA case against the single-process reference.

    Every ring-axis case also runs all-gathered (the all-gather scheme; GQA cases also with
    heads_k_stride 1) unless --cp-comm p2p. Masks: causal, full, packed documents (documents shorter than a chunk, single-token ones,
    one spanning every rank), sliding windows (1, shorter and longer than a chunk, longer
    than the sequence) and documents with a window. Spawns the ranks once (gloo on CPU, NCCL
    on GPUs), compares the forward output and dQ/dK/dV with a float64 reference under the
    same mask, prints a table and exits 1 on any mismatch. Under torchrun (or srun) the
    launched processes are the world and rank 0 prints. --dtype defaults to float32 on CPU,
    bfloat16 on CUDA.
    """
    dev = resolve_device(device)  # first: it starts the CPU ranks' forkserver (bench/pool.py)
    import torch  # noqa: PLC0415

    from cpbench.app.verify import run_verify  # noqa: PLC0415
    from cpbench.bench.launch import launched_rank  # noqa: PLC0415

    launch = launched_rank()
    if world_size is not None:
        n = world_size
    elif launch is not None:  # torchrun / srun: the launched world
        n = launch.world_size
    else:
        n = torch.cuda.device_count() if dev == "cuda" else 4
    records = run_verify(
        n,
        dev,
        dtype or DEFAULT_DTYPE[dev],
        kernel,
        impl=impl,
        masks=masks,
        cp_comms=CP_COMM_CHOICES[cp_comm],
        inference=inference,
    )
    failed = [r for r in records if r.passed is False]
    if launch is not None and launch.rank != 0:
        pass  # rank 0 prints; every rank exits with the same code
    elif as_json:
        print(
            json.dumps(
                {
                    "world_size": n,
                    "device": dev,
                    "impl": impl,
                    "cases": [r.to_dict() for r in records],
                    "passed": not failed,
                },
                indent=1,
            )
        )
    else:
        trained = [r for r in records if r.inference is None]
        for renderable in verify_tables(trained, n, dev, impl):
            console.print(renderable, highlight=False)
        if inference:
            console.print(_prefill_table([r for r in records if r.inference is not None]))
    if failed:
        raise typer.Exit(EXIT_WRONG_RESULT)


def _inference_kind(row: VerifyRow) -> str:
    """A prefill record's scheme and new-token layout, a decode record's cache layout and merge."""
    return " ".join(k for k in (row.scheme, row.new_token_layout, row.merge) if k is not None)


def _prefill_table(records: list[VerifyRow]) -> Table:
    """One row per prefill scheme and new-token layout, and per decode cache layout and merge:
    cases passed, the largest max |out - reference| (absolute) and its bound, and whether
    every case's bytes sent equal the analytic bytes."""
    table = Table(title="inference: prefill with a cached prefix, decode (forward, vs float64)")
    for name in ("scheme", "passed", "max abs error", "its bound", "bytes = analytic"):
        table.add_column(name)
    for name in dict.fromkeys(_inference_kind(r) for r in records):
        rows = [r for r in records if _inference_kind(r) == name]
        worst = max(rows, key=lambda r: float("inf") if r.max_error is None else r.max_error)
        error = float("nan") if worst.max_error is None else worst.max_error
        tolerance = float("nan") if worst.tolerance is None else worst.tolerance
        table.add_row(
            name,
            f"{sum(bool(r.passed) for r in rows)}/{len(rows)}",
            f"{error:.2e}" if worst.error is None else worst.error,
            f"{tolerance:.2e}",
            "yes" if all(r.bytes_match for r in rows) else "no",
        )
    return table
