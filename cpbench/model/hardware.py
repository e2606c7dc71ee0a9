"""Hardware profiles: what the cost model needs to know about a system. Pure Python.

A profile describes one kind of device and the two link tiers between devices:

- compute: peak dense TFLOP/s per dtype (vendor datasheet) and, per attention-kernel family
  (`KERNEL_FAMILIES`: FlashAttention-2, FlashAttention-3, cuDNN, PyTorch's CUDA or CPU SDPA,
  einsum), an efficiency curve over the kernel's sequence length (the `L/R` tokens of a ring
  shard that one kernel call works on): achieved attention FLOP/s = peak x efficiency(L/R) of
  the family the configuration runs (`HardwareProfile.kernel_for`: `auto` is the profile's
  default family on its device); a family without a curve uses the default family's curve;
- device: which devices the profile describes (`cpu` or `cuda`, and regular expressions matched
  against the device names records carry), so that `profile_for_devices` finds the profile of
  a results file;
- memory: capacity per device (HBM, or the share of RAM for a CPU rank) and its bandwidth
  (the ring's fp32 merges and gradient accumulations are memory-bound);
- links: `intra_node` (NVLink, PCIe, loopback) and `inter_node` (InfiniBand/RoCE per NIC), each
  with a latency and a bus bandwidth for all-to-all and for send/recv separately, in nccl-tests
  terms (`busbw`): an all-to-all call of `size` bytes over `n` ranks takes
  `latency + size*(n-1)/n / busbw` = `latency + bytes a rank sends / busbw`; a send/recv of a
  message of `size` bytes (each rank sends to its next and receives from its previous, the ring
  pattern of nccl-tests' sendrecv_perf) takes `latency + size / busbw`. `devices_per_nic`
  ranks share one inter-node NIC, so each gets `busbw / devices_per_nic` when all send at once;
- topology (optional `[topology]`, `NodeTopology`): the tiers inside a node, innermost first
  (`TierKind`: NVLink domain, PCIe switch, host bridge, NUMA node, socket interconnect), each
  joining islands of the tier below into islands of `island` devices, with all-to-all and
  send/recv latency and per-device busbw across it and whether GPU peer-to-peer works across
  it; `cpbench.model.topology` prices collectives on it. Without one the node is flat: one
  island joined by `intra_node` (`HardwareProfile.node_tiers`);
- overheads: a fixed time per ring step and kernel call (launches, the online-softmax merge),
  and the overlap efficiency of a ring step (fraction of the shorter of compute and
  communication that is hidden behind the longer).

Built-in profiles are TOML files in `cpbench/data/hardware/`; every number carries its source.
A user file with the same layout is accepted wherever a name is (`--hardware PATH`). The layout
is the pydantic model `ProfileFile` (strict types, no unknown keys; errors read
`hardware profile <file>: <key> <rule>, got <value>`); `profile_to_toml` writes it with tomli-w.
Files written before kernel families (one `[kernel_efficiency]` curve for every kernel) still
load: the curve becomes the default family's, so every kernel reads it, as before.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import tomli_w
from pydantic import AfterValidator, Field, ValidationError, model_validator

from cpbench.config.file_schema import MESSAGE, RULE, FileModel, problem, rule, table_at
from cpbench.config.vocabulary import DTYPES
from cpbench.errors import CpbenchError
from cpbench.model.formulas import CollectiveKind, canonical_dtype
from cpbench.units import GB, GIB

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KernelFamily = Literal["flash_attn", "flash_attn3", "cudnn", "cuda_sdpa", "cpu_sdpa", "einsum"]
"""An attention-kernel family the profiles give efficiency curves for: FlashAttention-2
(flash-attn 2.x), FlashAttention-3 (flash-attn's Hopper build), cuDNN's fused attention,
PyTorch's CUDA SDPA op (FA2 code vendored in PyTorch), PyTorch's CPU SDPA op, and the einsum
kernel that materialises the scores."""
KERNEL_FAMILIES: tuple[KernelFamily, ...] = get_args(KernelFamily)
DeviceKind = Literal["cpu", "cuda"]
"""What a profile's ranks run on."""
DEVICE_KINDS: tuple[DeviceKind, ...] = get_args(DeviceKind)
KERNEL_ALIASES: dict[str, KernelFamily] = {
    "naive": "einsum",
    "fa2": "flash_attn",
    "flash_attn2": "flash_attn",
    "flash_attn_2": "flash_attn",
    "fa3": "flash_attn3",
    "flash_attn_3": "flash_attn3",
    "flash_attn_interface": "flash_attn3",
    "cudnn_attention": "cudnn",
    "cudnn_sdpa": "cudnn",
    "efficient": "cuda_sdpa",  # memory-efficient SDPA (fp32 on CUDA): no published curve;
    # an estimate by the closest family (PyTorch's CUDA SDPA)
}
"""Kernel names (`--kernel`, a record's `config.kernel`) that name a family under another
spelling; `sdpa` is `cuda_sdpa` or `cpu_sdpa` by the profile's device, `auto` its default."""
KERNEL_NAMES: tuple[str, ...] = ("auto", "sdpa", *KERNEL_FAMILIES, *KERNEL_ALIASES)
"""Every kernel name `HardwareProfile.kernel_for` resolves."""
FALLBACK_GPU_PROFILE = "h100-sxm"
"""The profile of GPU records whose device no built-in profile matches (with a warning)."""

LinkTier = Literal["intra_node", "inter_node"]
LINK_TIERS: tuple[LinkTier, ...] = get_args(LinkTier)
COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = get_args(CollectiveKind)
PROFILE_SCHEMA_VERSION = 1
"""nccl-tests reports GB/s with GB = 1e9 bytes."""

_DATA_PACKAGE = "cpbench"


# ------------------------------------------------------------------------------ dataclasses


@dataclass(frozen=True)
class LinkCost:
    """Latency and bus bandwidth of one collective kind on one link tier."""

    latency_s: float
    """alpha: fixed time per call (per ring exchange), seconds."""
    busbw: float
    """nccl-tests bus bandwidth, bytes/s (all-to-all: algbw x (n-1)/n; send/recv: algbw)."""
    source: str = ""
    """Where the numbers come from (datasheet, nccl-tests figure, estimate, calibration)."""
    fit_residual: float | None = None
    """RMS relative residual of the fit that measured them (`cpbench probe`); None: not fitted."""

    def seconds(self, bytes_sent: float, calls: int = 1, sharing: int = 1) -> float:
        """Time of `calls` calls that send `bytes_sent` bytes per rank in all.

        `bytes_sent` excludes a rank's own all-to-all part (formulas.py's counting), which is
        exactly what busbw divides; `sharing` ranks share the link (a NIC), each getting
        `busbw / sharing`.
        """
        if calls <= 0 and bytes_sent <= 0:
            return 0.0
        return calls * self.latency_s + bytes_sent * sharing / self.busbw


@dataclass(frozen=True)
class LinkTierProfile:
    """One link tier: inside a node or across nodes."""

    tier: LinkTier
    """intra_node or inter_node."""
    name: str
    """The technology, e.g. 'NVLink 4 + NVSwitch' or 'InfiniBand NDR 400 Gb/s per NIC'."""
    all_to_all: LinkCost
    """Latency and busbw of an all-to-all on this tier."""
    send_recv: LinkCost
    """Latency and busbw of a ring send/recv on this tier."""
    devices_per_nic: int = 1
    """Ranks sharing one endpoint of the tier (a NIC across nodes; 1 inside a node)."""

    def cost(self, kind: CollectiveKind) -> LinkCost:
        """The LinkCost of a collective kind."""
        if kind == "all_to_all":
            return self.all_to_all
        if kind == "send_recv":
            return self.send_recv
        raise CpbenchError(f"collective kind {kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")

    def effective_busbw(self, kind: CollectiveKind) -> float:
        """Bytes/s one rank gets when every rank of the node uses the tier at once."""
        return self.cost(kind).busbw / self.devices_per_nic


TierKind = Literal["nvlink", "pcie_switch", "host_bridge", "numa_node", "socket", "network"]
"""What joins the islands of a topology tier: an NVLink/NVSwitch domain, a PCIe switch, a PCIe
host bridge (one root complex), the interconnect between host bridges of one NUMA node, the
socket interconnect (UPI/Infinity Fabric), the network between nodes."""
TIER_KINDS: tuple[TierKind, ...] = get_args(TierKind)


@dataclass(frozen=True)
class TopologyTier:
    """One tier of a node's topology: it joins islands of the tier below into islands of
    `island` devices (devices 0..island-1 form the first island, in device order).

    A message between two devices whose smallest common island is at tier t crosses the links
    of every tier <= t. `busbw` is per device when every device of an island of the tier
    below sends across this tier at once (nccl-tests' busbw of a collective that this tier
    bounds); a tier's links are shared by the ranks of that lower island that cross it.
    """

    kind: TierKind
    """What joins the islands (`TierKind`)."""
    island: int
    """Devices per island at this tier; strictly increasing up the tiers."""
    name: str
    """The technology, e.g. 'PCIe Gen4 x16 to a PCIe switch'."""
    all_to_all: LinkCost
    """Latency and per-device busbw of all-to-all traffic across this tier."""
    send_recv: LinkCost
    """Latency and per-device busbw of ring send/recv traffic across this tier."""
    peer_to_peer: bool = True
    """Whether GPU peer-to-peer works across this tier (False: staged through host memory;
    the bandwidths already say what that costs)."""

    def cost(self, kind: CollectiveKind) -> LinkCost:
        """The LinkCost of a collective kind."""
        if kind == "all_to_all":
            return self.all_to_all
        if kind == "send_recv":
            return self.send_recv
        raise CpbenchError(f"collective kind {kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")


@dataclass(frozen=True)
class NodeTopology:
    """The tiers inside one node, innermost first; the last tier's island is the node. Across
    nodes the profile's `inter_node` tier applies."""

    tiers: tuple[TopologyTier, ...]
    """Tiers, innermost first."""
    source: str = ""
    """Where the layout comes from (a datasheet, `cpbench doctor`, `cpbench probe`)."""


@dataclass(frozen=True)
class EfficiencyCurve:
    """Attention-kernel efficiency (achieved / peak FLOP/s) over the kernel's sequence length.

    Interpolated linearly in log2(sequence length) between the points, constant outside them.
    """

    seq_lens: tuple[int, ...]
    """Kernel sequence lengths (L/R tokens of a ring shard), strictly increasing."""
    values: tuple[float, ...]
    """Efficiency at each length, in (0, 1]."""
    source: str = ""
    """Where the curve comes from."""

    def at(self, seq_len: float) -> float:
        """Efficiency at a kernel sequence length."""
        if seq_len <= self.seq_lens[0]:
            return self.values[0]
        if seq_len >= self.seq_lens[-1]:
            return self.values[-1]
        x = math.log2(seq_len)
        for i in range(1, len(self.seq_lens)):
            if seq_len <= self.seq_lens[i]:
                x0, x1 = math.log2(self.seq_lens[i - 1]), math.log2(self.seq_lens[i])
                y0, y1 = self.values[i - 1], self.values[i]
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return self.values[-1]  # unreachable


@dataclass(frozen=True)
class CalibrationInfo:
    """How a calibrated profile was fitted (absent from datasheet profiles)."""

    prior: str
    """Name of the profile the fit started from."""
    points: int
    """Measured configurations used."""
    residual: float
    """Root-mean-square relative error of the fitted step times on those points."""
    files: tuple[str, ...] = ()
    """Results files the measurements came from."""


@dataclass(frozen=True)
class HardwareProfile:
    """Everything the cost model needs about a system; see the module docstring."""

    name: str
    """Short identifier, e.g. h100-sxm."""
    description: str
    """One line: device, node, links."""
    devices_per_node: int
    """Devices (ranks) in a node: the default of --gpus-per-node."""
    memory_gib: float
    """Memory capacity per device in GiB."""
    memory_source: str
    """Where the capacity comes from."""
    memory_bandwidth: float
    """Device memory bandwidth in bytes/s (the ring's fp32 merges and accumulations are
    memory-bound)."""
    peak_tflops: dict[str, float]
    """Peak dense TFLOP/s per canonical dtype name."""
    peak_source: str
    """Where the peaks come from."""
    efficiency: EfficiencyCurve
    """Efficiency curve of the default kernel family (`default_kernel`)."""
    step_overhead_s: float
    """Fixed time per ring step and kernel call (launch, merge, bookkeeping), seconds."""
    overlap: float
    """Fraction of min(compute, comm) of a ring step hidden behind the longer one (0..1)."""
    overheads_source: str
    """Where the overhead and overlap numbers come from."""
    intra_node: LinkTierProfile
    """Links between devices of one node."""
    inter_node: LinkTierProfile
    """Links between nodes (per NIC)."""
    compute_slots_per_node: int | None = None
    """Ranks of a node that can compute at full speed at once (CPU cores); None = every rank.
    More ranks than slots share them."""
    calibration: CalibrationInfo | None = None
    """Set on profiles fitted to measurements."""
    default_kernel: KernelFamily = "flash_attn"
    """The family `auto` runs on this device in 16-bit (the family of `efficiency`)."""
    default_kernel_source: str = ""
    """Why that family is the default."""
    kernel_curves: Mapping[str, EfficiencyCurve] = field(default_factory=dict)
    """Efficiency curves of the other kernel families, by family (`KernelFamily`)."""
    device_kind: DeviceKind = "cuda"
    """What the ranks run on: cpu or cuda."""
    device_names: tuple[str, ...] = ()
    """Case-insensitive regular expressions, one of which matches the name of a device this
    profile describes (as torch.cuda.get_device_name or a record's environment.devices spell
    it), e.g. `\\bH200\\b`."""
    topology: NodeTopology | None = None
    """The tiers inside a node (`[topology]`); None = a flat node, one island joined by
    `intra_node` (the cost model's formulas of before topologies)."""
    origin: str = field(default="built-in", compare=False)
    """Where it was loaded from: 'built-in' or a file path."""

    @property
    def memory_bytes(self) -> float:
        """Memory capacity per device in bytes."""
        return self.memory_gib * GIB

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s of a dtype."""
        key = canonical_dtype(dtype)
        if key not in self.peak_tflops:
            known = ", ".join(sorted(self.peak_tflops))
            raise CpbenchError(
                f"hardware profile {self.name!r} has no peak TFLOP/s for {key} (it has {known})"
            )
        return self.peak_tflops[key] * 1e12

    @property
    def curves(self) -> dict[str, EfficiencyCurve]:
        """Every family's curve, the default family's first."""
        others = {k: v for k, v in self.kernel_curves.items() if k != self.default_kernel}
        return {self.default_kernel: self.efficiency, **others}

    def has_curve(self, family: str) -> bool:
        """Whether the profile has a curve of its own for `family`."""
        return family == self.default_kernel or family in self.kernel_curves

    def curve(self, family: str | None = None) -> EfficiencyCurve:
        """The curve of a family (None: the default); a family without one reads the default
        family's curve (`has_curve` tells which)."""
        if family is None or family == self.default_kernel:
            return self.efficiency
        return self.kernel_curves.get(family, self.efficiency)

    def kernel_for(self, kernel: str = "auto", dtype: str = "bfloat16") -> KernelFamily:
        """The family a kernel name runs on this profile's device: `auto` is what cpbench's
        `auto` chooses there (cpu: CPU SDPA; cuda: the default family in fp16/bf16, PyTorch's
        SDPA in float32), `sdpa` PyTorch's op of the device; CpbenchError on unknown names."""
        return resolve_kernel_family(kernel, self.device_kind, self.default_kernel, dtype)

    def attention_flops_per_s(
        self, dtype: str, kernel_seq_len: float, kernel: str | None = None
    ) -> float:
        """Achieved attention FLOP/s: peak(dtype) x efficiency(kernel sequence length) of the
        kernel's family (None: the default family)."""
        family = None if kernel is None else self.kernel_for(kernel, dtype)
        return self.peak_flops(dtype) * self.curve(family).at(kernel_seq_len)

    def matches_device(self, device_name: str) -> bool:
        """Whether one of `device_names` matches a device name (case-insensitive search)."""
        return any(re.search(p, device_name, re.IGNORECASE) for p in self.device_names)

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
        if tier == "intra_node":
            return self.intra_node
        if tier == "inter_node":
            return self.inter_node
        raise CpbenchError(f"link tier {tier!r} is not one of {', '.join(LINK_TIERS)}")


# --------------------------------------------------------------------------------- kernels


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
        return _family(default)
    if name == "sdpa":
        return "cpu_sdpa" if device == "cpu" else "cuda_sdpa"
    if name in KERNEL_ALIASES:
        return KERNEL_ALIASES[name]
    if name in KERNEL_FAMILIES:
        return _family(name)
    raise CpbenchError(
        f"kernel {kernel!r} is not one of {', '.join(KERNEL_NAMES)}: the cost model has no "
        f"efficiency family for it"
    )


def _family(name: str) -> KernelFamily:
    for family in KERNEL_FAMILIES:
        if family == name:
            return family
    raise CpbenchError(f"kernel family {name!r} is not one of {', '.join(KERNEL_FAMILIES)}")


def is_kernel_name(kernel: object) -> bool:
    """Whether `kernel` is a name `resolve_kernel_family` knows (auto, sdpa, a family, an
    alias)."""
    return isinstance(kernel, str) and kernel.strip().lower() in KERNEL_NAMES


# ------------------------------------------------------------------------------- built-ins


def _data_dir() -> Any:
    return resources.files(_DATA_PACKAGE) / "data" / "hardware"


def builtin_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with cpbench, sorted."""
    folder = _data_dir()
    return tuple(
        sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))
    )


@functools.cache
def _builtin(name: str) -> HardwareProfile:
    resource = _data_dir().joinpath(f"{name}.toml")
    return profile_from_toml(resource.read_text(encoding="utf-8"), origin="built-in")


def profile_for_devices(device_names: Sequence[str]) -> str | None:
    """The built-in profile that describes every one of these device names (as records'
    `environment.devices` or torch.cuda.get_device_name spell them: 'NVIDIA H100 80GB HBM3' ->
    h100-sxm, 'NVIDIA H200' -> h200-sxm, 'NVIDIA A100-SXM4-80GB' -> a100-80gb, 'NVIDIA L40S'
    -> l40s-pcie, 'cpu: ...' -> cpu-local); None when none or more than one does (or no name
    is given). The one device -> profile rule of cpbench (report, calibrate, recommend)."""
    names = [str(n) for n in device_names if str(n).strip()]
    if not names:
        return None
    matches = [
        name
        for name in builtin_profiles()
        if all(_builtin(name).matches_device(device) for device in names)
    ]
    return matches[0] if len(matches) == 1 else None


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A built-in profile by name, or a TOML file by path; CpbenchError naming the choices."""
    text = str(name_or_path)
    names = builtin_profiles()
    if text in names:
        resource = _data_dir().joinpath(f"{text}.toml")
        return profile_from_toml(resource.read_text(encoding="utf-8"), origin="built-in")
    path = Path(text).expanduser()
    if path.is_file():
        try:
            content = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CpbenchError(f"cannot read hardware profile {text}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise CpbenchError(
                f"hardware profile {text} is not UTF-8 text (byte {exc.start}): a TOML file expected"
            ) from None
        return profile_from_toml(content, origin=str(path))
    raise CpbenchError(
        f"hardware {text!r} is neither a built-in profile ({', '.join(names)}) "
        f"nor an existing TOML file"
    )


def profile_from_toml(content: str, origin: str = "<string>") -> HardwareProfile:
    """Parse and validate a profile from TOML text."""
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"hardware profile {origin} is not valid TOML: {exc}") from None
    return profile_from_dict(data, origin)


