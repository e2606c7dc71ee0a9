"""The visible GPUs, through NVML (no CUDA context) or torch, and the NVML helpers the topology
shares. NVML's order against CUDA's: docs/internals.md, "cpbench doctor"."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpbench.app.doctor.schema import Gpu
from cpbench.bench.nvml import nvml_uuid, uuid_key


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bus_key(bus_id: str) -> str:
    """A PCI bus id compared across NVML calls and sysfs: 00000000:18:00.0 -> 0000:18:00.0."""
    return bus_id.strip().lower()[-12:]


def visible_nvml_indices(
    uuids: Sequence[str], env: str | None, migs: Mapping[str, int] | None = None
) -> list[int]:
    """The NVML indices CUDA sees, in PCI order's numbering, from CUDA_VISIBLE_DEVICES (`env`;
    None = unset = all). Entries are indices, GPU-UUID prefixes or MIG instance UUIDs (`migs`:
    an instance's UUID key -> its GPU's NVML index), as CUDA reads them: the list stops at the
    first entry that names no GPU (so "-1" or "" hides every GPU), or one already listed (two
    instances of one GPU are that GPU once)."""
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
        elif entry.startswith("MIG-"):
            match = (migs or {}).get(uuid_key(entry))
        if match is None or match in out:
            break
        out.append(match)
    return out


def mig_instances(nvml: Any, handles: Sequence[Any]) -> dict[str, int]:
    """Every MIG instance NVML lists (`nvmlDeviceGetMigDeviceHandleByIndex` up to
    `nvmlDeviceGetMaxMigDeviceCount` per GPU): its UUID key -> its GPU's NVML index. Empty
    where MIG is off or this NVML lacks the calls."""
    count_of = getattr(nvml, "nvmlDeviceGetMaxMigDeviceCount", None)
    instance_of = getattr(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", None)
    if count_of is None or instance_of is None:
        return {}
    out: dict[str, int] = {}
    for i, handle in enumerate(handles):
        for j in range(int(try_nvml(count_of, handle) or 0)):
            instance = try_nvml(instance_of, handle, j)
            uuid = None if instance is None else try_nvml(nvml.nvmlDeviceGetUUID, instance)
            if uuid is not None:
                out[uuid_key(as_text(uuid))] = i
    return out


def cuda_order_may_differ(names: Sequence[str], device_order: str | None) -> bool:
    """Whether CUDA's device numbering may differ from NVML's PCI order: CUDA_DEVICE_ORDER is
    not PCI_BUS_ID (unset: FASTEST_FIRST) and the GPUs are not all one model."""
    pci_order = (device_order or "").strip().upper() == "PCI_BUS_ID"
    return not pci_order and len(set(names)) > 1


def cuda_uuids_from_torch() -> list[str]:
    """The visible devices' UUIDs in CUDA's order, from CUDA (initialises CUDA here)."""
    import torch  # noqa: PLC0415 - only where CUDA is asked (see the package's `collect`)

    return [
        str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())
    ]


def _numa_from_sysfs(bus_id: str | None) -> int | None:
    if not bus_id:
        return None
    try:
        node = int(Path(f"/sys/bus/pci/devices/{bus_key(bus_id)}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def nvml_gpus(
    nvml: Any,
    env: str | None,
    device_order: str | None = None,
    cuda_uuids: Callable[[], list[str]] | None = None,
) -> list[Gpu]:
    """The GPUs CUDA sees, in CUDA's order, read through NVML. `env`: CUDA_VISIBLE_DEVICES;
    `device_order`: CUDA_DEVICE_ORDER. On a mixed host under FASTEST_FIRST the order comes from
    `cuda_uuids` (CUDA's visible devices' UUIDs; None: CUDA is not usable, NVML's order is
    kept), each matched to NVML's GPU (or a MIG instance's GPU) by UUID; otherwise no CUDA
    context is made."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = [as_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    names = [as_text(nvml.nvmlDeviceGetName(h)) for h in handles]
    migs = mig_instances(nvml, handles)
    visible = visible_nvml_indices(uuids, env, migs)
    if cuda_uuids is not None and cuda_order_may_differ(names, device_order):
        by_key = {**migs, **{uuid_key(u): i for i, u in enumerate(uuids)}}
        try:
            visible = [by_key[uuid_key(u)] for u in cuda_uuids()]
        except Exception:  # noqa: BLE001, S110 - CUDA fails or a UUID NVML lacks: NVML's order
            pass
    gpus = []
    for cuda_index, i in enumerate(visible):
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
                name=names[i],
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
    import torch  # noqa: PLC0415 - only where CUDA is asked (see the package's `collect`)

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
