"""The runtime hardware profile: what the cost model needs to know about a system.

Its fields (compute, memory, links in nccl-tests terms, overheads): docs/design.md section 2."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    SerializationInfo,
    Strict,
    ValidationInfo,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import core_schema

from cpbench.config.file_schema import problem, rule
from cpbench.config.problem import check_choice
from cpbench.config.vocabulary import (
    DTYPES,
    KERNEL_ALIASES,
    KERNEL_FAMILIES,
    KERNEL_NAMES,
    KernelFamily,
    canonical_dtype,
)
from cpbench.errors import CpbenchError
from cpbench.model.formulas import CollectiveKind
from cpbench.units import GB, GIB

PROFILE_SCHEMA_VERSION = 1
"""Layout version of a profile file (`schema_version`)."""
CONFIG = ConfigDict(
    extra="forbid", use_attribute_docstrings=True, validate_by_name=True, validate_by_alias=True
)
"""Each class below is both the runtime object and its TOML table: unknown keys rejected, the
scalars strict (`Strict` in the types below), a field's docstring its description."""


def from_file(info: ValidationInfo | SerializationInfo) -> bool:
    """Whether a validation or a dump is of the TOML file (context `{"file": True}`): file
    numbers are in the file's units, and file-only checks and migrations apply."""
    return isinstance(info.context, Mapping) and bool(info.context.get("file"))


@dataclasses.dataclass(frozen=True)
class Scaled:
    """An `Annotated` marker of a number that a file states in units of `scale` x the field's
    (latency_us of latency_s: 1e-6)."""

    scale: float

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        scale = self.scale

        def load(value: Any, info: ValidationInfo) -> Any:
            return value * scale if from_file(info) and value is not None else value

        def dump(value: Any, info: SerializationInfo) -> Any:
            return value / scale if from_file(info) and value is not None else value

        return core_schema.with_info_after_validator_function(
            load, handler(source),
            serialization=core_schema.plain_serializer_function_ser_schema(dump, info_arg=True),
        )


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


Text = Annotated[str, Strict()]
PositiveNumber = Annotated[float, Strict(), Field(gt=0), rule("must be a positive number")]
NonNegativeNumber = Annotated[float, Strict(), Field(ge=0), rule("must be a number >= 0")]
UnitInterval = Annotated[float, Strict(), Field(ge=0, le=1), rule("must be a number in [0, 1]")]
PositiveInteger = Annotated[int, Strict(), Field(gt=0), rule("must be a positive integer")]
Strings = Annotated[tuple[Text, ...], BeforeValidator(_tuple), rule("must be a list of strings")]

DeviceKind = Literal["cpu", "cuda"]
"""What a profile's ranks run on."""
DEVICE_KINDS: tuple[DeviceKind, ...] = get_args(DeviceKind)

LinkBasis = Literal["measured", "measured_elsewhere", "spec", "estimate"]
"""What a link cost rests on: measured on this kind of machine (nccl-tests rows, `cpbench
probe`, a calibration), measured on another machine with the same path (a transfer),
derived from a specification (line rate), or an estimate."""
LinkTier = Literal["intra_node", "inter_node"]
LINK_TIERS: tuple[LinkTier, ...] = get_args(LinkTier)
COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = get_args(CollectiveKind)


def collective_kind(kind: str) -> CollectiveKind:
    """`kind` as a collective kind; CpbenchError naming the kinds when it is none."""
    return check_choice("collective kind", kind, COLLECTIVE_KINDS)


