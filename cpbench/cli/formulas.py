"""`cpbench formulas`: a thin typer wrapper around `cpbench.app.formulas`."""

from __future__ import annotations

from typing import Annotated

import typer

from cpbench.cli.common import command, emit
from cpbench.config.vocabulary import CpComm, Dtype, Layout


@command
def formulas(
    seq_len: Annotated[int, typer.Option(help="Global sequence length L in tokens.")] = 131072,
    heads: Annotated[int, typer.Option(help="Query heads h.")] = 32,
    kv_heads: Annotated[int, typer.Option(help="KV heads h_kv (GQA when < heads).")] = 8,
    head_dim: Annotated[int, typer.Option(help="Head dimension d_h.")] = 128,
    batch: Annotated[int, typer.Option(help="Micro-batch B.")] = 1,
    ulysses: Annotated[int, typer.Option(help="Ulysses degree U.")] = 1,
    ring: Annotated[int, typer.Option(help="Ring degree R.")] = 1,
    layout: Annotated[Layout, typer.Option(help="Token layout.")] = "zigzag",
    dtype: Annotated[Dtype, typer.Option(help="Activation dtype.")] = "bfloat16",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Causal mask.")] = True,
    documents: Annotated[
        str | None,
        typer.Option(
            help=(
                "Packed documents: lengths (512,1024,...), a file of lengths (JSON or one per "
                "line) or a distribution (lognormal:mean=1024, powerlaw:alpha=1.5,min=64, "
                "uniform:min=64,max=4096), packed into --seq-len."
            )
        ),
    ] = None,
    window: Annotated[
        int | None, typer.Option(help="Sliding window W: a query sees the last W keys.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of a --documents distribution.")] = 0,
    cp_comm: Annotated[
        CpComm,
        typer.Option(
            help="How the ring axis exchanges K/V: p2p (ring hops) or all_gather (the Llama 3 "
            "scheme: all-gather, backward reduce-scatter)."
        ),
    ] = "p2p",
    heads_k_stride: Annotated[
        int | None,
        typer.Option(
            help="all_gather: KV heads per gather (the next in flight); default all in one."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Print the analytic communication volumes (formula and value), FLOPs, per-rank causal
    work and imbalance, memory per rank and tensor shapes of one U x R configuration.

    With --documents and/or --window: the mask-aware work per rank, and every layout side by
    side (imbalance, padding, ring steps and the hops the window saves, bytes)."""
    from cpbench.app.formulas import formulas_report, mask_from_options  # noqa: PLC0415
    from cpbench.config.problem import CpProblem  # noqa: PLC0415
    from cpbench.render.formulas import render_formulas  # noqa: PLC0415

    mask = mask_from_options(seq_len, causal, documents, window, seed)
    problem = CpProblem(
        seq_len=seq_len, batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        dtype=dtype, ulysses=ulysses, ring=ring, layout=layout, cp_comm=cp_comm,
        heads_k_stride=heads_k_stride,
    ).masked(mask)
    report = formulas_report(problem)
    emit(report.model_dump(mode="json"), as_json, lambda: render_formulas(report))


