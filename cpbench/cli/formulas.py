"""`cpbench formulas`: a thin typer wrapper around `cpbench.app.formulas`."""

from __future__ import annotations

from cpbench.cli import options as o
from cpbench.cli.common import command, emit


@command
def formulas(
    seq_len: o.SeqLen = 131072,
    heads: o.Heads = 32,
    kv_heads: o.KvHeads = 8,
    head_dim: o.HeadDim = 128,
    batch: o.Batch = o.DEFAULTS["batch"],
    ulysses: o.Ulysses = o.DEFAULTS["ulysses"],
    ring: o.Ring = o.DEFAULTS["ring"],
    layout: o.LayoutChoice = o.DEFAULTS["layout"],
    dtype: o.DtypeChoice = o.DEFAULTS["dtype"],
    causal: o.Causal = o.DEFAULTS["causal"],
    documents: o.Documents = None,
    window: o.WindowOption = None,
    seed: o.Seed = 0,
    cp_comm: o.CpCommOne = o.DEFAULTS["cp_comm"],
    heads_k_stride: o.HeadsKStride = None,
    as_json: o.Json = False,
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
