"""`recommend --write-scenario`: a scenario TOML (the keys of `cpbench.results.scenarios`)
that measures exactly the tied leaders at the requested shape, so `cpbench sweep` can settle
what the model cannot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from cpbench.app.recommend.types import RankedCandidate, Recommendation
from cpbench.config.vocabulary import canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.files import write_atomically


def scenario_candidates(rec: Recommendation) -> tuple[RankedCandidate, ...]:
    """What the scenario measures: the tied leaders; with a clear winner, the winner and the
    runner-up (a sweep that checks the call)."""
    if rec.tie is None:
        raise CpbenchError("no candidate is feasible, so there is no scenario to write")
    if rec.tie.clear and rec.tie.runner_up is not None:
        return (*rec.tie.tied, rec.tie.runner_up)
    return rec.tie.tied


def _exchange(r: RankedCandidate) -> dict[str, Any]:
    """mesh, layout, cp_comm and heads_k_stride of one candidate, as scenario axes."""
    c = r.prediction.candidate
    gather = c.ring > 1 and c.all_gather
    stride = c.heads_k_stride if gather else None
    return {
        "mesh": [f"{c.ulysses}x{c.ring}"],
        "layout": c.layout,
        "cp_comm": "all_gather" if gather else "p2p",
        "heads_k_stride": "none" if stride is None else stride,
    }


def candidates_scenario(rec: Recommendation, chosen: Sequence[RankedCandidate]) -> dict[str, Any]:
    """The scenario that measures exactly `chosen` of `rec`'s candidates, as a TOML-ready dict:
    [axes] at the requested shape (per TP rank) with the first candidate's mesh, layout and
    exchange, one [[also]] table per further candidate (so exactly those are measured, not a
    product), world size = the CP degree, device cuda on a GPU profile."""
    q, shape, mask = rec.request, rec.shape, rec.mask
    world = rec.sizes.cp
    per_node = rec.gpus_per_node
    nodes = world // per_node if world > per_node and world % per_node == 0 else 1
    axes: dict[str, Any] = {
        "seq_len": shape.seq_len,
        "batch": shape.batch,
        "heads": shape.heads,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "dtype": canonical_dtype(q.dtype),
        "causal": mask.causal,
        "phase": q.phase,
        "documents": (
            ",".join(str(n) for n in mask.documents)
            if mask.documents is not None and len(mask.documents) > 1
            else "none"
        ),
        "window": "none" if mask.window is None else mask.window,
        **_exchange(chosen[0]),
    }
    what = (
        f"the {len(chosen)} leaders that tie"
        if not rec.tie or not rec.tie.clear
        else "the winner and the runner-up"
    )
    return {
        "name": "recommend-tie",
        "description": f"written by cpbench recommend: measures {what} at the requested shape",
        "world_size": world,
        "device": "cuda" if rec.profile.device_kind == "cuda" else "cpu",
        "nodes": nodes,
        "axes": axes,
        "also": [_exchange(r) for r in chosen[1:]],
    }


def write_tie_scenario(rec: Recommendation, path: str | Path) -> Path:
    """Write the scenario of `scenario_candidates` as TOML to `path` (the folder must exist);
    the path written."""
    data = candidates_scenario(rec, scenario_candidates(rec))
    if not data["also"]:
        del data["also"]
    return write_atomically(path, tomli_w.dumps(data), "--write-scenario")
