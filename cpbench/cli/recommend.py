"""`cpbench recommend`: a thin typer wrapper registered on `cpbench.cli.common.app`; the work
is in `cpbench.app.recommend`, the output in `cpbench.render.recommend`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cpbench.cli import options as o
from cpbench.cli.common import command, console, emit, options_request
from cpbench.config.vocabulary import CP_COMM_CHOICES, CpComm, CpCommChoice
from cpbench.render.recommend.screen import render_recommendation


@command
def recommend(
    heads: o.Heads,
    kv_heads: o.KvHeads,
    seq_len: o.SeqLen = 131072,
    head_dim: o.HeadDim = 128,
    batch: o.Batch = o.DEFAULTS["batch"],
    gpus: o.Gpus = 8,
    gpus_per_node: o.GpusPerNode = None,
    hardware: o.Hardware = None,
    dtype: o.DtypeName = o.DEFAULTS["dtype"],
    causal: o.Causal = o.DEFAULTS["causal"],
    documents: o.Documents = None,
    window: o.WindowOption = None,
    seed: o.Seed = 0,
    tp: o.Tp = 1,
    pp: o.Pp = 1,
    cp: o.CpOrNone = None,
    grad_accum: o.GradAccum = 1,
    phase: o.PhaseChoice = o.DEFAULTS["phase"],
    results: o.Results = None,
    top: o.Top = 10,
    cp_comm: o.CpCommOrNone = None,
    write_scenario: o.WriteScenario = None,
    explain: o.Explain = False,
    inference: o.Inference = False,
    prompt_len: o.PromptLen = None,
    prompt_lens: o.PromptLens = None,
    cached_len: o.CachedLen = 0,
    decode_batch: o.DecodeBatch = None,
    layers: o.Layers = None,
    kv_memory_gib: o.KvMemoryGib = None,
    kernel: o.KernelName = o.DEFAULTS["kernel"],
    lengths: o.Lengths = None,
    tokens_per_rank: o.TokensPerRank = 8192,
    static_cp: o.StaticCp = None,
    step_tokens: o.StepTokens = None,
    as_json: o.Json = False,
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

    With --lengths it ranks dynamic-CP policies for a batch of whole sequences instead
    (docs/dynamic-cp.md): static CP, Megatron's dynamic-CP rule and cpbench's scheduler by
    predicted step, the speedup over static CP, and Megatron's flags.

    With --inference it ranks a serving request instead (docs/inference.md): prefill schemes
    and degrees by TTFT (--prompt-len T new tokens on --cached-len P cached), or with
    --decode-batch the sharded-cache decode by per-token latency; the pass-KV / pass-Q
    crossover, the KV capacity and the vLLM / SGLang settings. With --prompt-lens (a
    distribution of prompt lengths) it gives each request the CP degree of the least TTFT,
    against static CP and no CP (docs/dynamic-cp.md).
    """
    from cpbench.app import recommend as service  # noqa: PLC0415 - keep `cpbench --help` fast
    from cpbench.errors import CpbenchError  # noqa: PLC0415

    # an option of the other kind of step, given a value of its own, has no meaning here
    # (recommend's --seed draws --documents, its --phase is a training step's)
    given = o.other_kind_given(
        recommend, locals(), "inference" if inference else "training", also=("seed", "phase")
    )
    if prompt_lens is not None:
        if not inference:
            raise CpbenchError("--prompt-lens needs --inference (it is a distribution of "
                               "serving requests' prompt lengths)")
        given = [f for f in given if f != "--seed"]  # --seed draws the prompt lengths
    dynamic = {"tokens_per_rank": tokens_per_rank != 8192, "static_cp": static_cp is not None,
               "step_tokens": step_tokens is not None}  # fmt: skip
    if lengths is None and any(dynamic.values()):
        raise CpbenchError(
            f"{', '.join(o.flag(n, None) for n, v in dynamic.items() if v)} need --lengths (they "
            f"describe a batch of whole sequences)"
        )
    if lengths is not None:
        if inference or documents is not None:
            raise CpbenchError(
                "--lengths ranks a training batch of whole sequences: leave out "
                + ("--inference" if inference else "--documents (a packed sequence)")
            )
        step_flags = [*o.other_kind_given(recommend, locals(), "inference"),
                      *o.other_kind_given(recommend, locals(), "training")]  # fmt: skip
        if step_flags:
            raise CpbenchError(
                f"{', '.join(step_flags)}: not used with --lengths (the batch's sequences are "
                f"its lengths, each group's mesh is the policy's): leave them out"
            )
        _dynamic_recommend(locals(), as_json)
        return
    if inference:
        if given:
            raise CpbenchError(
                f"{', '.join(given)}: training option(s), not modelled for serving (the "
                f"request is --prompt-len T new tokens on --cached-len P): leave them out with "
                f"--inference"
            )
        _serving_recommend(locals(), explain, as_json)
        return
    if given:
        raise CpbenchError(f"{', '.join(given)} need --inference (they describe a serving request)")
    request = options_request(
        service.RecommendRequest, locals(), results=tuple(results or ()), cp_comms=cp_comms(cp_comm)
    )
    rec = service.recommend_mesh(request)
    written = service.write_tie_scenario(rec, write_scenario) if write_scenario else None
    if as_json:
        report = service.recommendation_report(rec)
        report["scenario_written"] = str(written) if written else None
        print(json.dumps(report, indent=1))
        return
    for renderable in render_recommendation(rec, explain):
        console.print(renderable)
    if written:
        console.print(f"wrote {written}: measure it with `cpbench sweep {written}`",
                      markup=False, highlight=False)


