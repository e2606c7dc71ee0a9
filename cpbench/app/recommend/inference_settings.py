"""The serving settings of `recommend --inference`: how vLLM and SGLang express the recommended
prefill scheme or decode sharding, or that they cannot: docs/inference.md, "Serving settings"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpbench.app.recommend.frameworks import ServingFramework, framework_table
from cpbench.config.problem import CpProblem


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


def _frameworks() -> tuple[ServingFramework, ServingFramework]:
    serving = framework_table().serving
    return serving.vllm, serving.sglang


def _prefill_rows(scheme: str, world: int, gpus: int, cached_len: int) -> list[dict[str, Any]]:
    replicas = max(1, gpus // world)
    notes = framework_table().serving.notes
    if world == 1:
        return [_row(f.name, True, f.prefill_one, notes.prefill_one, f.docs) for f in _frameworks()]
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
            rows.append(_row(f.name, True, flags, notes.all_gather.format(cache=cache_note), docs))
        else:
            settings = notes.cannot_prefill.format(scheme=scheme, flags=flags)
            row = _row(f.name, False, settings, notes.cannot_prefill_note, docs)
            rows.append(row | {"runs_instead": "all_gather"})
    return rows


def _decode_rows(world: int, gpus: int, shape: CpProblem) -> list[dict[str, Any]]:
    notes = framework_table().serving.notes
    if world == 1:
        return [
            _row(f.name, True, f.decode_one, notes.decode_one, f.decode_docs or f.docs)
            for f in _frameworks()
        ]
    replicas = gpus // world
    rows = []
    for f in _frameworks():
        docs = f.decode_docs or f.docs
        flags = f.decode.format(world=world)
        if f.decode_gqa:
            flags += f.decode_replicas.format(replicas=replicas) if replicas > 1 else ""
            rows.append(_row(f.name, True, flags, f.decode_note.format(world=world), docs))
        else:
            settings = notes.cannot_decode.format(heads=shape.heads, kv_heads=shape.kv_heads, flags=flags)
            rows.append(_row(f.name, False, settings, f.decode_note, docs))
    return rows


def _row(framework: str, expressible: bool, settings: str, note: str, docs: str) -> dict[str, Any]:
    return {
        "framework": framework,
        "expressible": expressible,
        "settings": settings,
        "note": note,
        "docs": docs,
    }
