"""`cpbench recommend`, `cpbench calibrate` and `cpbench validate`: thin typer wrappers
registered on `cpbench.cli.common.app`; the work is in `cpbench.app.recommend` and
`cpbench.app.calibrate`, the output in `cpbench.render.recommend`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cpbench.cli.common import command, console, emit
from cpbench.config.vocabulary import CP_COMM_CHOICES, CpCommChoice, Phase, Split
from cpbench.render.recommend.calibration import (
    render_calibration,
    render_published,
    render_validation,
)
from cpbench.render.recommend.screen import render_recommendation

HardwareOption = Annotated[
    str | None,
    typer.Option(
        "--hardware",
        help=(
            "Hardware profile: a built-in name (h100-sxm, h200-sxm, a100-80gb, l40s-pcie, "
            "cpu-local) or a TOML file (e.g. written by `cpbench calibrate`). Default: h100-sxm, "
            "or cpu-local when the results are CPU runs."
        ),
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


@command
def recommend(
    heads: Annotated[int, typer.Option(help="Query heads h of the model.")],
    kv_heads: Annotated[int, typer.Option(help="KV heads h_kv (GQA when < heads).")],
    seq_len: Annotated[int, typer.Option(help="Global sequence length L in tokens.")] = 131072,
    head_dim: Annotated[int, typer.Option(help="Head dimension d_h.")] = 128,
    batch: Annotated[int, typer.Option(help="Micro-batch B (sequences per DP rank).")] = 1,
    gpus: Annotated[int, typer.Option(help="GPUs in total (world size).")] = 8,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(help="GPUs per node (default: the hardware profile's, 8 for GPUs)."),
    ] = None,
    hardware: HardwareOption = None,
    dtype: Annotated[
        str, typer.Option(help="Activation dtype: bfloat16, float16, float32 (bf16, fp16, fp32).")
    ] = "bfloat16",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Causal mask.")] = True,
    documents: Annotated[
        str | None,
        typer.Option(
            help=(
                "Packed documents: lengths (512,1024,...), a file of lengths (JSON or one per "
                "line) or a distribution (lognormal:mean=4096, ...), packed into --seq-len: "
                "ranks doc_zigzag and the balanced layout too."
            )
        ),
    ] = None,
    window: Annotated[
        int | None, typer.Option(help="Sliding window W: a query sees the last W keys.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of a --documents distribution.")] = 0,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size (splits the heads first).")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel size.")] = 1,
    cp: Annotated[
        int | None,
        typer.Option(help="Context-parallel size U x R (default: gpus / (TP x PP), DP = 1)."),
    ] = None,
    grad_accum: Annotated[
        int, typer.Option(help="Micro-batches per optimizer step (global batch formula).")
    ] = 1,
    phase: Annotated[
        Phase, typer.Option(help="Rank by forward only, or forward+backward (training).")
    ] = "fwd+bwd",
    results: Annotated[
        list[str] | None,
        typer.Option(
            "--results",
            help=(
                "JSONL results of `cpbench sweep` (repeatable): calibrate the profile on them; "
                "configurations they measured are ranked by measurement."
            ),
        ),
    ] = None,
    top: Annotated[int, typer.Option(help="Feasible candidates to list (0 = all).")] = 10,
    cp_comm: Annotated[
        CpCommChoice | None,
        typer.Option(
            help="How the ring axis may exchange K/V: both (ring hops and all-gather, the "
            "Llama 3 scheme, ranked side by side), p2p or all_gather only. Default: both, "
            "or with --results the ways the results measured.",
        ),
    ] = None,
    write_scenario: Annotated[
        str | None,
        typer.Option(
            "--write-scenario",
            metavar="PATH",
            help=(
                "Write a scenario TOML for `cpbench sweep` that measures exactly the tied "
                "leaders at this shape (a clear winner: it and the runner-up)."
            ),
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Every column, the full explanation and each framework's caveats "
            "(default: what fits one screen).",
        ),
    ] = False,
    inference: Annotated[
        bool,
        typer.Option(
            "--inference",
            help="Rank for serving instead: prefill schemes (pass-KV, pass-Q, all-gather, "
            "Ulysses) and CP degrees by TTFT, or with --decode-batch the sharded-cache decode "
            "by per-token latency; the pass-KV / pass-Q crossover, KV capacity, vLLM / SGLang "
            "settings.",
        ),
    ] = False,
    prompt_len: Annotated[
        int | None,
        typer.Option(help="--inference: new tokens T of the turn (the prompt, or its new part)."),
    ] = None,
    cached_len: Annotated[
        int, typer.Option(help="--inference: tokens P already in the KV cache (0: none).")
    ] = 0,
    decode_batch: Annotated[
        int | None,
        typer.Option(
            help="--inference: rank the decode step of this many sequences, each with P + T "
            "cached tokens, instead of the prefill."
        ),
    ] = None,
    layers: Annotated[
        int | None,
        typer.Option(help="--inference: attention layers (KV capacity; tokens/s)."),
    ] = None,
    kv_memory_gib: Annotated[
        float | None,
        typer.Option(
            help="--inference: GiB per GPU the KV cache may use (default: the device memory)."
        ),
    ] = None,
    kernel: Annotated[
        str, typer.Option(help="--inference: attention kernel priced (auto, flash_attn, ...).")
    ] = "auto",
    as_json: JsonOption = False,
) -> None:
    """Rank every U x R mesh of the CP degree and every layout by predicted step time.

    Prints the feasible candidates (time with its compute / imbalance / exposed-comm breakdown,
    bytes per link tier, memory per rank, longest sequence that fits), the rejected ones with
    the rule that rejects them, how sure the model is (every time carries its uncertainty:
    the calibration's residuals, a probe's fit error or the prior's stated accuracy; leaders
    within it are called a tie, and --write-scenario writes the sweep that measures them), why
    the winner wins, and the settings for Megatron-LM,
    DeepSpeed, yunchang and torchtitan. With --tp/--pp/--cp it also solves
    world = TP x CP x PP x DP. With --documents / --window the model is mask-aware: per-rank
    work of every layout (doc_zigzag and balanced included), padding, and the ring steps a
    window skips. Every mesh with a ring axis is also ranked all-gathered (U x A: K/V gathered
    in one stride, or one KV head per gather with the next in flight), with where it wins or
    loses against the ring and Ulysses.

    With --inference it ranks a serving request instead (docs/inference.md): prefill schemes
    and degrees by TTFT (--prompt-len T new tokens on --cached-len P cached), or with
    --decode-batch the sharded-cache decode by per-token latency; the pass-KV / pass-Q
    crossover, the KV capacity and the vLLM / SGLang settings.
    """
    from cpbench.app import recommend as service  # noqa: PLC0415 - keep `cpbench --help` fast

    serving = {"--prompt-len": prompt_len, "--decode-batch": decode_batch, "--layers": layers,
               "--kv-memory-gib": kv_memory_gib}  # fmt: skip
    if inference:
        # a training option given a value of its own (not its default) has no meaning here
        training_only = {"--results": results, "--documents": documents, "--window": window,
                         "--write-scenario": write_scenario, "--seq-len": seq_len != 131072,
                         "--no-causal": not causal, "--seed": seed != 0, "--tp": tp != 1,
                         "--pp": pp != 1, "--cp": cp, "--grad-accum": grad_accum != 1,
                         "--phase": phase != "fwd+bwd", "--cp-comm": cp_comm}  # fmt: skip
        _serving_recommend(
            {k: v for k, v in training_only.items() if v},
            service_args={
                "heads": heads, "kv_heads": kv_heads, "prompt_len": prompt_len,
                "cached_len": cached_len, "decode_batch": decode_batch, "head_dim": head_dim,
                "batch": batch, "gpus": gpus, "gpus_per_node": gpus_per_node,
                "hardware": hardware, "dtype": dtype, "kernel": kernel, "layers": layers,
                "kv_memory_gib": kv_memory_gib, "top": top,
            },
            explain=explain,
            as_json=as_json,
        )  # fmt: skip
        return
    given = [k for k, v in serving.items() if v is not None] + ["--cached-len"] * (cached_len != 0)
    if given:
        from cpbench.errors import CpbenchError  # noqa: PLC0415

        raise CpbenchError(f"{', '.join(given)} need --inference (they describe a serving request)")
    request = service.RecommendRequest(
        heads=heads,
        kv_heads=kv_heads,
        seq_len=seq_len,
        head_dim=head_dim,
        batch=batch,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        hardware=hardware,
        dtype=dtype,
        causal=causal,
        documents=documents,
        window=window,
        seed=seed,
        tp=tp,
        pp=pp,
        cp=cp,
        grad_accum=grad_accum,
        phase=phase,
        results=tuple(results or ()),
        top=top,
        cp_comms=None if cp_comm is None else CP_COMM_CHOICES[cp_comm],
    )
    rec = service.recommend_mesh(request)
    report = service.recommendation_report(rec)
    written = service.write_tie_scenario(rec, write_scenario) if write_scenario else None
    if as_json:
        report["scenario_written"] = str(written) if written else None
        print(json.dumps(report, indent=1))
        return
    for renderable in render_recommendation(report, explain):
        console.print(renderable)
    if written:
        console.print(f"wrote {written}: measure it with `cpbench sweep {written}`")


def _serving_recommend(
    training_only: dict[str, object], service_args: dict[str, object], explain: bool, as_json: bool
) -> None:
    """`recommend --inference`: the serving service, rendered or as JSON."""
    from cpbench.app.recommend.inference import InferenceRequest, recommend_inference  # noqa: PLC0415
    from cpbench.errors import CpbenchError  # noqa: PLC0415
    from cpbench.render.recommend.inference import render_inference  # noqa: PLC0415

    if training_only:
        raise CpbenchError(
            f"{', '.join(training_only)}: training option(s), not modelled for serving (the "
            f"request is --prompt-len T new tokens on --cached-len P): leave them out with "
            f"--inference"
        )
    if service_args["prompt_len"] is None:
        raise CpbenchError("--inference needs --prompt-len T (the new tokens of the turn, >= 1)")
    report = recommend_inference(InferenceRequest(**service_args))  # type: ignore[arg-type]
    emit(report, as_json, lambda: render_inference(report, explain))


@command
def calibrate(
    results: Annotated[
        list[str],
        typer.Argument(
            help="JSONL results files of `cpbench sweep`, or tables of measured step times "
            "(CSV or JSONL rows: shape, mask, mesh, layout, exchange, phase, dtype, GPU, step "
            "time; docs/cost-model.md)."
        ),
    ],
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="Write the fitted profile to this TOML file."),
    ] = None,
    hardware: HardwareOption = None,
    name: Annotated[
        str | None, typer.Option(help="Name of the fitted profile (default: PRIOR-calibrated).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fit a hardware profile to measured results (least squares).

    Link latency and busbw per collective kind and tier from the comm-only times, the kernel
    efficiency curve and step overhead from the compute-only times (when recorded), then one
    joint fit of kernel throughput, step overhead, links and overlap to every measured time,
    step times alone included (regularised toward the prior). Prints every parameter before
    and after, whether the data determine it or it stays at the prior, and the residual.
    """
    from cpbench.app import calibrate as service  # noqa: PLC0415

    report = service.calibrate_results(results, hardware, output, name)
    emit(report, as_json, lambda: [render_calibration(report)])


