"""The work of every ring step of a configuration under its layout and mask, and the
memory-bound bytes of a step: docs/design.md section 2, "The time of one phase". Pure Python."""

from __future__ import annotations

import functools
from fractions import Fraction

from cpbench.config.constraints import seq_divisor
from cpbench.config.geometry import pack
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import GLOBAL_LAYOUTS, Layout, Pass
from cpbench.errors import CpbenchError
from cpbench.model.flops import LayoutWork, layout_work, plain_step_stats, ring_step_pairs

MERGE_FORWARD_PASSES = 7
"""fp32 passes over the output accumulator per forward merge (ring.py `_merge`)."""
ACCUMULATE_Q_PASSES = 3
"""fp32 passes over a Q-sized tensor per backward step (dQ += block dQ)."""
ACCUMULATE_KV_PASSES = 7
"""fp32 passes over a K/V-sized tensor per backward step (block dK/dV, received + block)."""
MAX_EXACT_RING = 64
"""Rings up to this size take their per-step work from flops.py's R x R step matrix; larger
ones the same values in closed form (`plain_step_stats`)."""


@functools.lru_cache(maxsize=4096)
def step_pair_stats(
    seq_len: int, ring: int, layout: str, causal: bool
) -> tuple[tuple[Fraction, Fraction], ...]:
    """(busiest ring rank, mean over ring ranks) pairs at each ring step, all heads of a ring
    group: from flops.py's step matrix for R <= MAX_EXACT_RING, else in closed form."""
    if ring <= MAX_EXACT_RING:
        return tuple(
            (max(step), sum(step, Fraction(0)) / ring)
            for step in ring_step_pairs(seq_len, ring, layout, causal)
        )
    return closed_form_step_pair_stats(seq_len, ring, layout, causal)


def closed_form_step_pair_stats(
    seq_len: int, ring: int, layout: str, causal: bool
) -> tuple[tuple[Fraction, Fraction], ...]:
    """flops.py's (busiest, mean) pairs per ring step in closed form (`plain_step_stats`)."""
    if layout not in GLOBAL_LAYOUTS:
        raise CpbenchError(
            f"layout {layout!r} has no closed form (one of {', '.join(GLOBAL_LAYOUTS)}): its "
            f"work comes from the mask geometry (mask_step_stats)"
        )
    return plain_step_stats(seq_len, ring, layout, causal)


@functools.lru_cache(maxsize=1024)
def config_work(config: CpProblem) -> LayoutWork:
    """The work of every ring rank and ring step of a configuration under its mask."""
    return layout_work(config)


def mask_step_stats(config: CpProblem) -> tuple[tuple[Fraction, Fraction], ...]:
    """(busiest ring rank, mean over ring ranks) pairs at each of the k ring steps the mask
    needs: `step_pair_stats` for causal or full attention on a global layout, otherwise the
    mask geometry's per-step pairs."""
    if config.plain_geometry:
        return step_pair_stats(config.seq_len, config.ring, config.layout, config.mask.causal)
    return config_work(config).step_stats


@functools.lru_cache(maxsize=1024)
def extra_calls(config: CpProblem) -> tuple[tuple[int, float], ...]:
    """(busiest ring rank, mean over ring ranks) kernel calls at each ring step beyond those of
    one document's schedule on the same mesh and layout (a zigzag one for doc_zigzag and
    balanced): the pieces a packed document mask or a window adds, each a launch, a slice and
    a merge (the profile's `call_overhead_s`). Empty for the closed forms (none added)."""
    if config.plain_geometry:
        return ()
    calls = config.packing.counts.calls
    layout: Layout = config.layout if config.layout in GLOBAL_LAYOUTS else "zigzag"
    one = pack(MaskSpec(causal=config.mask.causal), 2 * seq_divisor(config.ulysses, config.ring,
               layout), config.ulysses, config.ring, layout).counts.calls  # fmt: skip
    ring = config.ring
    out = []
    for t in range(config.packing.counts.steps):
        busiest = max(row[t] for row in calls) - max(row[t] for row in one)
        mean = (sum(row[t] for row in calls) - sum(row[t] for row in one)) / ring
        out.append((max(0, busiest), max(0.0, mean)))
    return tuple(out)


def merge_bytes(config: CpProblem, phase: Pass, step: int) -> int:
    """fp32 bytes the ring's merge (forward) or accumulation (backward) moves at a step."""
    if config.ring == 1:
        return 0
    q_elements = config.batch * config.ring_shard * config.heads_per_rank * config.head_dim
    kv_elements = 2 * config.batch * config.ring_shard * config.kv_heads_per_rank * config.head_dim
    if phase == "forward":
        return 0 if step == 0 else MERGE_FORWARD_PASSES * q_elements * 4
    return (ACCUMULATE_Q_PASSES * q_elements + ACCUMULATE_KV_PASSES * kv_elements) * 4
