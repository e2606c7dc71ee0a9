"""The serving settings of `recommend --inference`: how vLLM and SGLang express the recommended
prefill scheme or decode sharding, or that they cannot: docs/inference.md, "Serving settings"."""

from __future__ import annotations

from dataclasses import dataclass

from cpbench.app.recommend.frameworks import ServingFramework, ServingNotes, framework_table
from cpbench.config.problem import CpProblem


@dataclass(frozen=True)
class ServingSetting:
    """How one serving framework runs the winner, or what it runs instead."""

    framework: str
    """vLLM or SGLang."""
    expressible: bool
    """Whether its flags run the winner."""
    settings: str
    """The flags, or why it cannot and what it runs."""
    note: str
    docs: str
    """Where the framework documents it."""
    runs_instead: str | None = None
    """The scheme it runs instead of the winner's, if it cannot run the winner's."""


def serving_settings(
    decode: bool, scheme: str, world: int, gpus: int, shape: CpProblem, cached_len: int
) -> tuple[ServingSetting, ...]:
    """One row per framework for the winner (`scheme` on `world` GPUs): the flags that run
    it, or `expressible: False` with what the framework runs instead and why."""
    serving = framework_table().serving
    # cpbench prices every head on every rank: no TP inside the CP group; the GPUs left over
    # serve other requests as data-parallel replicas
    replicas = max(1, gpus // world)
    return tuple(
        _decode_row(f, serving.notes, world, replicas, shape)
        if decode
        else _prefill_row(f, serving.notes, scheme, world, replicas, cached_len)
        for f in (serving.vllm, serving.sglang)
    )


def _with_replicas(flags: str, template: str, replicas: int) -> str:
    return flags + (template.format(replicas=replicas) if replicas > 1 else "")


def _prefill_row(
    f: ServingFramework, notes: ServingNotes, scheme: str, world: int, replicas: int,
    cached_len: int,
) -> ServingSetting:  # fmt: skip
    if world == 1:
        return ServingSetting(f.name, True, f.prefill_one, notes.prefill_one, f.docs)
    flags = _with_replicas(f.prefill.format(world=world), f.prefill_replicas, replicas)
    docs = f"{f.docs}; design {f.design}" if f.design else f.docs
    if scheme in f.prefill_schemes:
        cache = notes.cache.format(cached_len=cached_len) if cached_len else ""
        return ServingSetting(f.name, True, flags, notes.all_gather.format(cache=cache), docs)
    settings = notes.cannot_prefill.format(scheme=scheme, flags=flags)
    return ServingSetting(f.name, False, settings, notes.cannot_prefill_note, docs, "all_gather")


def _decode_row(
    f: ServingFramework, notes: ServingNotes, world: int, replicas: int, shape: CpProblem
) -> ServingSetting:
    docs = f.decode_docs or f.docs
    if world == 1:
        return ServingSetting(f.name, True, f.decode_one, notes.decode_one, docs)
    flags = f.decode.format(world=world)
    if not f.decode_gqa:
        heads, kv_heads = shape.heads, shape.kv_heads
        settings = notes.cannot_decode.format(heads=heads, kv_heads=kv_heads, flags=flags)
        return ServingSetting(f.name, False, settings, f.decode_note, docs)
    flags = _with_replicas(flags, f.decode_replicas, replicas)
    return ServingSetting(f.name, True, flags, f.decode_note.format(world=world), docs)
