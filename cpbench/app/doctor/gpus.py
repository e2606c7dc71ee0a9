"""The visible GPUs, read through NVML (no CUDA context; CUDA_VISIBLE_DEVICES applied as CUDA
reads it) or through torch where NVML is missing; and the NVML helpers the topology shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cpbench.app.doctor.schema import Gpu
from cpbench.bench.nvml import nvml_uuid


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bus_key(bus_id: str) -> str:
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
        node = int(Path(f"/sys/bus/pci/devices/{bus_key(bus_id)}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def nvml_gpus(nvml: Any, env: str | None) -> list[Gpu]:
    """The GPUs CUDA sees, read through NVML (no CUDA context)."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = [as_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    gpus = []
    for cuda_index, i in enumerate(visible_nvml_indices(uuids, env)):
        h = handles[i]
        memory = try_nvml(nvml.nvmlDeviceGetMemoryInfo, h)
        cc = try_nvml(nvml.nvmlDeviceGetCudaComputeCapability, h)
        pci = try_nvml(nvml.nvmlDeviceGetPciInfo, h)
        bus = as_text(pci.busId) if pci is not None else None
        numa = try_nvml(nvml.nvmlDeviceGetNumaNodeId, h)
        gpus.append(
            Gpu(
                index=cuda_index,
                nvml_index=i,
                name=as_text(nvml.nvmlDeviceGetName(h)),
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
        uuid = str(getattr(p, "uuid", ""))
        out.append(
            Gpu(index=i, nvml_index=None, name=p.name, memory_total_bytes=int(p.total_memory),
                memory_used_bytes=None, compute_capability=f"{p.major}.{p.minor}",
                uuid=nvml_uuid(uuid) if uuid else None,
                pci_bus_id=None, numa_node=None)
        )
    return out


def try_nvml(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None when NVML (or the driver) does not support the call."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported, FunctionNotFound, ...
        return None
