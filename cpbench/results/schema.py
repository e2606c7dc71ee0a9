"""The results record: one JSON object per configuration, one per line (JSONL).

Writers append and flush one record as soon as its configuration ends; readers ignore unknown
fields and skip a torn last line. Bump SCHEMA_VERSION on an incompatible change.

```
{
  "schema_version": 1,
  "id": "L1024-B1-h8-kv2-d64-float32-causal-U2xR2-zigzag-rep1-auto-fwd+bwd-cpu-w4",
  "scenario": "cpu-smoke",            # scenario name
  "timestamp": "2026-11-29T18:00:00+00:00",
  "status": "ok" | "failed" | "skipped" | "timeout",
  "error": null | "one line: what went wrong / the rule that rejects the configuration",
  "config": {
    "seq_len": 1024, "batch": 1, "heads": 8, "kv_heads": 2, "head_dim": 64,
    "dtype": "float32", "causal": true, "ulysses": 2, "ring": 2, "layout": "zigzag",
    "kv_replication": 1,               # copies of each KV head (1 = none), resolved
    "backend": "auto",                 # kernel requested: auto | sdpa | naive | flash_attn
    "kernel": "sdpa",                  # kernel used (null when not run)
    "device": "cpu" | "cuda", "world_size": 4, "nodes": 1,
    "phase": "fwd" | "fwd+bwd",
    "scheme": "ring" | "ulysses" | "usp" | "single",
    "impl": "cpbench" | "torch_cp" | "ring_flash_attn" | ...   # cpbench.config.impls.IMPLS;
                                       # absent in older records = cpbench; ids of other impls
                                       # end in "-impl_<name>"
  },
  "timing": {                          # seconds; present when status == "ok"
    "phase": "fwd+bwd",
    "median": 0.031, "p10": 0.030, "p90": 0.034,
    "samples": [...],                  # per iteration, max over ranks
    "per_rank_median": [...],          # each rank's own median (causal load balance)
    "compute_only": 0.025,             # median of the same step with communication removed
                                       # (null, like comm_only / exposed_comm / overlap, for an
                                       # external impl: the variants exist only for cpbench)
    "compute_only_per_rank": [...],
    "comm_only": 0.009,                # median of the same communication with kernels removed
    "exposed_comm": 0.006,             # max(0, median - compute_only)
    "overlap": 0.33 | null,            # (compute + comm - step) / min(compute, comm), clamped
    "overlap_note": "..."
  },
  "comm": {
    "analytic_bytes": {"fwd": 123, "bwd": 456},        # per rank, from cpbench.model
    "measured_bytes": {"fwd": [...], "bwd": [...]},     # per rank, counted
    "by_collective": {"fwd": {"a2a_q": {"analytic": 1, "measured": [...]}, ...}, "bwd": {...}},
    "match": true,                     # null for an external impl: its bytes are counted at
                                       # the torch.distributed boundary and compared, not judged
    "note": "...",                     # external impl only: what was counted and how
    "model_ratio": {"fwd": 1.0, "bwd": 1.0},  # external impl only: measured / analytic
    "achieved_busbw_GBps": 1.2 | null  # bytes a rank sends / comm_only time (nccl-tests busbw)
  },
  "memory": {
    "peak_bytes": [...], "source": "cpu-tensor-tracker" | "torch-cuda-allocator",
    "rss_peak_bytes": [...] | null,    # CPU: process peak RSS during the step
    "nvml_used_bytes": [...] | null,   # GPU: device memory in use after the step (NVML)
    "analytic_peak_bytes": 789         # cpbench.model.memory lower bound, per rank
  },
  "flops": {
    "convention": "...", "global": 1.0e9, "slowest_rank": 3.0e8,
    "achieved_tflops": 0.5,            # global FLOPs / median step / 1e12 (all ranks)
    "achieved_tflops_per_rank": 0.12
  },
  "accuracy": {"max_abs_error": 1e-6, "check_seq_len": 1024, "tolerance": 2e-4, "passed": true,
               "known_issues": [...], "tolerances": {...}},  # the last two only when a documented
                                       # upstream precision issue loosened one gradient's bound
  "environment": {"torch": "...", "nccl": "...", "flash_attn": null, "python": "...",
                  "impl_version": "0.1.8",   # external impl only: the library's version
                  "hostnames": [...], "devices": [...], "env": {"NCCL_...": "..."}, ...}
}
```
"""

from __future__ import annotations

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "skipped", "timeout")
