"""The cost model's prediction of a results record (its config, phase and node count)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpbench.config.problem import MeshCandidate
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import Prediction, predict
from cpbench.model.hardware.profile import HardwareProfile


def record_devices_per_node(config: Mapping[str, Any]) -> int:
    """Devices per node of a record: world_size / nodes (one node when absent)."""
    world = int(
        config.get("world_size") or int(config.get("ulysses", 1)) * int(config.get("ring", 1))
    )
    nodes = max(1, int(config.get("nodes") or 1))
    return max(1, world // nodes)


def prediction_for_record(record: Mapping[str, Any], profile: HardwareProfile) -> Prediction | None:
    """Prediction for a results record (its config, phase and node count); None when the record
    is not `ok`, lacks a config, or describes a configuration the model cannot evaluate."""
    if record.get("status") != "ok":
        return None
    config = record.get("config")
    if not isinstance(config, Mapping):
        return None
    try:
        return predict(MeshCandidate.from_record(config), profile, record_devices_per_node(config))
    except (CpbenchError, TypeError, ValueError):
        return None
