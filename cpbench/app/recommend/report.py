"""The JSON answer of `cpbench recommend --json` (and what the renderer reads)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cpbench.app.recommend.types import (
    SIGMA_CONVENTION,
    TIE_BREAK_RULES,
    TIME_CONVENTION,
    RankedCandidate,
    Recommendation,
    layout_label,
)
from cpbench.config.vocabulary import PHASE_PASSES, canonical_dtype
from cpbench.model.calibrate import (
    calibration_summary,
)
from cpbench.model.flops import FLOPS_CONVENTION


def _interval_dict(r: RankedCandidate) -> dict[str, Any]:
    """low/high/sigma/source of what a candidate is ranked by (the measured median's 95%
    interval when measured, else the prediction x exp(+-sigma))."""
    if r.measured_s is not None:
        m = r.measured_interval
        return {
            "low_s": r.low_s,
            "high_s": r.high_s,
            "sigma": None,
            "plus_minus": (r.high_s - r.low_s) / (2 * r.time_s) if r.time_s > 0 else 0.0,
            "source": f"measured: the median's 95% interval ({m.method if m else 'no interval'})",
        }
    pi = r.interval
    return {
        "low_s": r.low_s,
        "high_s": r.high_s,
        "sigma": pi.relative_sigma if pi else None,
        "plus_minus": pi.relative_sigma if pi else None,
        "source": pi.source if pi else "",
    }


def _candidate_dict(position: int, r: RankedCandidate, tied: bool = False) -> dict[str, Any]:
    p = r.prediction
    c = p.candidate
    t = p.phase_time
    return {
        "rank": position,
        "ulysses": c.ulysses,
        "ring": c.ring,
        "layout": c.layout,
        "layout_matters": layout_label(p) != "any",
        "kv_replication": c.replication,
        "scheme": c.scheme,
        "cp_comm": c.cp_comm if c.ring > 1 else "p2p",
        "heads_k_stride": c.heads_k_stride if c.all_gather else None,
        "gathers": c.gathers if c.all_gather else None,
        "label": r.label,
        "source": r.source,
        "record_id": r.record_id,
        "time_s": r.time_s,
        "interval": _interval_dict(r),
        "predicted_low_s": r.interval.low_s if r.interval else None,
        "predicted_high_s": r.interval.high_s if r.interval else None,
        "tied": tied,
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
        "placement": asdict(p.placement),
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
    tied = {id(r) for r in rec.tie.tied} if rec.tie else set()
    u, tie = rec.uncertainty, rec.tie
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
        "uncertainty": (
            {
                "kind": u.kind,
                "sigma": u.sigma,
                "source": u.source,
                "convention": SIGMA_CONVENTION,
                "common_sigma": u.split.common_sigma if u.split else None,
                "candidate_sigma": u.split.candidate_sigma if u.split else None,
                "ratio_sigma": u.split.ratio_sigma if u.split else None,
                "split_source": u.split.source if u.split else None,
            }
            if u
            else None
        ),
        "tie": (
            {
                "tied": len(tie.tied),
                "clear": tie.clear,
                "labels": [r.label for r in tie.tied],
                "runner_up": tie.runner_up.label if tie.runner_up else None,
                "rule": tie.rule,
                "message": tie.message,
                "resolved_by": tie.resolved_by,
                "measured": any(r.measured_s is not None for r in tie.tied),
                "pick": tie.tied[0].label,
                "decided_by": tie.decided_by,
                "decision": tie.decision,
                "tie_break_rules": TIE_BREAK_RULES,
            }
            if tie
            else None
        ),
        "candidates": [
            _candidate_dict(i + 1, r, id(r) in tied) for i, r in enumerate(listed)
        ],
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
        "winner": _candidate_dict(1, rec.winner, id(rec.winner) in tied) if rec.winner else None,
        "explanation": asdict(rec.explanation) if rec.explanation else None,
        "frameworks": [asdict(f) for f in rec.frameworks],
        "calibration": calibration_summary(rec.calibration) if rec.calibration else None,
    }