@command
def validate(
    results: Annotated[
        list[str] | None,
        typer.Argument(
            help="JSONL results files of `cpbench sweep`, or tables of measured step times "
            "(docs/cost-model.md); none with --published."
        ),
    ] = None,
    hardware: HardwareOption = None,
    holdout: Annotated[
        bool,
        typer.Option(
            "--holdout",
            help="Calibrate on part of the configurations, predict the held-out rest.",
        ),
    ] = False,
    holdout_fraction: Annotated[
        float,
        typer.Option(
            help="Share of the configurations held out (a value other than 0.5 implies --holdout)."
        ),
    ] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the holdout split.")] = 0,
    split: Annotated[
        Split,
        typer.Option(help="Holdout split: stratified by U x R mesh, or random."),
    ] = "stratified",
    calibrate_first: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="Calibrate on all the results first (in-sample check of the fit).",
        ),
    ] = False,
    published: Annotated[
        bool,
        typer.Option(
            "--published",
            help="Score the model on the shipped published measurements (per machine: the "
            "prior alone and leave-one-group-out calibrated; sources per row).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Predicted vs measured step time per configuration, with the median and max absolute
    percentage error, the Spearman rank correlation and the regret of the model's pick."""
    from cpbench.app import calibrate as service  # noqa: PLC0415
    from cpbench.errors import CpbenchError  # noqa: PLC0415

    if published:
        if results:
            raise CpbenchError(
                f"--published scores the shipped dataset: give no results files with it "
                f"(got {', '.join(results)})"
            )
        document = service.validate_published_report()
        emit(document, as_json, lambda: render_published(document))
        return
    if not results:
        raise CpbenchError("validate needs results files (or --published)")
    if holdout_fraction != 0.5 and not holdout:
        holdout = True
    report = service.validate_results(
        results, hardware, holdout, holdout_fraction, seed, split, calibrate_first
    )
    emit(report, as_json, lambda: render_validation(report))
