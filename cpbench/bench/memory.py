"""Peak memory of one step, per rank, with the source named.

- GPU: the torch CUDA caching allocator's peak (`max_memory_allocated`, what tensors occupy)
  and NVML's device memory in use (what the user sees in nvidia-smi, incl. NCCL buffers and
  the CUDA context).
- CPU: a tensor-allocation tracker (a TorchDispatchMode that adds up the storages created by
  every op and drops them when they die) — the quantity the analytic model predicts — and the
  process's peak RSS (VmHWM, reset before the step), the quantity the user pays for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_flatten


class TensorAllocationTracker(TorchDispatchMode):
    """Live and peak bytes of the tensor storages created while the mode is active."""

    def __init__(self, existing: Iterable[torch.Tensor | None] = ()) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        # Storages alive before the step (the inputs) are known at 0 bytes, so that views of
        # them made during the step (q.unsqueeze, slices) are not counted as new allocations.
        for t in existing:
            if t is not None:
                storage = t.untyped_storage()
                self._live[storage.data_ptr()] = (StorageWeakRef(storage), 0)
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Iterable[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # A wrapper subclass (DTensor, as torch's context parallelism uses) owns no storage
            # and runs its own ops on plain local tensors: defer to it with this mode still
            # active, so those local allocations are counted (returning NotImplemented from a
            # mode hands the op to the subclass's __torch_dispatch__).
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        # Drop dead storages first: a new storage may reuse a freed one's address.
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            self.current -= self._live.pop(key)[1]
        for t in tree_flatten(out)[0]:
            if (
                isinstance(t, torch.Tensor)
                and t.device.type == "cpu"
                and not is_traceable_wrapper_subclass_type(type(t))
            ):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._live:
                    self._live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind some tensors (inputs alive before the step)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _read_vm_hwm() -> int | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_vm_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


def _nvml_used_bytes(device_index: int) -> int | None:
    """Device memory in use on this rank's GPU. NVML numbers GPUs in PCI order and ignores
    CUDA_VISIBLE_DEVICES, so the GPU is looked up by its UUID, not by the CUDA index."""
    try:
        import pynvml  # noqa: PLC0415 - nvidia-ml-py; raises without a driver

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(
            uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        )
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - NVML missing or failing: the allocator number stands
        return None


def measure_peak_memory(
    step: Callable[[], Any], device: torch.device, inputs: Iterable[torch.Tensor | None]
) -> dict[str, Any]:
    """Run `step` once and return this rank's peak memory with its sources."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return {
            "peak_bytes": int(torch.cuda.max_memory_allocated(device)),
            "source": "torch-cuda-allocator",
            "rss_peak_bytes": None,
            "nvml_used_bytes": _nvml_used_bytes(device.index or 0),
        }
    inputs = list(inputs)
    baseline = storage_bytes(inputs)
    rss_ok = _reset_vm_hwm()
    with TensorAllocationTracker(existing=inputs) as tracker:
        step()
    return {
        "peak_bytes": baseline + tracker.peak,
        "source": "cpu-tensor-tracker",
        "rss_peak_bytes": _read_vm_hwm() if rss_ok else None,
        "nvml_used_bytes": None,
    }
