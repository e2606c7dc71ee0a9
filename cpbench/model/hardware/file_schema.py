"""The TOML layout of a hardware profile file, and reading it into a `HardwareProfile`.

The layout, its errors and old files: docs/design.md section 2, "The hardware profile"."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError, model_validator

from cpbench.config.file_schema import MESSAGE, RULE, FileModel, problem, rule, table_at
from cpbench.config.vocabulary import DTYPES
from cpbench.errors import CpbenchError
from cpbench.model.hardware.profile import (
    DEVICE_KINDS,
    KERNEL_FAMILIES,
    TIER_KINDS,
    CalibrationInfo,
    DeviceKind,
    EfficiencyCurve,
    HardwareProfile,
    KernelFamily,
    LinkCost,
    LinkTier,
    LinkTierProfile,
    NodeTopology,
    TierKind,
    TopologyTier,
)
from cpbench.units import GB

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROFILE_SCHEMA_VERSION = 1
"""Layout version of a profile file (`schema_version`)."""

PositiveNumber = Annotated[float, Field(gt=0), rule("must be a positive number")]
NonNegativeNumber = Annotated[float, Field(ge=0), rule("must be a number >= 0")]
UnitInterval = Annotated[float, Field(ge=0, le=1), rule("must be a number in [0, 1]")]
PositiveInteger = Annotated[int, Field(gt=0), rule("must be a positive integer")]


def _increasing(values: list[int]) -> list[int]:
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise problem(f"must be strictly increasing, got {values}")
    return values


class MemoryTable(FileModel):
    """`[memory]`: capacity and bandwidth of one device's memory."""

    capacity_gib: PositiveNumber
    """Capacity per device, GiB (HBM, or a CPU rank's share of RAM)."""
    bandwidth_GBps: PositiveNumber
    """Bandwidth, GB/s (1e9 bytes)."""
    source: str = ""
    """Where the numbers come from."""


class PeakTable(FileModel):
    """`[peak_tflops]`: peak dense TFLOP/s per dtype (at least one)."""

    float32: PositiveNumber | None = None
    """Peak TFLOP/s in float32 (absent: unknown)."""
    bfloat16: PositiveNumber | None = None
    """Peak TFLOP/s in bfloat16."""
    float16: PositiveNumber | None = None
    """Peak TFLOP/s in float16."""
    source: str = ""
    """Where the peaks come from."""

    @model_validator(mode="after")
    def _one_peak(self) -> PeakTable:
        if not self.peaks():
            raise problem(f"needs at least one of {', '.join(DTYPES)}")
        return self

    def peaks(self) -> dict[str, float]:
        """The given peaks by dtype."""
        return self.model_dump(exclude={"source"}, exclude_none=True)


class EfficiencyTable(FileModel):
    """`[efficiency.<family>]`: one kernel family's efficiency curve (`EfficiencyCurve`); also
    the layout of the single-curve `[kernel_efficiency]` table of older files."""

    seq_len: Annotated[
        list[Annotated[int, Field(gt=0), rule("must hold positive integers")]],
        Field(min_length=1),
        AfterValidator(_increasing),
    ]
    """Kernel sequence lengths, strictly increasing."""
    efficiency: Annotated[
        list[Annotated[float, Field(gt=0, le=1), rule("must hold numbers in (0, 1]")]],
        Field(min_length=1),
    ]
    """Efficiency at each length."""
    source: str = ""
    """Where the curve comes from."""

    @model_validator(mode="after")
    def _same_length(self) -> EfficiencyTable:
        if len(self.seq_len) != len(self.efficiency):
            raise problem(
                f"seq_len ({len(self.seq_len)} values) and efficiency "
                f"({len(self.efficiency)} values) differ in length"
            )
        return self


