"""The serving settings of `recommend --inference`: how vLLM and SGLang express the recommended
prefill scheme or decode sharding, or that they cannot: docs/inference.md, "Serving settings"."""

from __future__ import annotations

from dataclasses import dataclass

from cpbench.app.recommend.frameworks import ServingFramework, framework_table
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
    """What to know about the setting."""
    docs: str
    """Where the framework documents it."""
    runs_instead: str | None = None
    """The scheme it runs instead of the winner's, if it cannot run the winner's."""


def serving_settings(
    decode: bool, scheme: str, world: int, gpus: int, shape: CpProblem, cached_len: int
) -> tuple[ServingSetting, ...]:
    """One row per framework for the winner (`scheme` on `world` GPUs): the flags that run
    it, or `expressible: False` with what the framework runs instead and why."""
    if decode:
        return _decode_rows(world, gpus, shape)
    return _prefill_rows(scheme, world, gpus, cached_len)


def _frameworks() -> tuple[ServingFramework, ServingFramework]:
    serving = framework_table().serving
    return serving.vllm, serving.sglang


def _prefill_rows(
    scheme: str, world: int, gpus: int, cached_len: int
) -> tuple[ServingSetting, ...]:
    replicas = max(1, gpus // world)
    notes = framework_table().serving.notes
    if world == 1:
        return tuple(ServingSetting(f.name, True, f.prefill_one, notes.prefill_one, f.docs)
                     for f in _frameworks())  # fmt: skip
    cache_note = notes.cache.format(cached_len=cached_len) if cached_len else ""
    rows = []
    for f in _frameworks():
        # cpbench prices every head on every rank: no TP inside the CP group; the GPUs left
        # over serve other requests as data-parallel replicas
        flags = f.prefill.format(world=world) + (
            f.prefill_replicas.format(replicas=replicas) if replicas > 1 else ""
        )
        docs = f"{f.docs}; design {f.design}" if f.design else f.docs
        if scheme in f.prefill_schemes:
            note = notes.all_gather.format(cache=cache_note)
            rows.append(ServingSetting(f.name, True, flags, note, docs))
        else:
            settings = notes.cannot_prefill.format(scheme=scheme, flags=flags)
            note = notes.cannot_prefill_note
            rows.append(ServingSetting(f.name, False, settings, note, docs, "all_gather"))
    return tuple(rows)


def _decode_rows(world: int, gpus: int, shape: CpProblem) -> tuple[ServingSetting, ...]:
    notes = framework_table().serving.notes
    if world == 1:
        return tuple(
            ServingSetting(f.name, True, f.decode_one, notes.decode_one, f.decode_docs or f.docs)
            for f in _frameworks()
        )
    replicas = gpus // world
    rows = []
    for f in _frameworks():
        docs = f.decode_docs or f.docs
        flags = f.decode.format(world=world)
        if f.decode_gqa:
            flags += f.decode_replicas.format(replicas=replicas) if replicas > 1 else ""
            note = f.decode_note.format(world=world)
            rows.append(ServingSetting(f.name, True, flags, note, docs))
        else:
            settings = notes.cannot_decode.format(heads=shape.heads, kv_heads=shape.kv_heads, flags=flags)
            rows.append(ServingSetting(f.name, False, settings, f.decode_note, docs))
    return tuple(rows)