def cp_comms(cp_comm: CpCommChoice | None) -> tuple[CpComm, ...] | None:
    """The request's `cp_comms` of a --cp-comm choice (None: the request's default)."""
    return None if cp_comm is None else CP_COMM_CHOICES[cp_comm]


def _serving_recommend(options: Mapping[str, Any], explain: bool, as_json: bool) -> None:
    """`recommend --inference`: the serving service, rendered or as JSON."""
    from cpbench.app.recommend.inference import (  # noqa: PLC0415
        InferenceRequest,
        inference_report,
        recommend_inference,
    )
    from cpbench.errors import CpbenchError  # noqa: PLC0415
    from cpbench.render.recommend.inference import render_inference  # noqa: PLC0415

    if options["prompt_lens"] is not None:
        _policy_recommend(options, as_json)
        return
    if options["prompt_len"] is None:
        raise CpbenchError("--inference needs --prompt-len T (the new tokens of the turn, >= 1)")
    rec = recommend_inference(options_request(InferenceRequest, options))
    report = inference_report(rec) if as_json else None
    emit(report, as_json, lambda: render_inference(rec, explain))


def _dynamic_recommend(options: Mapping[str, Any], as_json: bool) -> None:
    """`recommend --lengths`: the dynamic-CP service, rendered or as JSON."""
    from cpbench.app.recommend.dynamic import (  # noqa: PLC0415
        DynamicRequest,
        dynamic_report,
        recommend_policies,
    )
    from cpbench.render.recommend.dynamic import render_dynamic  # noqa: PLC0415

    rec = recommend_policies(options_request(DynamicRequest, options))
    report = dynamic_report(rec).model_dump(mode="json") if as_json else None
    emit(report, as_json, lambda: render_dynamic(rec))


def _policy_recommend(options: Mapping[str, Any], as_json: bool) -> None:
    """`recommend --inference --prompt-lens`: the serving policy over a distribution of prompt
    lengths, rendered or as JSON."""
    from cpbench.app.recommend.inference import (  # noqa: PLC0415
        InferenceRequest,
        serving_policy,
        serving_policy_report,
    )
    from cpbench.errors import CpbenchError  # noqa: PLC0415
    from cpbench.render.recommend.inference import render_serving_policy  # noqa: PLC0415

    if options["prompt_len"] is not None:
        raise CpbenchError("--prompt-len is one request, --prompt-lens a distribution of them: "
                           "give one of the two")
    request = options_request(InferenceRequest, options, prompt_len=1)  # the sample's longest
    policy = serving_policy(request, options["prompt_lens"], options["seed"])
    emit(serving_policy_report(policy) if as_json else None, as_json,
         lambda: render_serving_policy(policy))  # fmt: skip
