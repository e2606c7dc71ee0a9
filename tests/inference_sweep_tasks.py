"""Pool tasks of tests/test_inference_sweep.py (module level: the ranks import them by name)."""

from __future__ import annotations

from typing import Any

import torch

from cpbench.bench import inference_verify, measure
from cpbench.bench.harness import RankMeasurement


def off_by_one_cache(config_dict: dict[str, Any], settings: dict[str, Any]) -> RankMeasurement:
    """`measure_config` with the decode cache's K sharded one position off (K rolled by one
    token against V and the positions): a wrong cache offset the reference check must catch."""
    real = inference_verify.shard_cache

    def shifted(k_all: torch.Tensor, v_all: torch.Tensor, mesh: Any, layout: str) -> Any:
        return real(torch.roll(k_all, 1, dims=1), v_all, mesh, layout)

    inference_verify.shard_cache = shifted  # type: ignore[assignment]
    measure.shard_cache = shifted  # type: ignore[assignment]
    try:
        return measure.measure_config(config_dict, settings)
    finally:
        inference_verify.shard_cache = real
        measure.shard_cache = real
