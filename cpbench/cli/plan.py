"""`cpbench plan`: a thin typer wrapper registered on `cpbench.cli.common.app`; the work is in
`cpbench.app.plan`, the output in `cpbench.render.plan`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cpbench.cli.common import command, console


@command
def plan(
    model: Annotated[
        str,
        typer.Option(
            help=(
                "Model: a preset (llama3-8b, llama3-70b, llama3.1-405b, qwen2.5-7b, "
                "qwen2.5-72b, mistral-7b), a model TOML of the same keys, or a Hugging Face "
                "config.json (read offline)."
            )
        ),
    ],
    seq_len: Annotated[int, typer.Option(help="Sequence length L in tokens.")],
    gpus: Annotated[int, typer.Option(help="GPUs in total.")],
    gpus_per_node: Annotated[
        int | None, typer.Option(help="GPUs per node (default: the hardware profile's).")
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="Hardware profile: a built-in name (h100-sxm, h200-sxm, a100-80gb, l40s-pcie, "
            "cpu-local) or a TOML file. Default: h100-sxm."
        ),
    ] = None,
    recompute: Annotated[
        str | None,
        typer.Option(
            help="Activation recompute: none, selective or full (default: search them)."
        ),
    ] = None,
    zero: Annotated[
        int,
        typer.Option(
            help="ZeRO stage over DP x CP: 0, 1 (Megatron's distributed optimizer), 2, 3 (FSDP)."
        ),
    ] = 1,
    micro_batch: Annotated[int, typer.Option(help="Sequences per micro-batch.")] = 1,
    global_batch: Annotated[
        int | None,
        typer.Option(help="Sequences per optimizer step (default: one per GPU)."),
    ] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    kernel: Annotated[
        str, typer.Option(help="Attention kernel (auto, flash_attn, flash_attn3, cudnn, ...).")
    ] = "auto",
    tp: Annotated[int | None, typer.Option(help="Only this TP size (default: search).")] = None,
    cp: Annotated[int | None, typer.Option(help="Only this CP size (default: search).")] = None,
    pp: Annotated[int | None, typer.Option(help="Only this PP size (default: search).")] = None,
    matmul_efficiency: Annotated[
        float | None,
        typer.Option(help="GEMM efficiency (achieved / peak) instead of the profile's estimate."),
    ] = None,
    reserve_gib: Annotated[
        float | None,
        typer.Option(help="Memory kept free per GPU, GiB (default: 2 on a GPU, 0 on CPU)."),
    ] = None,
    framework: Annotated[
        str,
        typer.Option(help="Price the attention the framework runs: cpbench (own schemes), "
                     "torchtitan (PyTorch context_parallel: ring, all-gather K/V, SDPA), megatron "
                     "(TransformerEngine: p2p / a2a / a2a+p2p, cuDNN), deepspeed (Ulysses)."),
    ] = "cpbench",
    attention_factor: Annotated[
        float | None,
        typer.Option(help="Measured attention time of the framework / the cost model's (from a "
                     "`cpbench sweep` over the impl axis); default: the framework's prior."),
    ] = None,
    linears: Annotated[
        str, typer.Option(help="Precision of the linear layers: bf16 or fp8 (attention stays "
                          "in --dtype).")
    ] = "bf16",
    fabric: Annotated[
        str | None,
        typer.Option(help="How the nodes are wired: hgx-rail (8-GPU nodes, 400 Gb/s per GPU, "
                     "rail-optimised), roce-clos (not rail-optimised), nvl72 (72-GPU NVLink "
                     "domains); default: the hardware profile's inter-node link."),
    ] = None,
    memory_margin: Annotated[
        str,
        typer.Option(help="What a plan must fit: capacity (tensors + --reserve-gib within the "
                     "device memory) or safe (tensors within 80% of it: Fujii et al. 2024 saw no "
                     "OOM below that over 454 runs)."),
    ] = "capacity",
    max_seq_len: Annotated[
        bool,
        typer.Option("--max-seq-len", help="Rank the plans by the longest sequence each holds "
                     "under the safe margin (then by step time) instead of by step time."),
    ] = False,
    top: Annotated[
        int,
        typer.Option(help="Plans and memory rejections to rank and list (0 = all: every plan "
                     "that fits is priced, which takes minutes past a few hundred GPUs)."),
    ] = 10,
    exhaustive: Annotated[
        bool,
        typer.Option(help="Price every plan that fits instead of pruning the ones whose lower "
                     "bound cannot rank (the same answer, slower; for checking)."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
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
    """
    from cpbench.app import plan as service  # noqa: PLC0415 - keep `cpbench --help` fast
    from cpbench.config.problem import check_choice  # noqa: PLC0415
    from cpbench.model.plan.framework import FRAMEWORKS, LINEAR_PRECISIONS  # noqa: PLC0415
    from cpbench.model.plan.memory import MEMORY_MARGINS, check_recompute  # noqa: PLC0415

    request = service.PlanRequest(
        model=model,
        seq_len=seq_len,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        hardware=hardware,
        recompute=check_recompute(recompute) if recompute is not None else None,
        zero=zero,
        micro_batch=micro_batch,
        global_batch=global_batch,
        dtype=dtype,
        kernel=kernel,
        tp=tp,
        cp=cp,
        pp=pp,
        matmul_efficiency=matmul_efficiency,
        reserve_gib=reserve_gib,
        keep=max(top, 0),
        framework=check_choice("framework", framework, FRAMEWORKS),
        attention_factor=attention_factor,
        linears=check_choice("linear precision", linears, LINEAR_PRECISIONS),
        fabric=fabric,
        memory_margin=check_choice("memory margin", memory_margin, MEMORY_MARGINS),
        rank_by="max_seq_len" if max_seq_len else "step",
        exhaustive=exhaustive,
    )
    if top < 0:
        from cpbench.errors import CpbenchError  # noqa: PLC0415

        raise CpbenchError(f"top must be >= 0 (0 lists all), got {top}")
    report = service.to_json(service.plan_training(request))
    if as_json:
        print(json.dumps(report, indent=1))
        return
    from cpbench.render import plan as render  # noqa: PLC0415  (keeps start-up light)

    for renderable in render.render_plan(report, top):
        console.print(renderable)
