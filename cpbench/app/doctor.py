"""`cpbench doctor`: what a user needs to know before a sweep, as one typed report.

Like DeepSpeed's `ds_report` or `torch.utils.collect_env`: the versions of torch, CUDA, NCCL,
cuDNN and the optional attention libraries (read from the installed distributions' metadata,
so nothing heavy is imported to learn a version), the visible GPUs and their memory, NVML,
the GPU interconnect matrix (`nvidia-smi topo -m`'s NV# / PIX / PXB / PHB / NODE / SYS), which
local kernels and implementations can run here and why the others cannot, and the
torch.distributed backends.

GPUs are listed through NVML, which creates no CUDA context; only the kernel checks of a GPU
machine touch CUDA (through `select_kernel`, the one place that knows a kernel's rules). The
topology comes from NVML (`nvmlDeviceGetP2PStatus` for NVLink, the NVLink remote PCI info for
the link count, `nvmlDeviceGetTopologyCommonAncestor` for the PCIe path), or from parsing
`nvidia-smi topo -m` when NVML lacks those calls. Every NVML reader takes the NVML module as an
argument, so the logic is tested on CPU with a fake one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from cpbench.config.bench import BenchConfig
from cpbench.config.impls import IMPLS
from cpbench.config.vocabulary import BACKENDS, DEFAULT_DTYPE, DTYPES, Device, Dtype
from cpbench.errors import CpbenchError

# ----------------------------------------------------------------------------- the report


class _Model(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class Package(_Model):
    """One optional (or required) Python distribution."""

    name: str
    """What it is, as the user knows it (torch, flash-attn, FlashAttention-3, ...)."""
    module: str
    """Its top-level import name."""
    distribution: str | None
    """The pip distribution that provides the module (None when none is installed)."""
    version: str | None
    """The installed version, from the distribution's metadata (None when not installed)."""
    found: bool
    """The module is on the path (found without importing it)."""


class Gpu(_Model):
    """One GPU that CUDA sees here (CUDA_VISIBLE_DEVICES applied)."""

    index: int
    """Its CUDA index in this process."""
    nvml_index: int | None
    """Its NVML index (PCI order, ignores CUDA_VISIBLE_DEVICES); None when read via torch."""
    name: str
    """Product name."""
    memory_total_bytes: int | None
    """Device memory."""
    memory_used_bytes: int | None
    """Device memory already in use (other processes); NVML only."""
    compute_capability: str | None
    """major.minor (9.0 for Hopper)."""
    uuid: str | None
    """GPU-... UUID."""
    pci_bus_id: str | None
    """PCI bus id, domain:bus:device.function."""
    numa_node: int | None
    """NUMA node (CPU socket) the GPU is attached to, when known."""


class Nvml(_Model):
    """NVML (nvidia-ml-py): what the memory probe and the topology read."""

    available: bool
    """nvmlInit succeeded."""
    driver_version: str | None
    """NVIDIA driver version."""
    cuda_driver_version: str | None
    """Highest CUDA version the driver supports."""
    reason: str | None
    """Why NVML is not available (None when it is)."""


class TopologyTierIslands(_Model):
    """One tier of islands read from the interconnect matrix."""

    kind: str
    """What joins the islands (`cpbench.model.hardware.profile.TierKind`)."""
    islands: list[list[int]]
    """GPU indices (matrix order) of each island."""


class Topology(_Model):
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


class KernelStatus(_Model):
    """Whether a local kernel (`--kernel`, the scenario's backend axis) can run here."""

    name: str
    """The kernel requested (`cpbench.config.vocabulary.BACKENDS`)."""
    device: Device
    """The device it was checked on."""
    dtype: Dtype
    """The dtype it was checked with."""
    usable: bool
    """select_kernel accepts it."""
    resolved: str | None
    """The kernel that runs (what `auto` picks); None when not usable."""
    reason: str | None
    """Why it is not usable (select_kernel's rule)."""


class ImplStatus(_Model):
    """Whether an implementation (`--impl`, the scenario's impl axis) can run here."""

    name: str
    """The impl name (`cpbench.config.impls.IMPLS`)."""
    version: str | None
    """The library's installed version."""
    kernel: str | None
    """The local kernel it runs."""
    usable: bool
    """Installed and able to run the probe configuration."""
    reason: str | None
    """Why not: its install hint, or its rule for the probe configuration."""