# ------------------------------------------------------------------------------- the file

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


def _family_rule() -> str:
    return f"must be one of {', '.join(KERNEL_FAMILIES)}"


class EfficiencyTables(FileModel):
    """`[efficiency]`: the attention-kernel efficiency curve of each kernel family that has one
    (`[efficiency.flash_attn]`, ...), and which of them `auto` runs."""

    default: Annotated[KernelFamily, rule(_family_rule())]
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
    """A hardware profile file; see the module docstring for what the numbers mean."""

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


def _tier(tier: LinkTier, table: TierTable) -> LinkTierProfile:
    return LinkTierProfile(
        tier,
        table.name if table.name is not None else tier,
        _cost(table.all_to_all),
        _cost(table.send_recv),
        table.devices_per_nic,
    )


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


def _cost(c: CostTable) -> LinkCost:
    return LinkCost(c.latency_us * 1e-6, c.busbw_GBps * GB, c.source, c.fit_residual)


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


# ---------------------------------------------------------------------------------- writing


def _round(value: float) -> float:
    """Six significant digits: what a written profile keeps of a (fitted) number."""
    return float(f"{value:.6g}")


def profile_document(profile: HardwareProfile) -> dict[str, Any]:
    """The profile as the TOML document `profile_from_dict` reads (numbers rounded to 6
    digits; keys absent where the profile has nothing)."""

    def cost(c: LinkCost) -> dict[str, Any]:
        return {
            "latency_us": _round(c.latency_s * 1e6),
            "busbw_GBps": _round(c.busbw / GB),
            "source": c.source,
        } | ({} if c.fit_residual is None else {"fit_residual": _round(c.fit_residual)})

    document: dict[str, Any] = {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "name": profile.name,
        "description": profile.description,
        "devices_per_node": profile.devices_per_node,
    }
    if profile.compute_slots_per_node is not None:
        document["compute_slots_per_node"] = profile.compute_slots_per_node
    document["device"] = {"kind": profile.device_kind, "names": list(profile.device_names)}
    document["memory"] = {
        "capacity_gib": _round(profile.memory_gib),
        "bandwidth_GBps": _round(profile.memory_bandwidth / GB),
        "source": profile.memory_source,
    }
    document["peak_tflops"] = {
        **{dtype: _round(peak) for dtype, peak in sorted(profile.peak_tflops.items())},
        "source": profile.peak_source,
    }
    document["efficiency"] = {
        "default": profile.default_kernel,
        "source": profile.default_kernel_source,
        **{
            family: {
                "seq_len": list(curve.seq_lens),
                "efficiency": [_round(v) for v in curve.values],
                "source": curve.source,
            }
            for family, curve in profile.curves.items()
        },
    }
    document["overheads"] = {
        "step_overhead_us": _round(profile.step_overhead_s * 1e6),
        "overlap": _round(profile.overlap),
        "source": profile.overheads_source,
    }
    document["links"] = {
        tier.tier: {
            "name": tier.name,
            "devices_per_nic": tier.devices_per_nic,
            "all_to_all": cost(tier.all_to_all),
            "send_recv": cost(tier.send_recv),
        }
        for tier in (profile.intra_node, profile.inter_node)
    }
    if profile.topology is not None:
        document["topology"] = {
            "source": profile.topology.source,
            "tiers": [
                {
                    "kind": t.kind,
                    "island": t.island,
                    "name": t.name,
                    "peer_to_peer": t.peer_to_peer,
                    "all_to_all": cost(t.all_to_all),
                    "send_recv": cost(t.send_recv),
                }
                for t in profile.topology.tiers
            ],
        }
    if profile.calibration is not None:
        c = profile.calibration
        document["calibration"] = {
            "prior": c.prior,
            "points": c.points,
            "residual": _round(c.residual),
            "files": list(c.files),
        }
    return document


