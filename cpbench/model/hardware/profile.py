"""The runtime hardware profile: what the cost model needs to know about a system.

Its fields (compute, memory, links in nccl-tests terms, overheads): docs/design.md section 2."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from cpbench.config.vocabulary import (
    KERNEL_ALIASES,
    KERNEL_FAMILIES,
    KERNEL_NAMES,
    KernelFamily,
    canonical_dtype,
)
from cpbench.errors import CpbenchError
from cpbench.model.formulas import CollectiveKind
from cpbench.units import GIB

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
    for known in COLLECTIVE_KINDS:
        if known == kind:
            return known
    raise CpbenchError(f"collective kind {kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")


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
        return self.all_to_all if collective_kind(kind) == "all_to_all" else self.send_recv


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
        return self.all_to_all if collective_kind(kind) == "all_to_all" else self.send_recv


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
    """Everything the cost model needs about a system; see docs/design.md section 2."""

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
    for family in KERNEL_FAMILIES:
        if family == name:
            return family
    raise CpbenchError(f"kernel family {name!r} is not one of {', '.join(KERNEL_FAMILIES)}")