class BackendStatus(_Model):
    """A torch.distributed backend."""

    name: str
    """gloo or nccl."""
    built: bool
    """This torch build has it."""
    usable: bool
    """It can run here (nccl needs a GPU)."""
    reason: str | None
    """Why it is not usable."""


class DoctorReport(_Model):
    """Everything `cpbench doctor` reports (its --json is `model_dump(mode="json")`)."""

    cpbench: str
    """cpbench version."""
    python: str
    """Python version."""
    platform: str
    """OS and architecture."""
    hostname: str
    """This host."""
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
    """NVML status."""
    topology: Topology
    """GPU interconnect matrix."""
    packages: list[Package]
    """Versions of the attention libraries cpbench can use."""
    kernels: list[KernelStatus]
    """Every local kernel x dtype on this device."""
    probe_config: str
    """The configuration the impls' capability rules were checked on."""
    impls: list[ImplStatus]
    """Every implementation."""
    backends: list[BackendStatus]
    """torch.distributed backends."""
    summary: list[str]
    """Plain sentences: the device, what runs, what is missing."""
    elapsed_seconds: float
    """How long the checks took."""

    def usable_kernels(self, dtype: Dtype | None = None) -> list[str]:
        """The explicit kernels (not `auto`) usable here with `dtype` (default: the device's
        default dtype), in vocabulary order: what a sweep's backend axis can list."""
        dtype = dtype or DEFAULT_DTYPE[self.device]
        return [
            k.name for k in self.kernels if k.dtype == dtype and k.usable and k.name != "auto"
        ]


# ----------------------------------------------------------------------------- versions

PACKAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("torch", "torch", ("torch",)),
    ("flash-attn", "flash_attn", ("flash-attn", "flash_attn")),
    ("FlashAttention-3", "flash_attn_interface", ("flash_attn_3", "flash-attn-3",
                                                  "flashattn-hopper")),
    ("TransformerEngine", "transformer_engine", ("transformer-engine", "transformer_engine",
                                                 "transformer-engine-torch")),
    ("ring-flash-attn", "ring_flash_attn", ("ring-flash-attn",)),
    ("yunchang", "yunchang", ("yunchang",)),
    ("nvidia-ml-py", "pynvml", ("nvidia-ml-py", "pynvml")),
)
"""(name, top-level module, distributions that may provide it, first match wins)."""


def package_versions(
    packages: Sequence[tuple[str, str, Sequence[str]]] = PACKAGES,
) -> list[Package]:
    """Each package's version from its distribution's metadata, and whether its module is on
    the path (found, not imported): no CUDA library is loaded to learn a version."""
    owners = importlib.metadata.packages_distributions()
    out = []
    for name, module, candidates in packages:
        version, distribution = None, None
        for dist in [*owners.get(module, []), *candidates]:
            try:
                version, distribution = importlib.metadata.version(dist), dist
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        out.append(Package(name=name, module=module, distribution=distribution,
                           version=version, found=found))
    return out


def _nccl_version() -> str | None:
    import torch.distributed as dist  # noqa: PLC0415

    if not (dist.is_available() and dist.is_nccl_available()):
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(x) for x in version) if isinstance(version, tuple) else str(version)