def profile_to_toml(profile: HardwareProfile, header: str = "") -> str:
    """The profile as TOML that `load_profile` reads back (numbers rounded to 6 digits), after
    `header` as comment lines."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + tomli_w.dumps(profile_document(profile))


def save_profile(profile: HardwareProfile, path: str | Path, header: str = "") -> Path:
    """Write the profile as TOML; CpbenchError when the file cannot be written."""
    target = Path(path).expanduser()
    try:
        target.write_text(profile_to_toml(profile, header), encoding="utf-8")
    except OSError as exc:
        raise CpbenchError(f"cannot write hardware profile {target}: {exc.strerror}") from None
    return target


def with_link_cost(
    profile: HardwareProfile, tier: LinkTier, kind: CollectiveKind, cost: LinkCost
) -> HardwareProfile:
    """A copy of the profile with one (tier, kind) LinkCost replaced."""
    link = profile.link(tier)
    if kind == "all_to_all":
        link = replace(link, all_to_all=cost)
    elif kind == "send_recv":
        link = replace(link, send_recv=cost)
    else:
        raise CpbenchError(f"collective kind {kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")
    if tier == "intra_node":
        return replace(profile, intra_node=link)
    return replace(profile, inter_node=link)


def with_tier_cost(
    profile: HardwareProfile, index: int, kind: CollectiveKind, cost: LinkCost
) -> HardwareProfile:
    """A copy of a profile with a `[topology]` with one node tier's (index into
    `node_tiers()`) LinkCost of one collective kind replaced."""
    if profile.topology is None or not 0 <= index < len(profile.topology.tiers):
        raise CpbenchError(f"profile {profile.name!r} has no topology tier {index}")
    tiers = list(profile.topology.tiers)
    tier = tiers[index]
    if kind == "all_to_all":
        tiers[index] = replace(tier, all_to_all=cost)
    elif kind == "send_recv":
        tiers[index] = replace(tier, send_recv=cost)
    else:
        raise CpbenchError(f"collective kind {kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")
    return replace(profile, topology=replace(profile.topology, tiers=tuple(tiers)))


def with_curve(profile: HardwareProfile, family: str, curve: EfficiencyCurve) -> HardwareProfile:
    """A copy of the profile with the curve of one kernel family set (the default family's is
    `efficiency`)."""
    known = _family(family)
    if known == profile.default_kernel:
        return replace(profile, efficiency=curve)
    return replace(profile, kernel_curves={**profile.kernel_curves, known: curve})


def with_default_kernel(profile: HardwareProfile, family: str) -> HardwareProfile:
    """A copy whose default family (the one `efficiency` holds and `auto` runs) is `family`;
    the old default's curve moves to `kernel_curves`, the new one's (or the old default's, when
    it has none) to `efficiency`."""
    known = _family(family)
    if known == profile.default_kernel:
        return profile
    curves = dict(profile.curves)
    efficiency = curves.pop(known, profile.efficiency)
    return replace(
        profile,
        efficiency=efficiency,
        default_kernel=known,
        kernel_curves=curves,
        default_kernel_source=f"{known} made the default (was {profile.default_kernel})",
    )


def scaled_bandwidth(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """A copy with every busbw multiplied by `factor` (what-if and tests)."""
    if factor <= 0:
        raise CpbenchError(f"bandwidth factor must be positive, got {factor}")
    result = profile
    for tier in LINK_TIERS:
        for kind in COLLECTIVE_KINDS:
            cost = result.link(tier).cost(kind)
            result = with_link_cost(result, tier, kind, replace(cost, busbw=cost.busbw * factor))
    if result.topology is not None:
        tiers = tuple(
            replace(
                t,
                all_to_all=replace(t.all_to_all, busbw=t.all_to_all.busbw * factor),
                send_recv=replace(t.send_recv, busbw=t.send_recv.busbw * factor),
            )
            for t in result.topology.tiers
        )
        result = replace(result, topology=replace(result.topology, tiers=tiers))
    return result


def with_topology(profile: HardwareProfile, topology: NodeTopology | None) -> HardwareProfile:
    """A copy with the node topology set (None: a flat node); CpbenchError when the outermost
    island is not the node or the islands do not nest."""
    if topology is not None:
        sizes = [t.island for t in topology.tiers]
        if not sizes or sizes[-1] != profile.devices_per_node:
            raise CpbenchError(
                f"topology islands {sizes}: the outermost must be the node "
                f"({profile.devices_per_node} devices per node)"
            )
        for below, above in zip(sizes, sizes[1:], strict=False):
            if above <= below or above % below:
                raise CpbenchError(
                    f"topology islands {sizes} do not nest: {above} is not a larger multiple "
                    f"of {below}"
                )
    return replace(profile, topology=topology)
