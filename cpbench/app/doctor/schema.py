"""The typed report `cpbench doctor` returns (its --json is `DoctorReport.model_dump`): the
versions, GPUs, NVML, interconnect and what can run here. Data only; the probes fill it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cpbench.app.schema import ReportModel
from cpbench.config.vocabulary import DEFAULT_DTYPE, Device, Dtype


class Package(ReportModel):
    """One optional (or required) Python distribution."""

    name: str
    """What it is, as the user knows it (torch, flash-attn, FlashAttention-3, ...)."""
    module: str
    distribution: str | None
    """The pip distribution that provides the module (None when none is installed)."""
    version: str | None
    """The installed version, from the distribution's metadata (None when not installed)."""
    found: bool
    """The module is on the path (found without importing it)."""


class Gpu(ReportModel):
    """One GPU that CUDA sees here (CUDA_VISIBLE_DEVICES applied)."""

    index: int
    """Its CUDA index in this process."""
    nvml_index: int | None
    """Its NVML index (PCI order, ignores CUDA_VISIBLE_DEVICES); None when read via torch."""
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    """Device memory already in use (other processes); NVML only."""
    compute_capability: str | None
    """major.minor (9.0 for Hopper)."""
    uuid: str | None
    pci_bus_id: str | None
    """PCI bus id, domain:bus:device.function."""
    numa_node: int | None
    """NUMA node (CPU socket) the GPU is attached to, when known."""


class Nvml(ReportModel):
    """NVML (nvidia-ml-py): what the memory probe and the topology read."""

    available: bool
    """nvmlInit succeeded."""
    driver_version: str | None
    cuda_driver_version: str | None
    """Highest CUDA version the driver supports."""
    reason: str | None
    """Why NVML is not available (None when it is)."""


class TopologyTierIslands(ReportModel):
    """One tier of islands read from the interconnect matrix."""

    kind: str
    """What joins the islands (`cpbench.model.hardware.profile.TierKind`)."""
    islands: list[list[int]]
    """GPU indices (matrix order) of each island."""


class Topology(ReportModel):
    """The GPU interconnect matrix, as `nvidia-smi topo -m` prints it."""

    source: Literal["nvml", "nvidia-smi"] | None
    """Where it was read; None when it could not be read (see reason)."""
    gpus: list[str]
    """Row and column labels (GPU0, GPU1, ... by CUDA index)."""
    matrix: list[list[str]]
    """matrix[i][j]: X (self), NV# (# bonded NVLinks), PIX, PXB, PHB, NODE or SYS."""
    numa: list[int | None]
    """NUMA node of each GPU (the CPU socket), when known."""
    reason: str | None
    """Why there is no matrix (fewer than two GPUs, no NVML and no nvidia-smi)."""
    tiers: list[TopologyTierIslands] = Field(default_factory=list)
    """The islands the matrix implies, innermost tier first (`model.topology.tiers_from_matrix`):
    what a profile's `[topology]` tiers describe; empty without a matrix (one island)."""


class KernelStatus(ReportModel):
    """Whether a local kernel (`--kernel`, the scenario's backend axis) can run here."""

    name: str
    """The kernel requested (`cpbench.config.vocabulary.BACKENDS`)."""
    device: Device
    dtype: Dtype
    usable: bool
    """select_kernel accepts it."""
    resolved: str | None
    """The kernel that runs (what `auto` picks); None when not usable."""
    reason: str | None
    """Why it is not usable (select_kernel's rule)."""


class ImplStatus(ReportModel):
    """Whether an implementation (`--impl`, the scenario's impl axis) can run here."""

    name: str
    """The impl name (`cpbench.config.impls.IMPLS`)."""
    version: str | None
    kernel: str | None
    usable: bool
    """Installed and able to run the probe configuration."""
    reason: str | None
    """Why not: its install hint, or its rule for the probe configuration."""


class BackendStatus(ReportModel):
    """A torch.distributed backend."""

    name: str
    """gloo or nccl."""
    built: bool
    """This torch build has it."""
    usable: bool
    """It can run here (nccl needs a GPU)."""
    reason: str | None


class DoctorReport(ReportModel):
    """Everything `cpbench doctor` reports (its --json is `model_dump(mode="json")`)."""

    cpbench: str
    python: str
    platform: str
    """OS and architecture."""
    hostname: str
    torch: str
    """torch.__version__."""
    torch_cuda: str | None
    """CUDA version torch was built with (None: a CPU-only build)."""
    nccl: str | None
    """NCCL version torch ships (None without NCCL)."""
    cudnn: str | None
    """cuDNN version torch loads (None without cuDNN)."""
    cuda_available: bool
    """torch.cuda.is_available()."""
    cuda_reason: str | None
    """Why CUDA is not available."""
    cuda_device_count: int
    """torch.cuda.device_count(): the ranks a GPU sweep or verify spawns (0 without CUDA)."""
    device: Device
    """Where a sweep runs here by default."""
    gpus: list[Gpu]
    """The GPUs CUDA_VISIBLE_DEVICES leaves visible (NVML lists them even where this torch
    cannot use them)."""
    nvml: Nvml
    topology: Topology
    packages: list[Package]
    """Versions of the attention libraries cpbench can use."""
    kernels: list[KernelStatus]
    """Every local kernel x dtype on this device."""
    probe_config: str
    """The configuration the impls' capability rules were checked on."""
    impls: list[ImplStatus]
    backends: list[BackendStatus]
    summary: list[str]
    """Plain sentences: the device, what runs, what is missing."""
    elapsed_seconds: float

    def usable_kernels(self, dtype: Dtype | None = None) -> list[str]:
        """The explicit kernels (not `auto`) usable here with `dtype` (default: the device's
        default dtype), in vocabulary order: what a sweep's backend axis can list."""
        dtype = dtype or DEFAULT_DTYPE[self.device]
        return [
            k.name for k in self.kernels if k.dtype == dtype and k.usable and k.name != "auto"
        ]


TOPOLOGY_LEGEND: dict[str, str] = {
    "X": "self",
    "NV#": "a bonded set of # NVLinks (through NVSwitch on HGX boards)",
    "PIX": "at most a single PCIe bridge (one PCIe switch)",
    "PXB": "multiple PCIe bridges, without the PCIe host bridge",
    "PHB": "PCIe and a PCIe host bridge (typically the CPU)",
    "NODE": "PCIe and the interconnect between host bridges within a NUMA node",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (sockets: QPI/UPI)",
}
"""What each cell of the matrix means (the legend of `nvidia-smi topo -m`)."""