@dataclass(frozen=True, config=CONFIG)
class LinkCost:
    """Latency and bus bandwidth of one collective kind on one link tier (`[links.<tier>.<kind>]`,
    in microseconds and GB/s)."""

    latency_s: Annotated[NonNegativeNumber, Field(alias="latency_us"), Scaled(1e-6)]
    """alpha: fixed time per call (per ring exchange), seconds."""
    busbw: Annotated[PositiveNumber, Field(alias="busbw_GBps"), Scaled(GB)]
    """nccl-tests bus bandwidth, bytes/s (all-to-all: algbw x (n-1)/n; send/recv: algbw)."""
    source: Text = ""
    """Where the numbers come from (datasheet, nccl-tests figure, estimate, calibration)."""
    fit_residual: NonNegativeNumber | None = None
    """RMS relative residual of the fit that measured them (`cpbench probe`); None: not fitted."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_residual(cls, data: Any) -> Any:
        """Probe profiles written before `fit_residual` state it in the source only."""
        if not isinstance(data, Mapping) or "fit_residual" in data:
            return data
        found = re.search(r"RMS residual (\d+(?:\.\d+)?)%", str(data.get("source", "")))
        return {**data, "fit_residual": float(found.group(1)) / 100} if found else data

    @property
    def basis(self) -> LinkBasis:
        """What the numbers rest on, read from `source` (`LinkBasis`): a `cpbench probe` fit
        or a calibration is `measured`, as is a source starting 'measured:'; 'measured
        elsewhere:' is `measured_elsewhere`, 'spec:' `spec`, anything else `estimate`."""
        text = self.source.strip().lower()
        if self.fit_residual is not None or text.startswith(("measured:", "measured by",
                                                             "calibrated")):
            return "measured"
        if text.startswith("measured elsewhere"):
            return "measured_elsewhere"
        return "spec" if text.startswith("spec") else "estimate"

    def seconds(self, bytes_sent: float, calls: int = 1, sharing: int = 1) -> float:
        """Time of `calls` calls that send `bytes_sent` bytes per rank in all.

        `bytes_sent` excludes a rank's own all-to-all part (formulas.py's counting), which is
        exactly what busbw divides; `sharing` ranks share the link (a NIC), each getting
        `busbw / sharing`.
        """
        if calls <= 0 and bytes_sent <= 0:
            return 0.0
        return calls * self.latency_s + bytes_sent * sharing / self.busbw


@dataclass(frozen=True, config=CONFIG)
class LinkTierProfile:
    """One link tier: inside a node or across nodes (`[links.<tier>]`)."""

    tier: Annotated[LinkTier, Field(exclude=True)]
    """intra_node or inter_node (the file's table name)."""
    name: Text
    """The technology, e.g. 'NVLink 4 + NVSwitch' or 'InfiniBand NDR 400 Gb/s per NIC'
    (absent from a file: the tier's name)."""
    all_to_all: LinkCost
    """Latency and busbw of an all-to-all on this tier."""
    send_recv: LinkCost
    """Latency and busbw of a ring send/recv on this tier."""
    devices_per_nic: PositiveInteger = 1
    """Ranks sharing one endpoint of the tier (a NIC across nodes; 1 inside a node)."""

    def cost(self, kind: CollectiveKind) -> LinkCost:
        """The LinkCost of a collective kind."""
        return self.all_to_all if collective_kind(kind) == "all_to_all" else self.send_recv


@dataclass(frozen=True, config=CONFIG)
class Links:
    """`[links]`: both tiers."""

    intra_node: LinkTierProfile
    """Links between devices of one node."""
    inter_node: LinkTierProfile
    """Links between nodes (per NIC)."""

    @model_validator(mode="before")
    @classmethod
    def _tiers(cls, data: Any) -> Any:
        """A file's tier tables get their tier (and name, when absent) from their key."""
        if not isinstance(data, Mapping):
            return data
        return {k: {"name": k, **v, "tier": k} if isinstance(v, Mapping) else v
                for k, v in data.items()}


TierKind = Literal["nvlink", "pcie_switch", "host_bridge", "numa_node", "socket", "network"]
"""What joins the islands of a topology tier: an NVLink/NVSwitch domain, a PCIe switch, a PCIe
host bridge (one root complex), the interconnect between host bridges of one NUMA node, the
socket interconnect (UPI/Infinity Fabric), the network between nodes."""
TIER_KINDS: tuple[TierKind, ...] = get_args(TierKind)