def format_cudnn(code: int | None) -> str | None:
    """cuDNN's version integer as text: 90100 -> '9.1.0' (cuDNN 9 counts major * 10000),
    8902 -> '8.9.2' (cuDNN 8 counts major * 1000)."""
    if code is None:
        return None
    major, rest = (code // 10000, code % 10000) if code >= 90000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _cudnn_version() -> str | None:
    try:
        return format_cudnn(torch.backends.cudnn.version())
    except (AttributeError, RuntimeError):
        return None


# ----------------------------------------------------------------------------- NVML: GPUs


def load_nvml() -> tuple[ModuleType | None, str | None]:
    """The initialised NVML module (nvidia-ml-py's pynvml), or None and the reason."""
    try:
        import pynvml  # noqa: PLC0415 - optional at run time: no driver, no library

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any NVML failure: the report says which
        return None, f"{type(exc).__name__}: {exc}"
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_key(bus_id: str) -> str:
    """A PCI bus id compared across NVML calls and sysfs: 00000000:18:00.0 -> 0000:18:00.0."""
    return bus_id.strip().lower()[-12:]


def visible_nvml_indices(uuids: Sequence[str], env: str | None) -> list[int]:
    """The NVML indices CUDA sees, in CUDA order, from CUDA_VISIBLE_DEVICES (`env`; None =
    unset = all). Entries are indices or GPU-UUID prefixes, as CUDA reads them: the list stops at
    the first entry that names no GPU (so "-1" or "" hides every GPU); MIG entries are not
    mapped."""
    if env is None:
        return list(range(len(uuids)))
    out: list[int] = []
    for entry in (e.strip() for e in env.split(",")):
        match: int | None = None
        if entry.isdigit() and int(entry) < len(uuids):
            match = int(entry)
        elif entry.startswith("GPU-"):
            hits = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in out:
            break
        out.append(match)
    return out


def _numa_from_sysfs(bus_id: str | None) -> int | None:
    if not bus_id:
        return None
    try:
        node = int(Path(f"/sys/bus/pci/devices/{_bus_key(bus_id)}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def nvml_gpus(nvml: Any, env: str | None) -> list[Gpu]:
    """The GPUs CUDA sees, read through NVML (no CUDA context)."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    gpus = []
    for cuda_index, i in enumerate(visible_nvml_indices(uuids, env)):
        h = handles[i]
        memory = _try(nvml.nvmlDeviceGetMemoryInfo, h)
        cc = _try(nvml.nvmlDeviceGetCudaComputeCapability, h)
        pci = _try(nvml.nvmlDeviceGetPciInfo, h)
        bus = _text(pci.busId) if pci is not None else None
        numa = _try(nvml.nvmlDeviceGetNumaNodeId, h)
        gpus.append(
            Gpu(
                index=cuda_index,
                nvml_index=i,
                name=_text(nvml.nvmlDeviceGetName(h)),
                memory_total_bytes=int(memory.total) if memory is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
                uuid=uuids[i],
                pci_bus_id=bus,
                numa_node=int(numa) if numa is not None and numa >= 0 else _numa_from_sysfs(bus),
            )
        )
    return gpus


def torch_gpus() -> list[Gpu]:
    """The GPUs through torch (when NVML is missing): initialises CUDA in this process."""
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = str(getattr(p, "uuid", "")) or None
        out.append(
            Gpu(index=i, nvml_index=None, name=p.name, memory_total_bytes=int(p.total_memory),
                memory_used_bytes=None, compute_capability=f"{p.major}.{p.minor}",
                uuid=uuid if uuid is None or uuid.startswith("GPU-") else f"GPU-{uuid}",
                pci_bus_id=None, numa_node=None)
        )
    return out


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None when NVML (or the driver) does not support the call."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported, FunctionNotFound, ...
        return None


# ----------------------------------------------------------------------------- topology

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

_ANCESTOR_LABELS = (
    ("NVML_TOPOLOGY_INTERNAL", 0, "PIX"),  # two GPUs of one board: behind its one bridge
    ("NVML_TOPOLOGY_SINGLE", 10, "PIX"),
    ("NVML_TOPOLOGY_MULTIPLE", 20, "PXB"),
    ("NVML_TOPOLOGY_HOSTBRIDGE", 30, "PHB"),
    ("NVML_TOPOLOGY_NODE", 40, "NODE"),
    ("NVML_TOPOLOGY_SYSTEM", 50, "SYS"),
)


class _NvlinkUnsupported(Exception):
    """NVML lacks the topology calls (an old driver, a vGPU): fall back to nvidia-smi."""


def _nvlinks(nvml: Any, handle: Any) -> list[tuple[str, bool]]:
    """(remote PCI bus id, remote is an NVSwitch) of each active NVLink of a GPU."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    switch = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    out = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                continue
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported / InvalidArgument: no link
            continue
        remote = _try(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        kind = _try(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        out.append((_bus_key(_text(remote.busId) if remote is not None else ""), kind == switch))
    return out


def nvml_topology(nvml: Any, gpus: Sequence[Gpu]) -> Topology:
    """The matrix from NVML: NV# where NVLink P2P is OK between two GPUs (# = the links that
    join them directly, or, through NVSwitch, the links each has into the switches), else the
    PCIe path of their closest common ancestor. Raises `_NvlinkUnsupported` when NVML lacks
    the calls."""
    indices = [g.nvml_index for g in gpus]
    if any(i is None for i in indices):
        raise _NvlinkUnsupported("GPUs were not read through NVML")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
    buses = [_bus_key(g.pci_bus_id or "") for g in gpus]
    links = [_nvlinks(nvml, h) for h in handles]
    nvlink_index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
    p2p_ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    labels = {getattr(nvml, name, code): label for name, code, label in _ANCESTOR_LABELS}
    matrix = []
    for a, ha in enumerate(handles):
        row = []
        for b, hb in enumerate(handles):
            if a == b:
                row.append("X")
                continue
            try:
                nvlink = nvml.nvmlDeviceGetP2PStatus(ha, hb, nvlink_index) == p2p_ok
                ancestor = nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb)
            except Exception as exc:  # noqa: BLE001 - NotSupported / FunctionNotFound
                raise _NvlinkUnsupported(f"{type(exc).__name__}: {exc}") from exc
            if nvlink:
                direct = sum(1 for bus, _ in links[a] if bus == buses[b])
                through_switch = min(
                    sum(1 for _, sw in links[a] if sw), sum(1 for _, sw in links[b] if sw)
                )
                count = direct or through_switch
                row.append(f"NV{count}" if count else "NV")
            else:
                row.append(labels.get(ancestor, str(ancestor)))
        matrix.append(row)
    return Topology(source="nvml", gpus=[f"GPU{g.index}" for g in gpus], matrix=matrix,
                    numa=[g.numa_node for g in gpus], reason=None)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU_LABEL = re.compile(r"^GPU\d+$")


def parse_topo_matrix(text: str) -> tuple[list[str], list[list[str]], list[int | None]]:
    """(labels, matrix, NUMA node per GPU) from `nvidia-smi topo -m`: the GPU columns of the
    header, and for each GPU row its cells under those columns and its "NUMA Affinity"."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    at = next((n for n, line in enumerate(lines) if "GPU0" in line.split()), None)
    if at is None:
        raise ValueError("no GPU0 column in the nvidia-smi topo -m output")
    header = lines[at].split()
    columns = header[: header.index("CPU")] if "CPU" in header else header
    gpu_columns = [i for i, c in enumerate(columns) if _GPU_LABEL.match(c)]
    labels, matrix, numa = [], [], []
    for line in lines[at + 1 :]:
        tokens = line.split()
        if not tokens or not _GPU_LABEL.match(tokens[0]) or len(tokens) < 1 + len(columns):
            continue
        cells = tokens[1 : 1 + len(columns)]
        labels.append(tokens[0])
        matrix.append([cells[i] for i in gpu_columns])
        rest = tokens[1 + len(columns) :]  # CPU Affinity, NUMA Affinity, GPU NUMA ID
        numa.append(int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None)
    return labels, matrix, numa


def smi_topology(gpus: Sequence[Gpu], run: Callable[[], str] | None = None) -> Topology:
    """The matrix from `nvidia-smi topo -m` (which numbers GPUs as NVML does), restricted to
    the visible GPUs and relabelled by CUDA index."""

    def _run() -> str:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            raise FileNotFoundError("nvidia-smi is not on PATH")
        return subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, check=True,
                              timeout=20).stdout

    labels, matrix, numa = parse_topo_matrix((run or _run)())
    picks = [g.nvml_index if g.nvml_index is not None else g.index for g in gpus]
    if any(p >= len(labels) for p in picks):
        raise ValueError(f"nvidia-smi topo -m lists {len(labels)} GPUs, {len(gpus)} are visible")
    return Topology(
        source="nvidia-smi",
        gpus=[f"GPU{g.index}" for g in gpus],
        matrix=[[matrix[a][b] for b in picks] for a in picks],
        numa=[numa[p] if gpus[k].numa_node is None else gpus[k].numa_node
              for k, p in enumerate(picks)],
        reason=None,
    )


def with_islands(topology: Topology) -> Topology:
    """The topology with its `tiers` filled from the matrix."""
    from cpbench.model.topology import tiers_from_matrix  # noqa: PLC0415 - keeps doctor fast

    tiers = [
        TopologyTierIslands(kind=t.kind, islands=[list(i) for i in t.islands])
        for t in tiers_from_matrix(topology.matrix)
    ]
    return topology.model_copy(update={"tiers": tiers})


def read_topology(
    nvml: Any | None, gpus: Sequence[Gpu], smi: Callable[[], str] | None = None
) -> Topology:
    """NVML first, `nvidia-smi topo -m` when NVML lacks the calls; a reason when neither."""
    labels = [f"GPU{g.index}" for g in gpus]
    if len(gpus) < 2:
        return Topology(source=None, gpus=labels, matrix=[["X"] for _ in gpus],
                        numa=[g.numa_node for g in gpus],
                        reason=f"{len(gpus)} GPU visible: no interconnect to show"
                        if gpus else "no GPU visible")
    problems = []
    if nvml is not None:
        try:
            return with_islands(nvml_topology(nvml, gpus))
        except _NvlinkUnsupported as exc:
            problems.append(f"NVML: {exc}")
    try:
        return with_islands(smi_topology(gpus, smi))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        problems.append(f"nvidia-smi topo -m: {exc}")
    return Topology(source=None, gpus=labels, matrix=[], numa=[g.numa_node for g in gpus],
                    reason="; ".join(problems))


# ----------------------------------------------------------------------------- kernels, impls

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def kernel_statuses(device: Device) -> list[KernelStatus]:
    """Every kernel x dtype through `select_kernel` (its CpbenchError is the reason)."""
    from cpbench.attention.kernels import select_kernel  # noqa: PLC0415

    out = []
    for name in BACKENDS:
        for dtype in DTYPES:
            try:
                kernel = select_kernel(device, _TORCH_DTYPES[dtype], name)
            except CpbenchError as exc:  # the kernel's rule
                out.append(KernelStatus(name=name, device=device, dtype=dtype, usable=False,
                                        resolved=None, reason=str(exc)))
            except Exception as exc:  # noqa: BLE001 - a broken install (an ABI mismatch)
                out.append(KernelStatus(name=name, device=device, dtype=dtype, usable=False,
                                        resolved=None, reason=f"{type(exc).__name__}: {exc}"))
            else:
                out.append(KernelStatus(name=name, device=device, dtype=dtype, usable=True,
                                        resolved=kernel.name, reason=None))
    return out


def probe_config(device: Device, world_size: int) -> BenchConfig:
    """A typical configuration of this machine (a ring over every GPU, 2 ranks on CPU, in the
    device's default dtype) on which the impls' capability rules are checked."""
    return BenchConfig(
        seq_len=4096 * world_size, batch=1, heads=8, kv_heads=8, head_dim=64,
        dtype=DEFAULT_DTYPE[device], causal=True, ulysses=1, ring=world_size, layout="zigzag",
        kv_replication=None, kernel="auto", phase="fwd+bwd", device=device,
        world_size=world_size,
    )


def impl_statuses(config: BenchConfig) -> list[ImplStatus]:
    """Every impl: its install hint first, then its rule for `config`."""
    from cpbench.impls import get_adapter  # noqa: PLC0415

    out = []
    for name in IMPLS:
        adapter = get_adapter(name)
        try:
            reason = adapter.installed() or adapter.capability(config)
        except Exception as exc:  # noqa: BLE001 - a library that fails in an unforeseen way
            reason = f"checking it raised {type(exc).__name__}: {exc}"
        out.append(ImplStatus(name=name, version=adapter.version(), kernel=adapter.kernel,
                              usable=reason is None, reason=reason))
    return out


def backend_statuses(gpu_count: int) -> list[BackendStatus]:
    import torch.distributed as dist  # noqa: PLC0415

    has = dist.is_available()
    gloo = has and dist.is_gloo_available()
    nccl = has and dist.is_nccl_available()
    nccl_reason = None
    if not nccl:
        nccl_reason = f"torch {torch.__version__} is built without NCCL"
    elif gpu_count == 0:
        nccl_reason = "built, but no GPU is visible"
    return [
        BackendStatus(name="gloo", built=gloo, usable=gloo,
                      reason=None if gloo else f"torch {torch.__version__} lacks gloo"),
        BackendStatus(name="nccl", built=nccl, usable=nccl and gpu_count > 0, reason=nccl_reason),
    ]


def _cuda_reason() -> str | None:
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and not visible.strip():
            return "CUDA_VISIBLE_DEVICES is empty"
        return "torch sees no CUDA device (no driver, or no GPU)"
    return None


def summary_lines(report: DoctorReport) -> list[str]:
    """Plain sentences: where sweeps run, and what is not usable."""
    if report.cuda_available and report.gpus:
        names = sorted({g.name for g in report.gpus})
        lines = [f"{len(report.gpus)} GPU{'s' if len(report.gpus) > 1 else ''} visible "
                 f"({', '.join(names)}): sweeps run on CUDA with NCCL"]
    else:
        seen = (f", though NVML sees {len(report.gpus)} GPU{'s' if len(report.gpus) > 1 else ''}"
                if report.gpus else "")
        lines = [f"no GPU: CUDA not available ({report.cuda_reason}{seen}); sweeps run on CPU "
                 "with gloo"]
    dtype = DEFAULT_DTYPE[report.device]
    lines.append(f"kernels usable in {dtype}: {', '.join(report.usable_kernels(dtype)) or 'none'}")
    usable = [i.name for i in report.impls if i.usable]
    lines.append(f"implementations usable: {', '.join(usable) or 'none'}")
    if report.device == "cuda" and not report.nvml.available:
        lines.append(f"NVML is not available ({report.nvml.reason}): no NVML memory peaks")
    return lines


def collect(env: dict[str, str] | None = None) -> DoctorReport:
    """Run every check and return the report."""
    import socket  # noqa: PLC0415

    from cpbench import __version__  # noqa: PLC0415

    start = time.perf_counter()
    env = dict(os.environ) if env is None else env
    cuda = torch.cuda.is_available()
    nvml, nvml_reason = load_nvml()
    driver = cuda_driver = None
    gpus: list[Gpu] = []
    if nvml is not None:
        version = _try(nvml.nvmlSystemGetDriverVersion)
        driver = _text(version) if version is not None else None
        code = _try(nvml.nvmlSystemGetCudaDriverVersion)
        cuda_driver = f"{int(code) // 1000}.{int(code) % 1000 // 10}" if code else None
        try:
            gpus = nvml_gpus(nvml, env.get("CUDA_VISIBLE_DEVICES"))
        except Exception as exc:  # noqa: BLE001 - a GPU NVML cannot read: torch lists them
            nvml_reason = f"listing the GPUs failed: {type(exc).__name__}: {exc}"
    count = torch.cuda.device_count() if cuda else 0
    if cuda and len(gpus) != count:  # no NVML, or a CUDA_VISIBLE_DEVICES it cannot map (MIG)
        gpus = torch_gpus()
    device: Device = "cuda" if cuda and gpus else "cpu"
    topology = read_topology(nvml, gpus)
    if nvml is not None:
        _try(nvml.nvmlShutdown)
    world = len(gpus) if device == "cuda" else 2
    config = probe_config(device, world)
    report = DoctorReport(
        cpbench=__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        hostname=socket.gethostname(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        nccl=_nccl_version(),
        cudnn=_cudnn_version(),
        cuda_available=cuda,
        cuda_reason=_cuda_reason(),
        cuda_device_count=count,
        device=device,
        gpus=gpus,
        nvml=Nvml(available=nvml is not None, driver_version=driver,
                  cuda_driver_version=cuda_driver, reason=nvml_reason),
        topology=topology,
        packages=package_versions(),
        kernels=kernel_statuses(device),
        probe_config=(
            f"{config.scheme} {config.ulysses}x{config.ring} {config.layout} causal, "
            f"{config.dtype}, {config.device}, world {config.world_size}"
        ),
        impls=impl_statuses(config),
        backends=backend_statuses(len(gpus) if device == "cuda" else 0),
        summary=[],
        elapsed_seconds=0.0,
    )
    report.summary = summary_lines(report)
    report.elapsed_seconds = round(time.perf_counter() - start, 3)
    return report
