"""`cpbench plan`: a thin typer wrapper registered on `cpbench.cli.common.app`; the work is in
`cpbench.app.plan`, the output in `cpbench.render.plan`."""

from __future__ import annotations

from cpbench.cli import options as o
from cpbench.cli.common import command, emit, options_request


@command
def plan(
    model: o.Model,
    seq_len: o.SeqLen,
    gpus: o.Gpus,
    gpus_per_node: o.GpusPerNode = None,
    hardware: o.Hardware = None,
    recompute: o.RecomputeOption = None,
    zero: o.Zero = 1,
    micro_batch: o.MicroBatch = 1,
    global_batch: o.GlobalBatch = None,
    dtype: o.DtypeName = o.DEFAULTS["dtype"],
    kernel: o.KernelName = o.DEFAULTS["kernel"],
    tp: o.TpOrNone = None,
    cp: o.CpOrNone = None,
    pp: o.PpOrNone = None,
    matmul_efficiency: o.MatmulEfficiencyOption = None,
    reserve_gib: o.ReserveGib = None,
    framework: o.FrameworkOption = "cpbench",
    attention_factor: o.AttentionFactor = None,
    linears: o.Linears = "bf16",
    fabric: o.FabricOption = None,
    memory_margin: o.MemoryMarginOption = "capacity",
    max_seq_len: o.MaxSeqLen = False,
    lengths: o.Lengths = None,
    seed: o.Seed = 0,
    top: o.Top = 10,
    exhaustive: o.Exhaustive = False,
    as_json: o.Json = False,
) -> None:
    """Plan a whole model's training: does it fit at --seq-len on --gpus, with which
    TP x CP (Ulysses x Ring, layout) x PP x DP and recompute, and how long a step takes.

    Unlike `recommend` (which ranks the U x R meshes of one attention layer at a given CP
    degree, from heads and KV heads), `plan` takes a model and counts everything a rank holds:
    weights, gradients, Adam states (ZeRO), activations per layer (Korthikanti et al. 2022),
    pipeline micro-batches in flight, the CP scheme's buffers and the logits. It prints the
    feasible plans by step time with attention's share, the rejected ones with the
    overflowing component, the shortest CP that fits, the longest sequence each plan holds,
    and the winner's Megatron-LM, torchtitan and DeepSpeed settings.

    With --lengths the documents of a length distribution are packed into each sequence and
    attention is priced under their document mask, against the same search on one sequence
    (docs/dynamic-cp.md).
    """
    from cpbench.app import plan as service  # noqa: PLC0415 - keep `cpbench --help` fast
    from cpbench.config.problem import check_choice  # noqa: PLC0415
    from cpbench.model.plan.framework import FRAMEWORKS, LINEAR_PRECISIONS  # noqa: PLC0415
    from cpbench.model.plan.memory import MEMORY_MARGINS, check_recompute  # noqa: PLC0415

    request = options_request(
        service.PlanRequest,
        locals(),
        recompute=check_recompute(recompute) if recompute is not None else None,
        keep=max(top, 0),
        framework=check_choice("framework", framework, FRAMEWORKS),
        linears=check_choice("linear precision", linears, LINEAR_PRECISIONS),
        memory_margin=check_choice("memory margin", memory_margin, MEMORY_MARGINS),
        rank_by="max_seq_len" if max_seq_len else "step",
    )
    if top < 0:
        from cpbench.errors import CpbenchError  # noqa: PLC0415

        raise CpbenchError(f"top must be >= 0 (0 lists all), got {top}")
    result = service.plan_training(request)
    from cpbench.render import plan as render  # noqa: PLC0415  (keeps start-up light)

    emit(service.plan_report(result).model_dump(mode="json") if as_json else None, as_json,
         lambda: render.render_plan(result, top))  # fmt: skip
