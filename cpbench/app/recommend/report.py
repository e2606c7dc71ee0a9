"""The JSON answer of `cpbench recommend --json` (and what the renderer reads)."""

from __future__ import annotations

from typing import Any

from cpbench.app.recommend.types import (
    TIME_CONVENTION,
    RankedCandidate,
    Recommendation,
    layout_label,
)
from cpbench.config.vocabulary import PHASE_PASSES
from cpbench.model.calibrate import (
    calibration_summary,
)
from cpbench.model.flops import FLOPS_CONVENTION
from cpbench.model.formulas import canonical_dtype


def _candidate_dict(position: int, r: RankedCandidate) -> dict[str, Any]:
    p = r.prediction
    c = p.config
    t = p.phase_time
    return {
        "rank": position,
        "ulysses": c.ulysses,
        "ring": c.ring,
        "layout": c.layout,
        "layout_matters": layout_label(p) != "any",
        "kv_replication": c.kv_replication,
        "scheme": c.scheme,
        "cp_comm": c.cp_comm if c.ring > 1 else "p2p",
        "heads_k_stride": c.heads_k_stride if c.all_gather else None,
        "gathers": c.gathers if c.all_gather else None,
        "label": r.label,
        "source": r.source,
        "record_id": r.record_id,
        "time_s": r.time_s,
        "measured_s": r.measured_s,
        "predicted_s": p.step_s,
        "compute_s": t.compute_s,
        "imbalance_s": t.imbalance_s,
        "exposed_comm_s": t.exposed_comm_s,
        "comm_s": t.comm_s,
        "forward_s": p.forward.total_s,
        "forward_backward_s": p.forward_backward.total_s,
        "bytes_per_tier": p.bytes_by_tier(PHASE_PASSES[p.candidate.phase]),
        "traffic": [
            {
                "tier": x.tier,
                "kind": x.kind,
                "forward_bytes": x.forward_bytes,
                "backward_bytes": x.backward_bytes,
            }
            for x in p.traffic
        ],
        "placement": p.placement.describe(),
        "ulysses_tier": p.placement.ulysses_tier,
        "ring_tier": p.placement.ring_tier,
        "work_imbalance": p.work_imbalance,
        "work_overhead": p.work_overhead,
        "slowest_ring_rank": p.slowest_ring_rank,
        "ring_steps": p.ring_steps,
        "padding_tokens": p.padding,
        "padding_fraction": p.padding_fraction,
        "kernel_seq_len": p.kernel_seq_len,
        "attention_tflops_per_rank": p.attention_tflops,
        "kernel": p.kernel,
        "efficiency_curve": p.curve_kernel,
        "curve_note": p.curve_note,
        "memory_bytes": p.memory_bytes,
        "memory_capacity_bytes": p.memory_capacity_bytes,
        "max_seq_len": p.max_seq_len,
    }


def recommendation_report(rec: Recommendation) -> dict[str, Any]:
    """The `--json` answer of `recommend`."""
    q, s = rec.request, rec.sizes
    listed = rec.ranked if q.top == 0 else rec.ranked[: q.top]
    return {
        "warnings": list(rec.warnings),
        "inputs": {
            "heads": q.heads,
            "kv_heads": q.kv_heads,
            "seq_len": q.seq_len,
            "head_dim": q.head_dim,
            "batch": q.batch,
            "gpus": q.gpus,
            "gpus_per_node": rec.gpus_per_node,
            "hardware": rec.profile.name,
            "dtype": canonical_dtype(q.dtype),
            "causal": q.causal,
            "mask": rec.mask.kind,
            "mask_label": rec.mask.label,
            "documents": len(rec.mask.documents) if rec.mask.documents else None,
            "documents_source": q.documents,
            "window": rec.mask.window,
            "phase": q.phase,
            "results": list(q.results),
        },
        "parallel": {
            "world": s.world,
            "tp": s.tp,
            "cp": s.cp,
            "pp": s.pp,
            "dp": s.dp,
            "micro_batch": s.micro_batch,
            "grad_accum": s.grad_accum,
            "global_batch": s.global_batch,
            "world_formula": s.world_formula(),
            "global_batch_formula": s.batch_formula(),
            "attention_heads_per_tp_rank": rec.shape.heads,
            "kv_heads_per_tp_rank": rec.shape.kv_heads,
        },
        "conventions": {"time": TIME_CONVENTION, "flops": FLOPS_CONVENTION},
        "feasible": len(rec.ranked),
        "candidates": [_candidate_dict(i + 1, r) for i, r in enumerate(listed)],
        "rejected": [
            {
                "ulysses": x.ulysses,
                "ring": x.ring,
                "layouts": list(x.layouts),
                "cp_comm": x.cp_comm,
                "kind": x.kind,
                "rule": x.rule,
            }
            for x in rec.rejected
        ],
        "winner": _candidate_dict(1, rec.winner) if rec.winner else None,
        "explanation": rec.explanation,
        "frameworks": [
            {
                "framework": f.framework,
                "expressible": f.expressible,
                "settings": f.settings,
                "note": f.note,
            }
            for f in rec.frameworks
        ],
        "calibration": calibration_summary(rec.calibration) if rec.calibration else None,
    }