@dataclass(frozen=True, config=CONFIG)
class TopologyTier:
    """One tier of a node's topology (`[[topology.tiers]]`): it joins islands of the tier below
    into islands of `island` devices (devices 0..island-1 form the first island, in device
    order).

    A message between two devices whose smallest common island is at tier t crosses the links
    of every tier <= t. `busbw` is per device when every device of an island of the tier
    below sends across this tier at once (nccl-tests' busbw of a collective that this tier
    bounds); a tier's links are shared by the ranks of that lower island that cross it.
    """

    kind: Annotated[TierKind, rule(f"must be one of {', '.join(TIER_KINDS)}")]
    """What joins the islands (`TierKind`)."""
    island: PositiveInteger
    """Devices per island at this tier; strictly increasing up the tiers."""
    name: Text
    """The technology, e.g. 'PCIe Gen4 x16 to a PCIe switch' (absent from a file: the kind)."""
    all_to_all: LinkCost
    """Latency and per-device busbw of all-to-all traffic across this tier."""
    send_recv: LinkCost
    """Latency and per-device busbw of ring send/recv traffic across this tier."""
    peer_to_peer: Annotated[bool, Strict()] = True
    """Whether GPU peer-to-peer works across this tier (False: staged through host memory;
    the bandwidths already say what that costs)."""

    @model_validator(mode="before")
    @classmethod
    def _name(cls, data: Any) -> Any:
        return {"name": data.get("kind"), **data} if isinstance(data, Mapping) else data

    def cost(self, kind: CollectiveKind) -> LinkCost:
        """The LinkCost of a collective kind."""
        return self.all_to_all if collective_kind(kind) == "all_to_all" else self.send_recv


@dataclass(frozen=True, config=CONFIG)
class NodeTopology:
    """The tiers inside one node (`[topology]`), innermost first; the last tier's island is the
    node. Across nodes the profile's `inter_node` tier applies."""

    tiers: Annotated[tuple[TopologyTier, ...], BeforeValidator(_tuple), Field(min_length=1)]
    """Tiers, innermost first; islands nest (each tier's island a multiple of the one below)."""
    source: Text = ""
    """Where the layout comes from (a datasheet, `cpbench doctor`, `cpbench probe`)."""

    @model_validator(mode="after")
    def _nested(self, info: ValidationInfo) -> NodeTopology:
        sizes = [t.island for t in self.tiers]
        for below, above in zip(sizes, sizes[1:], strict=False):
            if from_file(info) and (above <= below or above % below):
                raise problem(
                    f"islands must nest: each tier's island a larger multiple of the one "
                    f"below, got {sizes} ({above} after {below})",
                    "",
                )
        return self


def _increasing(values: tuple[int, ...]) -> tuple[int, ...]:
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise problem(f"must be strictly increasing, got {list(values)}")
    return values


def _at_most_one_in_file(value: float, info: ValidationInfo) -> float:
    """A file's efficiency is at most 1 (a measured one, e.g. against a too low peak, may not)."""
    if from_file(info) and value > 1:
        raise problem("above 1")
    return value


@dataclass(frozen=True, config=CONFIG)
class EfficiencyCurve:
    """Attention-kernel efficiency (achieved / peak FLOP/s) over the kernel's sequence length
    (`[efficiency.<family>]`).

    Interpolated linearly in log2(sequence length) between the points, constant outside them.
    """

    seq_lens: Annotated[
        tuple[Annotated[int, Strict(), Field(gt=0), rule("must hold positive integers")], ...],
        BeforeValidator(_tuple),
        Field(alias="seq_len", min_length=1),
        AfterValidator(_increasing),
    ]
    """Kernel sequence lengths (L/R tokens of a ring shard), strictly increasing."""
    values: Annotated[
        tuple[
            Annotated[
                float, Strict(), Field(gt=0), AfterValidator(_at_most_one_in_file),
                rule("must hold numbers in (0, 1]"),
            ],
            ...,
        ],
        BeforeValidator(_tuple),
        Field(alias="efficiency", min_length=1),
    ]
    """Efficiency at each length, in (0, 1] in a file."""
    source: Text = ""
    """Where the curve comes from."""

    @model_validator(mode="after")
    def _same_length(self) -> EfficiencyCurve:
        if len(self.seq_lens) != len(self.values):
            raise problem(
                f"seq_len ({len(self.seq_lens)} values) and efficiency "
                f"({len(self.values)} values) differ in length"
            )
        return self

    def at(self, seq_len: float) -> float:
        """Efficiency at a kernel sequence length."""
        if seq_len <= self.seq_lens[0]:
            return self.values[0]
        if seq_len >= self.seq_lens[-1]:
            return self.values[-1]
        i = bisect.bisect_left(self.seq_lens, seq_len)  # seq_lens[i - 1] < seq_len <= seq_lens[i]
        x0, x1 = math.log2(self.seq_lens[i - 1]), math.log2(self.seq_lens[i])
        y0, y1 = self.values[i - 1], self.values[i]
        return y0 + (y1 - y0) * (math.log2(seq_len) - x0) / (x1 - x0)


