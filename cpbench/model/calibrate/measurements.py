"""Results records reduced to the measurements calibration and validation use.

A results record (cpbench/results/schema.py) with status `ok` gives three measured times of one
configuration: the step (`timing.median`), the step with communication removed
(`timing.compute_only`) and the communication alone (`timing.comm_only`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from cpbench.errors import CpbenchError
from cpbench.model.cost import MeshCandidate, Prediction, predict, record_devices_per_node
from cpbench.model.hardware import HardwareProfile, load_profile

CPU_PRIOR = "cpu-local"
"""Prior profile of measurements taken on CPU only."""
GPU_PRIOR = "h100-sxm"
"""Prior profile of any other measurements."""


@dataclass(frozen=True)
class Measurement:
    """One `ok` results record reduced to what calibration and validation use."""

    record_id: str
    """The record's id (or a description built from its config)."""
    candidate: MeshCandidate
    """The configuration measured."""
    devices_per_node: int
    """world_size / nodes of the run."""
    median_s: float
    """Measured step time (timing.median)."""
    compute_only_s: float | None
    """Measured step with communication removed, when recorded."""
    comm_only_s: float | None
    """Measured communication alone, when recorded."""
    device: str
    """cpu or cuda."""

    @property
    def key(self) -> tuple[Any, ...]:
        """Identity of the configuration (duplicates keep the last record)."""
        c = self.candidate
        return (c.shape, c.ulysses, c.ring, c.layout, c.dtype, c.causal, c.phase, self.device)

    @property
    def group(self) -> tuple[Any, ...]:
        """Configurations in one group solve the same problem on the same ranks (rankable)."""
        c = self.candidate
        return (c.shape, c.dtype, c.causal, c.phase, c.world, self.device)

    @property
    def label(self) -> str:
        """Short human description: UxR layout L phase."""
        c = self.candidate
        return f"{c.ulysses}x{c.ring} {c.layout} L={c.shape.seq_len} {c.phase}"

    def predict(self, profile: HardwareProfile) -> Prediction:
        """The cost model's prediction of this configuration on `profile`."""
        return predict(self.candidate, profile, self.devices_per_node)


def _positive_time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 and math.isfinite(value) else None


def measurement_from_record(record: Mapping[str, Any]) -> Measurement | None:
    """A Measurement from an `ok` record with a usable config and timing.median; else None.
    Records of external implementations (config.impl other than cpbench) are left out: the
    cost model describes cpbench's own implementation."""
    if record.get("status") != "ok":
        return None
    config, timing = record.get("config"), record.get("timing")
    if not isinstance(config, Mapping) or not isinstance(timing, Mapping):
        return None
    if config.get("impl", "cpbench") != "cpbench":
        return None
    median = _positive_time(timing.get("median"))
    if median is None:
        return None
    try:
        candidate = MeshCandidate.from_config(config)
        candidate.cp_config()
    except (CpbenchError, TypeError, ValueError):
        return None
    return Measurement(
        str(record.get("id") or ""),
        candidate,
        record_devices_per_node(config),
        median,
        _positive_time(timing.get("compute_only")),
        _positive_time(timing.get("comm_only")),
        str(config.get("device", "cpu")),
    )


def measurements_from_records(records: Iterable[Mapping[str, Any]]) -> list[Measurement]:
    """Usable measurements, one per configuration (a repeated configuration keeps its last)."""
    by_key: dict[tuple[Any, ...], Measurement] = {}
    for record in records:
        m = measurement_from_record(record)
        if m is not None:
            by_key.pop(m.key, None)
            by_key[m.key] = m
    return [m if m.record_id else replace(m, record_id=m.label) for m in by_key.values()]


def as_measurements(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement],
) -> list[Measurement]:
    """Measurements as given, or read from results records (measurements_from_records)."""
    items = list(records)
    measurements = [r for r in items if isinstance(r, Measurement)]
    if len(measurements) == len(items):
        return measurements
    return measurements_from_records(cast("list[Mapping[str, Any]]", items))


def default_prior_name(measurements: Sequence[Measurement]) -> str:
    """cpu-local for CPU measurements, else h100-sxm."""
    if measurements and all(m.device == "cpu" for m in measurements):
        return CPU_PRIOR
    return GPU_PRIOR


def resolve_prior(
    prior: HardwareProfile | str | None, measurements: Sequence[Measurement]
) -> HardwareProfile:
    """The prior profile: given, loaded by name, or the default for the measurements' device."""
    if isinstance(prior, HardwareProfile):
        return prior
    return load_profile(prior or default_prior_name(measurements))
