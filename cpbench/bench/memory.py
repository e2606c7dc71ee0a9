"""Peak memory of one step, per rank, with the source named (allocator, NVML, tracker, RSS).

What each source counts: docs/design.md section 7."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cpbench.bench.nvml import ProcessMemorySampler, nvml_uuid
from cpbench.compat import is_traceable_wrapper_subclass_type


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

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No: torch (2.13) otherwise wraps `__torch_dispatch__` in `torch._disable_dynamo`,
        whose first call imports torch._dynamo (3.7 s here, 17 s on a loaded machine) inside
        the first configuration's timeout; nothing compiles inside this mode."""
        return False

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
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def _reset_vm_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


CPU_SOURCES = {
    "peak_bytes": "cpu-tensor-tracker: bytes of the inputs' storages plus the peak of the "
    "storages the step's ops created and had alive at once (TorchDispatchMode)",
    "rss_peak_bytes": "/proc/self/status VmHWM after /proc/self/clear_refs reset it before the "
    "step: the process's peak resident memory",
}
"""What measured each number of a CPU rank (recorded as the memory section's `sources`)."""

CUDA_SOURCES = {
    "peak_bytes": "torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats "
    "right before the step: tensors alive at once",
    "reserved_peak_bytes": "torch.cuda.max_memory_reserved, reset the same way after "
    "torch.cuda.empty_cache: what the caching allocator held from the driver",
}
"""What measured the allocator numbers of a GPU rank; NVML's source comes from the sampler."""


@dataclass(frozen=True)
class RankMemory:
    """A rank's peak memory over one step (`measure_peak_memory`): the fields of the record's
    `MemorySection` for one rank, with `sources` naming what measured each number."""

    peak_bytes: int
    source: str
    reserved_peak_bytes: int | None
    nvml_process_peak_bytes: int | None
    rss_peak_bytes: int | None
    sources: dict[str, str]


def freeze_startup_objects() -> None:
    """A rank calls it once its imports are done: what exists now (torch's and the other
    modules' objects, never garbage) leaves the cycle collector's sight, so that each
    `release_cached_memory` walks only what the rank made since (a full collection walked
    torch's 200,000 objects: 90 ms per configuration per rank on CPU)."""
    gc.freeze()


def release_cached_memory(device: torch.device) -> None:
    """Let earlier work stop counting: collect unreachable tensors (the reference check's, an
    earlier configuration's) and, on CUDA, return the caching allocator's unused blocks to the
    driver, so that neither the allocator's reserve nor NVML's process memory still holds them."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _device_uuid(device: torch.device) -> str:
    return nvml_uuid(torch.cuda.get_device_properties(device).uuid)


def measure_peak_memory(
    step: Callable[[], Any],
    device: torch.device,
    inputs: Iterable[torch.Tensor | None],
    nvml: Any = None,
) -> RankMemory:
    """Run `step` once and return this rank's peak memory with the source of each number
    (`sources`, by field). `nvml` replaces the pynvml module (tests)."""
    if device.type == "cuda":
        release_cached_memory(device)
        torch.cuda.reset_peak_memory_stats(device)
        with ProcessMemorySampler(_device_uuid(device), nvml=nvml) as sampler:
            step()
            torch.cuda.synchronize(device)
        return RankMemory(
            peak_bytes=int(torch.cuda.max_memory_allocated(device)),
            source="torch-cuda-allocator",
            reserved_peak_bytes=int(torch.cuda.max_memory_reserved(device)),
            nvml_process_peak_bytes=sampler.peak_bytes,
            rss_peak_bytes=None,
            sources={**CUDA_SOURCES, "nvml_process_peak_bytes": sampler.source},
        )
    inputs = list(inputs)
    baseline = storage_bytes(inputs)
    rss_ok = _reset_vm_hwm()
    with TensorAllocationTracker(existing=inputs) as tracker:
        step()
    rss = _read_vm_hwm() if rss_ok else None
    sources = dict(CPU_SOURCES)
    if rss is None:
        sources["rss_peak_bytes"] = "unavailable: /proc/self/clear_refs or VmHWM not readable"
    return RankMemory(baseline + tracker.peak, "cpu-tensor-tracker", None, None, rss, sources)