@dataclass(frozen=True, config=CONFIG)
class KernelCurves:
    """`[efficiency]`: the attention-kernel efficiency curve of each kernel family that has one
    (`[efficiency.flash_attn]`, ...), and which of them `auto` runs."""

    default: Annotated[KernelFamily, rule(f"must be one of {', '.join(KERNEL_FAMILIES)}")]
    """The family `auto` runs on this device in fp16/bf16 (it must have a curve); families
    without a curve read this one's."""
    source: Text = ""
    """Why that family is the default."""
    flash_attn: EfficiencyCurve | None = None
    """FlashAttention-2 (flash-attn 2.x)."""
    flash_attn3: EfficiencyCurve | None = None
    """FlashAttention-3 (flash-attn's Hopper build, flash_attn_interface)."""
    cudnn: EfficiencyCurve | None = None
    """cuDNN fused attention (PyTorch's cuDNN SDPA op)."""
    cuda_sdpa: EfficiencyCurve | None = None
    """PyTorch's CUDA SDPA op (its vendored FlashAttention-2)."""
    cpu_sdpa: EfficiencyCurve | None = None
    """PyTorch's CPU SDPA op."""
    einsum: EfficiencyCurve | None = None
    """The einsum kernel (materialises the scores)."""

    @model_validator(mode="after")
    def _default_has_a_curve(self) -> KernelCurves:
        if self.given.get(self.default) is None:
            given = ", ".join(self.given) or "none"
            raise problem(
                f"default {self.default!r} has no [efficiency.{self.default}] curve "
                f"(curves given: {given})",
                "",
            )
        return self

    @functools.cached_property
    def given(self) -> dict[str, EfficiencyCurve]:
        """The given curves by family, in `KERNEL_FAMILIES` order."""
        found = {family: getattr(self, family) for family in KERNEL_FAMILIES}
        return {family: curve for family, curve in found.items() if curve is not None}


@dataclass(frozen=True, config=CONFIG)
class CalibrationInfo:
    """How a calibrated profile was fitted (`[calibration]`; absent from datasheet profiles)."""

    prior: Text
    """Name of the profile the fit started from."""
    points: PositiveInteger
    """Measured configurations used."""
    residual: NonNegativeNumber
    """Root-mean-square relative error of the fitted step times on those points."""
    files: Strings = ()
    """Results files the measurements came from."""


@dataclass(frozen=True, config=CONFIG)
class MemoryTable:
    """`[memory]`: capacity and bandwidth of one device's memory."""

    capacity_gib: PositiveNumber
    """Capacity per device, GiB (HBM, or a CPU rank's share of RAM)."""
    bandwidth: Annotated[PositiveNumber, Field(alias="bandwidth_GBps"), Scaled(GB)]
    """Bandwidth in bytes/s (GB/s in the file; the ring's fp32 merges and accumulations are
    memory-bound)."""
    source: Text = ""
    """Where the numbers come from."""


@dataclass(frozen=True, config=CONFIG)
class Peaks:
    """`[peak_tflops]`: peak dense TFLOP/s per dtype (at least one)."""

    bfloat16: PositiveNumber | None = None
    """Peak TFLOP/s in bfloat16 (absent: unknown)."""
    float16: PositiveNumber | None = None
    """Peak TFLOP/s in float16."""
    float32: PositiveNumber | None = None
    """Peak TFLOP/s in float32."""
    source: Text = ""
    """Where the peaks come from."""

    @model_validator(mode="after")
    def _one_peak(self) -> Peaks:
        if not self.given:
            raise problem(f"needs at least one of {', '.join(DTYPES)}")
        return self

    @functools.cached_property
    def given(self) -> dict[str, float]:
        """The given peaks by dtype."""
        found = {dtype: getattr(self, dtype) for dtype in DTYPES}
        return {dtype: peak for dtype, peak in found.items() if peak is not None}


@dataclass(frozen=True, config=CONFIG)
class Overheads:
    """`[overheads]`: fixed time per ring step and the overlap of a step."""

    step_overhead_s: Annotated[NonNegativeNumber, Field(alias="step_overhead_us"), Scaled(1e-6)]
    """Fixed time per ring step (its kernel calls' launch, merge, bookkeeping), seconds."""
    overlap: UnitInterval
    """Fraction of min(compute, comm) of a ring step hidden behind the longer one (0..1)."""
    call_overhead_s: Annotated[
        NonNegativeNumber, Field(alias="call_overhead_us"), Scaled(1e-6)
    ] = 0.0
    """Fixed time per kernel call beyond those of one document's schedule (the extra pieces
    of a packed document mask or a window: launch, slicing, merge), seconds per pass; 0 where
    it was not measured (`cpbench calibrate` fits it from document-masked measurements)."""
    source: Text = ""
    """Where the overhead and overlap numbers come from."""