class EfficiencyTables(FileModel):
    """`[efficiency]`: the attention-kernel efficiency curve of each kernel family that has one
    (`[efficiency.flash_attn]`, ...), and which of them `auto` runs."""

    default: Annotated[KernelFamily, rule(f"must be one of {', '.join(KERNEL_FAMILIES)}")]
    """The family `auto` runs on this device in fp16/bf16 (it must have a curve); families
    without a curve read this one's."""
    source: str = ""
    """Where the choice of default comes from."""
    flash_attn: EfficiencyTable | None = None
    """FlashAttention-2 (flash-attn 2.x)."""
    flash_attn3: EfficiencyTable | None = None
    """FlashAttention-3 (flash-attn's Hopper build, flash_attn_interface)."""
    cudnn: EfficiencyTable | None = None
    """cuDNN fused attention (PyTorch's cuDNN SDPA op)."""
    cuda_sdpa: EfficiencyTable | None = None
    """PyTorch's CUDA SDPA op (its vendored FlashAttention-2)."""
    cpu_sdpa: EfficiencyTable | None = None
    """PyTorch's CPU SDPA op."""
    einsum: EfficiencyTable | None = None
    """The einsum kernel (materialises the scores)."""

    @model_validator(mode="after")
    def _default_has_a_curve(self) -> EfficiencyTables:
        if self.tables().get(self.default) is None:
            given = ", ".join(self.tables()) or "none"
            raise problem(
                f"default {self.default!r} has no [efficiency.{self.default}] curve "
                f"(curves given: {given})",
                "",
            )
        return self

    def tables(self) -> dict[str, EfficiencyTable]:
        """The given curves by family."""
        found = {family: getattr(self, family) for family in KERNEL_FAMILIES}
        return {family: table for family, table in found.items() if table is not None}


def _patterns(values: list[str]) -> list[str]:
    for value in values:
        try:
            re.compile(value)
        except re.error as exc:
            raise problem(f"must hold regular expressions; {value!r} is not one ({exc})") from None
    return values


class DeviceTable(FileModel):
    """`[device]`: the devices the profile describes."""

    kind: Annotated[DeviceKind, rule(f"must be one of {', '.join(DEVICE_KINDS)}")]
    """What the ranks run on: cpu or cuda."""
    names: Annotated[list[str], rule("must be a list of strings"), AfterValidator(_patterns)] = (
        Field(default_factory=list)
    )
    """Case-insensitive regular expressions searched in a device name (torch's
    get_device_name, a record's environment.devices); one match is enough."""
    source: str = ""
    """Where the names come from."""


class OverheadsTable(FileModel):
    """`[overheads]`: fixed time per ring step and the overlap of a step."""

    step_overhead_us: NonNegativeNumber
    """Fixed time per ring step and kernel call, microseconds."""
    overlap: UnitInterval
    """Fraction of min(compute, comm) of a ring step hidden behind the longer one."""
    source: str = ""
    """Where the numbers come from."""


class CostTable(FileModel):
    """`[links.<tier>.<kind>]`: one collective kind on one tier (`LinkCost`)."""

    latency_us: NonNegativeNumber
    """Fixed time per call, microseconds."""
    busbw_GBps: PositiveNumber
    """nccl-tests bus bandwidth, GB/s."""
    source: str = ""
    """Where the numbers come from."""
    fit_residual: NonNegativeNumber | None = None
    """RMS relative residual of the fit that measured them (`cpbench probe`)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_residual(cls, data: Any) -> Any:
        """Probe profiles written before `fit_residual` state it in the source only."""
        if not isinstance(data, Mapping) or "fit_residual" in data:
            return data
        found = re.search(r"RMS residual (\d+(?:\.\d+)?)%", str(data.get("source", "")))
        return {**data, "fit_residual": float(found.group(1)) / 100} if found else data


class TierTable(FileModel):
    """`[links.<tier>]`: one link tier (`LinkTierProfile`)."""

    name: str | None = None
    """The technology; absent = the tier's name."""
    devices_per_nic: PositiveInteger = 1
    """Ranks sharing one endpoint of the tier."""
    all_to_all: CostTable
    """All-to-all on this tier."""
    send_recv: CostTable
    """Ring send/recv on this tier."""


class LinksTable(FileModel):
    """`[links]`: both tiers."""

    intra_node: TierTable
    """Links between devices of one node."""
    inter_node: TierTable
    """Links between nodes (per NIC)."""


class TopologyTierTable(FileModel):
    """`[[topology.tiers]]`: one tier of a node's topology (`TopologyTier`)."""

    kind: Annotated[TierKind, rule(f"must be one of {', '.join(TIER_KINDS)}")]
    """What joins the islands."""
    island: PositiveInteger
    """Devices per island at this tier."""
    name: str | None = None
    """The technology; absent = the kind."""
    peer_to_peer: bool = True
    """Whether GPU peer-to-peer works across this tier."""
    all_to_all: CostTable
    """All-to-all traffic across this tier."""
    send_recv: CostTable
    """Ring send/recv traffic across this tier."""


