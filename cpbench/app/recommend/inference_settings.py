"""The serving settings of `recommend --inference`: how vLLM and SGLang express the recommended
prefill scheme or decode sharding, or that they cannot: docs/inference.md, "Serving settings"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpbench.config.problem import CpProblem

VLLM_DOCS = "https://docs.vllm.ai/en/latest/configuration/engine_args.html (parallel config)"
VLLM_PCP_DESIGN = "https://github.com/vllm-project/vllm/issues/25749"
SGLANG_PREFILL_DOCS = "https://docs.sglang.io/docs/advanced_features/prefill_cp"
SGLANG_DECODE_DOCS = "https://docs.sglang.io/docs/advanced_features/dcp"

PREFILL_EXPRESSES = {"vLLM": ("all_gather",), "SGLang": ("all_gather",)}
"""The prefill schemes each framework's context parallelism runs (its only one)."""


def serving_settings(
    decode: bool,
    winner: Mapping[str, Any] | None,
    gpus: int,
    shape: CpProblem,
    cached_len: int,
) -> list[dict[str, Any]]:
    """One row per framework: the flags that run the winner, or `expressible: False` with
    what the framework runs instead and why it cannot run the winner."""
    if winner is None:
        return []
    world = int(winner["world"])
    if decode:
        return _decode_rows(world, gpus, shape)
    return _prefill_rows(str(winner["scheme"]), world, gpus, cached_len)


def _prefill_rows(scheme: str, world: int, gpus: int, cached_len: int) -> list[dict[str, Any]]:
    replicas = max(1, gpus // world)
    if world == 1:
        return [
            _row("vLLM", True, "(no context parallelism: --prefill-context-parallel-size 1)",
                 "one GPU per prefill is the fastest here", VLLM_DOCS),
            _row("SGLang", True, "(no context parallelism: --attn-cp-size 1)",
                 "one GPU per prefill is the fastest here", SGLANG_PREFILL_DOCS),
        ]  # fmt: skip
    cache_note = (
        f"; with a {cached_len}-token cache the gathered K/V include the cache shards"
        if cached_len
        else ""
    )
    rows = []
    # cpbench prices every head on every rank: no TP inside the CP group; the GPUs left over
    # serve other requests as data-parallel replicas
    dp = f" --data-parallel-size {replicas}" if replicas > 1 else ""
    vllm_flags = f"--tensor-parallel-size 1 --prefill-context-parallel-size {world}{dp}"
    sglang_flags = f"--tp-size {world} --attn-cp-size {world} --enable-prefill-cp" + (
        f" --dp-size {replicas}" if replicas > 1 else ""
    )
    for framework, flags, docs in (
        ("vLLM", vllm_flags, f"{VLLM_DOCS}; design {VLLM_PCP_DESIGN}"),
        ("SGLang", sglang_flags, SGLANG_PREFILL_DOCS),
    ):
        if scheme in PREFILL_EXPRESSES[framework]:
            rows.append(_row(framework, True, flags, f"all-gathers K/V{cache_note}", docs))
        else:
            row = _row(
                framework,
                False,
                f"cannot express {scheme}: its prefill CP only all-gathers K/V; nearest: {flags}",
                "no option selects a K/V ring, pass-Q or Ulysses",
                docs,
            )
            rows.append(row | {"runs_instead": "all_gather"})
    return rows


def _decode_rows(world: int, gpus: int, shape: CpProblem) -> list[dict[str, Any]]:
    if world == 1:
        return [
            _row("vLLM", True, "(no decode context parallelism: --decode-context-parallel-size 1)",
                 "the unsharded cache is the fastest here", VLLM_DOCS),
            _row("SGLang", True, "(no decode context parallelism: --dcp-size 1)",
                 "the unsharded cache is the fastest here", SGLANG_DECODE_DOCS),
        ]  # fmt: skip
    replicas = gpus // world
    dp = f" --data-parallel-size {replicas}" if replicas > 1 else ""
    vllm = _row(
        "vLLM",
        True,
        f"--tensor-parallel-size {world} --decode-context-parallel-size {world} "
        f"--cp-kv-cache-interleave-size 1{dp}",
        f"DCP runs inside the TP group (TP a multiple of DCP); TP = DCP = {world} gives every "
        f"rank all heads and a {world}-th of each cache, as priced; interleave 1 is cpbench's "
        f"interleaved layout (a larger stripe, e.g. the block size, keeps blocks whole)",
        VLLM_DOCS,
    )
    sglang = _row(
        "SGLang",
        False,
        f"cannot express a sharded GQA/MHA cache ({shape.heads}/{shape.kv_heads} heads): "
        f"--dcp-size {world} is the MLA path only",
        "SGLang's DCP stripes an MLA KV cache (position p on rank p mod N)",
        SGLANG_DECODE_DOCS,
    )
    return [vllm, sglang]


def _row(framework: str, expressible: bool, settings: str, note: str, docs: str) -> dict[str, Any]:
    return {
        "framework": framework,
        "expressible": expressible,
        "settings": settings,
        "note": note,
        "docs": docs,
    }
