"""Results records reduced to the measurements calibration and validation use, and their prior.

The three times and the prior's choice: docs/cost-model.md, "Calibrating from a table"."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from cpbench.config.inference import is_inference_record
from cpbench.config.problem import MeshCandidate
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import Prediction, predict
from cpbench.model.cost.records import record_devices_per_node
from cpbench.model.hardware.loading import ProfileChoice, choose_profile, load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.hardware.transforms import with_default_kernel


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
    device_names: tuple[str, ...] = ()
    """The devices the record names (environment.devices, once each, sorted)."""

    @property
    def key(self) -> tuple[Any, ...]:
        """Identity of the configuration, mask and exchange included (duplicates keep the last
        record): the p2p ring and the all-gather of one mesh are two configurations."""
        c = self.candidate
        gather = c.ring > 1 and c.all_gather
        exchange = (c.cp_comm, c.heads_k_stride) if gather else ("p2p", None)
        return (
            c.shape, c.ulysses, c.ring, c.layout, c.dtype, c.mask, c.phase, c.kernel, exchange,
            self.device,
        )  # fmt: skip

    @property
    def group(self) -> tuple[Any, ...]:
        """Configurations in one group solve the same problem on the same ranks (rankable)."""
        c = self.candidate
        return (c.shape, c.dtype, c.mask, c.phase, c.world, self.device)

    @property
    def label(self) -> str:
        """Short human description: UxR layout L phase."""
        c = self.candidate
        mask = "" if c.mask.plain else f" {c.mask.label}"
        return f"{c.ulysses}x{c.ring} {c.layout} L={c.shape.seq_len}{mask} {c.phase}"

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
    cost model describes cpbench's own implementation; so are inference records (a prefill or
    decode step is not the training step the model prices)."""
    if record.get("status") != "ok" or is_inference_record(record):
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
        candidate = MeshCandidate.from_record(config).require_feasible()
    except (CpbenchError, TypeError, ValueError):
        return None
    environment = record.get("environment")
    devices = environment.get("devices") if isinstance(environment, Mapping) else None
    names = sorted({str(d) for d in devices or () if str(d).strip()})
    return Measurement(
        str(record.get("id") or ""),
        candidate,
        record_devices_per_node(config),
        median,
        _positive_time(timing.get("compute_only")),
        _positive_time(timing.get("comm_only")),
        str(config.get("device", "cpu")),
        tuple(names),
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


def default_prior(
    measurements: Sequence[Measurement], given: str | None = None, named: str = ""
) -> ProfileChoice:
    """The profile a calibration on these measurements starts from (`choose_profile`): the one
    given, else the one a table's rows name in their profile column (`named`: their GPU has no
    profile), cpu-local for CPU measurements, else that of the GPUs the records name."""
    if named and not given:
        names = ", ".join(sorted({n for m in measurements for n in m.device_names}))
        return ProfileChoice(
            named,
            "named by the rows' profile column",
            f"no built-in hardware profile describes {names}: the rows name {named} as the "
            f"closest (its link numbers are not this machine's)",
        )
    cpu = bool(measurements) and all(m.device == "cpu" for m in measurements)
    gpu = [m for m in measurements if m.device != "cpu"] or list(measurements)
    return choose_profile([name for m in gpu for name in m.device_names], cpu=cpu, given=given)


def resolve_prior(
    prior: HardwareProfile | str | None, measurements: Sequence[Measurement]
) -> HardwareProfile:
    """The prior profile: given, loaded by name, or the default for the measurements' device;
    when every measurement ran one kernel family other than the profile's default, that
    family becomes the default (so the fitted curve, `efficiency`, is the measured kernel's)."""
    if isinstance(prior, HardwareProfile):
        base = prior
    else:
        base = load_profile(prior or default_prior(measurements).name)
    families = {base.kernel_for(m.candidate.kernel, m.candidate.dtype) for m in measurements}
    if len(families) == 1:
        return with_default_kernel(base, families.pop())
    return base
