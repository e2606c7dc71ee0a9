"""The JSON answer of `cpbench recommend --json`: the one serializer of a `Recommendation`
(`cpbench.render.recommend` reads the objects themselves)."""

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
from cpbench.model.calibrate import calibration_summary
from cpbench.model.flops import FLOPS_CONVENTION

JSON_SCHEMA_VERSION = 1
"""Version of the JSON shape: it changes when a key is renamed or removed or changes meaning,
not when one is added."""


def attributes(obj: object, names: str, /, **values: Any) -> dict[str, Any]:
    """`obj`'s attributes of the space-separated `names`, in that order, then `values`."""
    return {name: getattr(obj, name) for name in names.split()} | values


def _candidate_dict(position: int, r: RankedCandidate, tied: bool) -> dict[str, Any]:
    p, pi = r.prediction, r.interval
    c, t, ag = p.candidate, p.phase_time, p.candidate.all_gather
    return {
        "rank": position,
        **attributes(c, "ulysses ring layout", layout_matters=layout_label(p) != "any"),
        "kv_replication": c.replication,
        "scheme": c.scheme,
        "cp_comm": c.cp_comm if c.ring > 1 else "p2p",
        "heads_k_stride": c.heads_k_stride if ag else None,
        "gathers": c.gathers if ag else None,
        **attributes(r, "label source record_id time_s"),
        "interval": attributes(r, "low_s high_s sigma plus_minus", source=r.interval_source),
        "predicted_low_s": pi.low_s if pi else None,
        "predicted_high_s": pi.high_s if pi else None,
        "tied": tied,
        "measured_s": r.measured_s,
        "predicted_s": p.step_s,
        **attributes(t, "compute_s imbalance_s exposed_comm_s comm_s"),
        "forward_s": p.forward.total_s,
        "forward_backward_s": p.forward_backward.total_s,
        "bytes_per_tier": p.bytes_by_tier(PHASE_PASSES[c.phase]),
        "traffic": [asdict(x) for x in p.traffic],
        "placement": asdict(p.placement),
        **attributes(p.placement, "ulysses_tier ring_tier"),
        **attributes(p, "work_imbalance work_overhead slowest_ring_rank ring_steps"),
        "padding_tokens": p.padding,
        **attributes(p, "padding_fraction kernel_seq_len"),
        "attention_tflops_per_rank": p.attention_tflops,
        **attributes(p, "kernel", efficiency_curve=p.curve_kernel),
        **attributes(p, "curve_note memory_bytes memory_capacity_bytes max_seq_len"),
    }


SPLIT_PARTS = ("common", "candidate", "ratio")
"""The sigmas of an `ErrorSplit` (`<part>_sigma`)."""


def recommendation_report(rec: Recommendation) -> dict[str, Any]:
    """The `--json` answer of `recommend`."""
    q, s, m, u, tie = rec.request, rec.sizes, rec.mask, rec.uncertainty, rec.tie
    split = u.split if u else None
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "warnings": list(rec.warnings),
        "inputs": {
            **attributes(q, "heads kv_heads seq_len head_dim batch gpus"),
            "gpus_per_node": rec.gpus_per_node,
            "hardware": rec.profile.name,
            "dtype": canonical_dtype(q.dtype),
            **attributes(q, "causal", mask=m.kind, mask_label=m.label),
            "documents": len(m.documents) if m.documents else None,
            "documents_source": q.documents,
            "window": m.window,
            "phase": q.phase,
            "results": list(q.results),
        },
        "parallel": {
            **attributes(s, "world tp cp pp dp micro_batch grad_accum global_batch"),
            "world_formula": s.world_formula(),
            "global_batch_formula": s.batch_formula(),
            "attention_heads_per_tp_rank": rec.shape.heads,
            "kv_heads_per_tp_rank": rec.shape.kv_heads,
        },
        "conventions": {"time": TIME_CONVENTION, "flops": FLOPS_CONVENTION},
        "feasible": len(rec.ranked),
        "uncertainty": (
            attributes(u, "kind sigma source", convention=SIGMA_CONVENTION)
            | {f"{k}_sigma": getattr(split, f"{k}_sigma", None) for k in SPLIT_PARTS}
            | {"split_source": split.source if split else None}
            if u
            else None
        ),
        "tie": (
            {
                "tied": len(tie.tied),
                **attributes(tie, "clear", labels=[r.label for r in tie.tied]),
                "runner_up": tie.runner_up.label if tie.runner_up else None,
                **attributes(tie, "rule message resolved_by measured", pick=tie.pick.label),
                **attributes(tie, "decided_by decision", tie_break_rules=TIE_BREAK_RULES),
            }
            if tie
            else None
        ),
        "candidates": [_candidate_dict(i, r, rec.tied(r)) for i, r in enumerate(rec.listed, 1)],
        "rejected": [attributes(x, "ulysses ring layouts cp_comm kind rule") for x in rec.rejected],
        "winner": _candidate_dict(1, rec.winner, rec.tied(rec.winner)) if rec.winner else None,
        "explanation": asdict(rec.explanation) if rec.explanation else None,
        "frameworks": [asdict(f) for f in rec.frameworks],
        "calibration": calibration_summary(rec.calibration) if rec.calibration else None,
    }