class TopologyTable(FileModel):
    """`[topology]`: the tiers inside a node, innermost first; islands nest (each tier's
    island a multiple of the one below) and the last is the node."""

    source: str = ""
    """Where the layout comes from."""
    tiers: Annotated[list[TopologyTierTable], Field(min_length=1)]
    """The tiers, innermost first."""

    @model_validator(mode="after")
    def _nested(self) -> TopologyTable:
        sizes = [t.island for t in self.tiers]
        for below, above in zip(sizes, sizes[1:], strict=False):
            if above <= below or above % below:
                raise problem(
                    f"islands must nest: each tier's island a larger multiple of the one "
                    f"below, got {sizes} ({above} after {below})",
                    "",
                )
        return self


class CalibrationTable(FileModel):
    """`[calibration]`: how a calibrated profile was fitted (`CalibrationInfo`)."""

    prior: str
    """Name of the profile the fit started from."""
    points: PositiveInteger
    """Measured configurations used."""
    residual: NonNegativeNumber
    """RMS relative error of the fitted step times."""
    files: Annotated[list[str], rule("must be a list of strings")] = Field(default_factory=list)
    """Results files the measurements came from."""


class ProfileFile(FileModel):
    """A hardware profile file; `cpbench.model.hardware.profile` says what the numbers mean."""

    schema_version: Annotated[
        int,
        Field(ge=PROFILE_SCHEMA_VERSION, le=PROFILE_SCHEMA_VERSION),
        rule(f"must be {PROFILE_SCHEMA_VERSION}"),
    ] = PROFILE_SCHEMA_VERSION
    """Layout version of the file."""
    name: str
    """Short identifier, e.g. h100-sxm."""
    description: str = ""
    """One line: device, node, links."""
    devices_per_node: PositiveInteger
    """Devices (ranks) in a node."""
    compute_slots_per_node: PositiveInteger | None = None
    """Ranks of a node that compute at full speed at once (CPU cores); absent = every rank."""
    memory: MemoryTable
    """Device memory."""
    device: DeviceTable | None = None
    """The devices it describes (absent: cuda, matching no device name)."""
    peak_tflops: PeakTable
    """Peak dense TFLOP/s per dtype."""
    efficiency: EfficiencyTables
    """Attention-kernel efficiency curves per kernel family."""
    overheads: OverheadsTable
    """Per-step overhead and overlap."""
    links: LinksTable
    """The two link tiers."""
    calibration: CalibrationTable | None = None
    """Present on profiles fitted to measurements."""
    topology: TopologyTable | None = None
    """The tiers inside a node; absent = a flat node (one island joined by links.intra_node)."""

    @model_validator(mode="after")
    def _topology_is_the_node(self) -> ProfileFile:
        if self.topology is not None and self.topology.tiers[-1].island != self.devices_per_node:
            last = self.topology.tiers[-1].island
            raise problem(
                f"outermost island ({last} devices) must be the node: devices_per_node is "
                f"{self.devices_per_node}",
                "",
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _migrate_single_curve(cls, data: Any) -> Any:
        """A file of the single-curve layout (`[kernel_efficiency]`, one curve for every kernel)
        gets that curve as its default family's: `cpu_sdpa` on a CPU profile (`[device] kind`,
        or compute slots per node, or 'cpu' in the name), else `flash_attn`."""
        if not isinstance(data, Mapping) or "kernel_efficiency" not in data:
            return data
        if "efficiency" in data:
            raise problem(
                "has both [efficiency] and [kernel_efficiency] (the single-curve layout of "
                "older files): keep [efficiency]",
                "",
            )
        migrated = {k: v for k, v in data.items() if k != "kernel_efficiency"}
        family = migrated_family(data)
        migrated["efficiency"] = {
            "default": family,
            "source": "one curve for every kernel (a file of the single-curve layout)",
            family: data["kernel_efficiency"],
        }
        return migrated


def migrated_family(data: Mapping[str, Any]) -> KernelFamily:
    """The family a single-curve file's curve is filed under (see `ProfileFile`)."""
    device = data.get("device")
    kind = device.get("kind") if isinstance(device, Mapping) else None
    cpu_like = kind == "cpu" or (
        kind is None
        and (
            data.get("compute_slots_per_node") is not None
            or "cpu" in str(data.get("name", "")).lower()
        )
    )
    return "cpu_sdpa" if cpu_like else "flash_attn"


def _profile_error(exc: ValidationError, origin: str, legacy: str | None = None) -> CpbenchError:
    """The first problem (unknown keys first), as `hardware profile <file>: <key> <rule>`;
    `legacy` is the family a single-curve file's `[kernel_efficiency]` was migrated to (its
    keys are named as the file spells them)."""
    errors = exc.errors()
    extras = [e for e in errors if e["type"] == "extra_forbidden"]
    error = extras[0] if extras else errors[0]
    loc, kind, value = error["loc"], error["type"], error["input"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    key = ".".join(part for part in loc if isinstance(part, str)) or "(top level)"
    if kind == "extra_forbidden" and loc[:-1] == ("peak_tflops",):
        text = f"is not a dtype; use {', '.join(DTYPES)} (and source)"
    elif kind == "extra_forbidden":
        parent = loc[:-1]
        table = table_at(ProfileFile, parent)
        allowed = sorted(table.model_fields) if table is not None else []
        unknown = sorted(str(e["loc"][-1]) for e in extras if e["loc"][:-1] == parent)
        key = f"[{'.'.join(str(part) for part in parent)}]" if parent else "(top level)"
        text = f"has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
    elif kind == MESSAGE:
        text = ctx["message"]
    elif kind == RULE:
        text = f"{ctx['rule']}, got {value!r}"
    elif kind == "model_type" or (kind == "missing" and table_at(ProfileFile, loc) is not None):
        text = "must be a table"
    elif kind == "missing":
        text = "is required"
    elif kind == "string_type":
        text = f"must be a string, got {value!r}"
    elif kind == "list_type":
        text = f"must be a list, got {value!r}"
    elif kind == "too_short":
        text = "must not be empty"
    else:
        text = f"{error['msg']}, got {value!r}"
    if legacy is not None:
        key = re.sub(rf"^(\[?)efficiency\.{legacy}\b", r"\1kernel_efficiency", key)
    return CpbenchError(f"hardware profile {origin}: {key} {text}")


def _cost(c: CostTable) -> LinkCost:
    return LinkCost(c.latency_us * 1e-6, c.busbw_GBps * GB, c.source, c.fit_residual)


def _tier(tier: LinkTier, table: TierTable) -> LinkTierProfile:
    return LinkTierProfile(
        tier,
        table.name if table.name is not None else tier,
        _cost(table.all_to_all),
        _cost(table.send_recv),
        table.devices_per_nic,
    )


def profile_from_toml(content: str, origin: str = "<string>") -> HardwareProfile:
    """Parse and validate a profile from TOML text."""
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"hardware profile {origin} is not valid TOML: {exc}") from None
    return profile_from_dict(data, origin)


def profile_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> HardwareProfile:
    """Validate a parsed profile; CpbenchError naming the key and the rule on any problem."""
    legacy = None
    if isinstance(data, Mapping) and "kernel_efficiency" in data and "efficiency" not in data:
        legacy = migrated_family(data)
    try:
        spec = ProfileFile.model_validate(data)
    except ValidationError as exc:
        raise _profile_error(exc, origin, legacy) from None
    overheads, cal, device = spec.overheads, spec.calibration, spec.device
    curves = {
        family: EfficiencyCurve(tuple(t.seq_len), tuple(t.efficiency), t.source)
        for family, t in spec.efficiency.tables().items()
    }
    default = spec.efficiency.default
    kind: DeviceKind = device.kind if device is not None else "cuda"
    return HardwareProfile(
        name=spec.name,
        description=spec.description,
        devices_per_node=spec.devices_per_node,
        memory_gib=spec.memory.capacity_gib,
        memory_source=spec.memory.source,
        memory_bandwidth=spec.memory.bandwidth_GBps * GB,
        peak_tflops=spec.peak_tflops.peaks(),
        peak_source=spec.peak_tflops.source,
        efficiency=curves.pop(default),
        step_overhead_s=overheads.step_overhead_us * 1e-6,
        overlap=overheads.overlap,
        overheads_source=overheads.source,
        intra_node=_tier("intra_node", spec.links.intra_node),
        inter_node=_tier("inter_node", spec.links.inter_node),
        compute_slots_per_node=spec.compute_slots_per_node,
        calibration=(
            CalibrationInfo(cal.prior, cal.points, cal.residual, tuple(cal.files))
            if cal is not None
            else None
        ),
        default_kernel=default,
        default_kernel_source=spec.efficiency.source,
        kernel_curves=curves,
        device_kind=kind,
        device_names=tuple(device.names) if device is not None else (),
        topology=_topology(spec.topology),
        origin=origin,
    )


def _topology(table: TopologyTable | None) -> NodeTopology | None:
    if table is None:
        return None
    tiers = tuple(
        TopologyTier(
            t.kind,
            t.island,
            t.name if t.name is not None else t.kind,
            _cost(t.all_to_all),
            _cost(t.send_recv),
            t.peer_to_peer,
        )
        for t in table.tiers
    )
    return NodeTopology(tiers, table.source)
