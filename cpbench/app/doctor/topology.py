"""The GPU interconnect matrix: from NVML (NVLink P2P status, the NVLink remote PCI info for
the link count, the PCIe common ancestor), else parsed from `nvidia-smi topo -m`; and the
islands it implies."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from cpbench.app.doctor.gpus import as_text, bus_key, try_nvml
from cpbench.app.doctor.schema import Gpu, Topology, TopologyTierIslands

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
        remote = try_nvml(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        kind = try_nvml(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        out.append((bus_key(as_text(remote.busId) if remote is not None else ""), kind == switch))
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
    buses = [bus_key(g.pci_bus_id or "") for g in gpus]
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