def _patterns(values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        try:
            re.compile(value)
        except re.error as exc:
            raise problem(f"must hold regular expressions; {value!r} is not one ({exc})") from None
    return values


@dataclass(frozen=True, config=CONFIG)
class DeviceTable:
    """`[device]`: the devices the profile describes."""

    kind: Annotated[DeviceKind, rule(f"must be one of {', '.join(DEVICE_KINDS)}")]
    """What the ranks run on: cpu or cuda."""
    names: Annotated[Strings, AfterValidator(_patterns)] = ()
    """Case-insensitive regular expressions, one of which matches the name of a device this
    profile describes (as torch.cuda.get_device_name or a record's environment.devices spell
    it), e.g. `\\bH200\\b`."""
    source: Text = ""
    """Where the names come from."""


@dataclass(frozen=True, config=CONFIG, kw_only=True)
class HardwareProfile:
    """Everything the cost model needs about a system, and its TOML file; see docs/design.md
    section 2."""

    schema_version: Annotated[
        int,
        Strict(),
        Field(ge=PROFILE_SCHEMA_VERSION, le=PROFILE_SCHEMA_VERSION),
        rule(f"must be {PROFILE_SCHEMA_VERSION}"),
    ] = dataclasses.field(default=PROFILE_SCHEMA_VERSION, compare=False)
    """Layout version of the file."""
    name: Text
    """Short identifier, e.g. h100-sxm."""
    description: Text = ""
    """One line: device, node, links."""
    devices_per_node: PositiveInteger
    """Devices (ranks) in a node: the default of --gpus-per-node."""
    compute_slots_per_node: PositiveInteger | None = None
    """Ranks of a node that can compute at full speed at once (CPU cores); None = every rank.
    More ranks than slots share them."""
    device: DeviceTable = DeviceTable("cuda")
    """The devices it describes (absent from a file: cuda, matching no device name)."""
    memory: MemoryTable
    """Device memory."""
    peaks: Annotated[Peaks, Field(alias="peak_tflops")]
    """Peak dense TFLOP/s per dtype."""
    kernels: Annotated[KernelCurves, Field(alias="efficiency")]
    """Attention-kernel efficiency curves per kernel family."""
    overheads: Overheads
    """Per-step overhead and overlap."""
    links: Links
    """The two link tiers."""
    topology: NodeTopology | None = None
    """The tiers inside a node; None = a flat node, one island joined by `intra_node` (the
    cost model's formulas of before topologies)."""
    calibration: CalibrationInfo | None = None
    """Set on profiles fitted to measurements."""
    origin: Annotated[Text, Field(exclude=True)] = dataclasses.field(
        default="built-in", compare=False
    )
    """Where it was loaded from: 'built-in' or a file path (not a key of the file)."""

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

    @model_validator(mode="after")
    def _topology_is_the_node(self, info: ValidationInfo) -> HardwareProfile:
        last = self.topology.tiers[-1].island if self.topology is not None else None
        if from_file(info) and last is not None and last != self.devices_per_node:
            raise problem(
                f"outermost island ({last} devices) must be the node: devices_per_node is "
                f"{self.devices_per_node}",
                "",
            )
        return self

    @property
    def memory_bytes(self) -> float:
        """Memory capacity per device in bytes."""
        return self.memory.capacity_gib * GIB

    @property
    def memory_bandwidth(self) -> float:
        """Device memory bandwidth in bytes/s."""
        return self.memory.bandwidth

    @property
    def peak_tflops(self) -> dict[str, float]:
        """Peak dense TFLOP/s per canonical dtype name."""
        return self.peaks.given

    @property
    def step_overhead_s(self) -> float:
        """Fixed time per ring step, seconds."""
        return self.overheads.step_overhead_s

    @property
    def call_overhead_s(self) -> float:
        """Fixed time per kernel call beyond one document's schedule, seconds per pass."""
        return self.overheads.call_overhead_s

    @property
    def overlap(self) -> float:
        """Fraction of min(compute, comm) of a ring step hidden behind the longer one."""
        return self.overheads.overlap

    @property
    def intra_node(self) -> LinkTierProfile:
        """Links between devices of one node."""
        return self.links.intra_node

    @property
    def inter_node(self) -> LinkTierProfile:
        """Links between nodes (per NIC)."""
        return self.links.inter_node

    @property
    def device_kind(self) -> DeviceKind:
        """What the ranks run on: cpu or cuda."""
        return self.device.kind

    @property
    def default_kernel(self) -> KernelFamily:
        """The family `auto` runs on this device in 16-bit (the family of `efficiency`)."""
        return self.kernels.default

    @property
    def efficiency(self) -> EfficiencyCurve:
        """Efficiency curve of the default kernel family (`default_kernel`)."""
        return self.kernels.given[self.kernels.default]

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s of a dtype."""
        key = canonical_dtype(dtype)
        peaks = self.peak_tflops
        if key not in peaks:
            known = ", ".join(sorted(peaks))
            raise CpbenchError(
                f"hardware profile {self.name!r} has no peak TFLOP/s for {key} (it has {known})"
            )
        return peaks[key] * 1e12

    def has_curve(self, family: str) -> bool:
        """Whether the profile has a curve of its own for `family`."""
        return family in self.kernels.given

    def curve(self, family: str | None = None) -> EfficiencyCurve:
        """The curve of a family (None: the default); a family without one reads the default
        family's curve (`has_curve` tells which)."""
        given = self.kernels.given
        return given.get(family, given[self.kernels.default]) if family else self.efficiency

    def kernel_for(self, kernel: str = "auto", dtype: str = "bfloat16") -> KernelFamily:
        """The family a kernel name runs on this profile's device: `auto` is what cpbench's
        `auto` chooses there (cpu: CPU SDPA; cuda: the default family in fp16/bf16, PyTorch's
        SDPA in float32), `sdpa` PyTorch's op of the device; CpbenchError on unknown names."""
        return resolve_kernel_family(kernel, self.device_kind, self.default_kernel, dtype)

    def matches_device(self, device_name: str) -> bool:
        """Whether one of `device.names` matches a device name (case-insensitive search)."""
        return any(re.search(p, device_name, re.IGNORECASE) for p in self.device.names)

    def node_tiers(self) -> tuple[TopologyTier, ...]:
        """The tiers inside a node: the `[topology]` tiers, or for a flat node one tier of
        `devices_per_node` devices with the `intra_node` costs."""
        if self.topology is not None:
            return self.topology.tiers
        intra = self.intra_node
        return (
            TopologyTier(
                "nvlink" if "nvlink" in intra.name.lower() else "pcie_switch",
                self.devices_per_node,
                intra.name,
                intra.all_to_all,
                intra.send_recv,
            ),
        )

    def link(self, tier: LinkTier) -> LinkTierProfile:
        """The profile of a link tier."""
        known = check_choice("link tier", tier, LINK_TIERS)
        return self.intra_node if known == "intra_node" else self.inter_node


def migrated_family(data: Mapping[str, Any]) -> KernelFamily:
    """The family a single-curve file's curve is filed under (see `HardwareProfile`)."""
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


def resolve_kernel_family(
    kernel: str, device: str, default: str = "flash_attn", dtype: str = "bfloat16"
) -> KernelFamily:
    """The family a kernel name runs on a device (see `HardwareProfile.kernel_for`); `default`
    is what `auto` runs there in fp16/bf16. CpbenchError naming the value and the choices."""
    name = str(kernel).strip().lower()
    if name == "auto":
        if device == "cpu":
            return "cpu_sdpa"
        if canonical_dtype(dtype) == "float32":
            return "cuda_sdpa"
        return kernel_family(default)
    if name == "sdpa":
        return "cpu_sdpa" if device == "cpu" else "cuda_sdpa"
    if name in KERNEL_ALIASES:
        return KERNEL_ALIASES[name]
    if name in KERNEL_FAMILIES:
        return kernel_family(name)
    raise CpbenchError(
        f"kernel {kernel!r} is not one of {', '.join(KERNEL_NAMES)}: the cost model has no "
        f"efficiency family for it"
    )


def kernel_family(name: str) -> KernelFamily:
    """`name` as a kernel family (no aliases); CpbenchError naming the families."""
    return check_choice("kernel family", name, KERNEL_FAMILIES)
