"""The inference part of the report: one row per inference record (prefill, decode) with its
serving numbers, for the report's inference section (TTFT vs length per scheme, decode
latency vs degree, KV capacity). Training records are left to the rest of the report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from cpbench.config.inference import is_inference_record

INFERENCE_COLUMNS: tuple[str, ...] = (
    "id", "status", "error", "phase", "how", "world_size", "cached_len", "new_tokens",
    "context", "batch", "heads", "kv_heads", "head_dim", "dtype", "device", "median_s",
    "ci_low_s", "ci_high_s", "ttft_s", "per_token_latency_s", "tokens_per_s",
    "kv_cache_bytes_analytic", "kv_cache_bytes_measured", "kv_cache_ratio", "bytes_match",
    "max_abs_error", "tolerance",
)  # fmt: skip
"""The frame's columns: context = cached_len + new_tokens (the keys the step attends to);
kv_cache_bytes_measured is the max over ranks; seconds as the records give them."""


_CONFIG_COLUMNS = ("world_size", "batch", "heads", "kv_heads", "head_dim", "dtype", "device")
_SECTION_COLUMNS = (
    "ttft_s", "per_token_latency_s", "tokens_per_s", "kv_cache_bytes_analytic", "kv_cache_ratio",
)  # fmt: skip
"""The columns copied as they are from the record's config and its `inference` section."""


def _inference_row(record: Mapping[str, Any]) -> dict[str, Any]:
    config, step = record["config"], record["config"]["inference"]
    timing = record.get("timing") or {}
    section = record.get("inference") or {}
    accuracy = record.get("accuracy") or {}
    measured = section.get("kv_cache_bytes_measured")
    return {
        **{key: record.get(key) for key in ("id", "status", "error")},
        "phase": step["phase"],
        "how": step["scheme"] if step["phase"] == "prefill" else step["cache_layout"],
        "cached_len": step["cached_len"],
        "new_tokens": step["new_tokens"],
        "context": step["cached_len"] + step["new_tokens"],
        **{key: config.get(key) for key in _CONFIG_COLUMNS},
        **{f"{key}_s": timing.get(key) for key in ("median", "ci_low", "ci_high")},
        **{key: section.get(key) for key in _SECTION_COLUMNS},
        "kv_cache_bytes_measured": max(measured) if measured else None,
        "bytes_match": (record.get("comm") or {}).get("match"),
        **{key: accuracy.get(key) for key in ("max_abs_error", "tolerance")},
    }


def inference_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per inference record (`INFERENCE_COLUMNS`), in the records' order."""
    rows = [_inference_row(r) for r in records if is_inference_record(r)]
    frame = pd.DataFrame(rows, columns=list(INFERENCE_COLUMNS))
    for col in ("median_s", "ci_low_s", "ci_high_s", "ttft_s", "per_token_latency_s",
                "tokens_per_s", "kv_cache_ratio", "max_abs_error", "tolerance"):  # fmt: skip
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    return frame
