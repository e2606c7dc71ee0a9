"""NVML's per-process memory peak (cpbench.bench.nvml), on CPU with a fake pynvml: the sampler
polls the running-process list of the rank's GPU (found by UUID) while a fake step runs, keeps
the max of this PID's usedGpuMemory and ignores every other process and GPU. And the CUDA path
of the memory probe with torch.cuda's allocator calls faked (no GPU here)."""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from cpbench.bench import memory
from cpbench.bench.nvml import (
    DRIVER_ENTRY_BYTES,
    ProcessMemorySampler,
    handle_by_uuid,
    nvml_uuid,
    process_struct_mismatch,
)

MIB = 2**20
PID = os.getpid()
OTHER_PID = PID + 1
THIS_GPU = "GPU-1111-aaaa"
OTHER_GPU = "GPU-2222-bbbb"


@dataclass
class Process:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's field name


@dataclass
class FakeNvml:
    """pynvml's calls that the sampler uses. `memory[(uuid, pid)]` is a process's memory on a
    GPU now (the fake step changes it while the sampler runs); the other process on this GPU
    and this PID on the other GPU always hold more than this PID here, so the max is wrong
    when either is counted."""

    memory: dict[tuple[str, int], int | None] = field(default_factory=dict)
    has_v3: bool = True
    v3_fails: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    initialised: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    mig: tuple[str, ...] = ()
    """MIG instances' UUIDs ("MIG-..."), each with a handle and a process list of its own."""

    def _count(self, name: str) -> None:
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802
        if uuid not in (THIS_GPU, OTHER_GPU, *self.mig):
            raise RuntimeError(f"NVML_ERROR_NOT_FOUND: {uuid}")
        return f"handle:{uuid}"

    def _list(self, handle: str) -> list[Process]:
        uuid = handle.removeprefix("handle:")
        with self.lock:
            return [Process(pid, used) for (gpu, pid), used in self.memory.items() if gpu == uuid]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Process]:  # noqa: N802
        self._count("plain")
        return self._list(handle)

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlDeviceGetComputeRunningProcesses_v3" and self.has_v3:
            return self._v3
        raise AttributeError(name)

    def _v3(self, handle: str) -> list[Process]:
        self._count("v3")
        if self.v3_fails:
            raise RuntimeError("NVML_ERROR_FUNCTION_NOT_FOUND")  # an old driver
        return self._list(handle)

    def set(self, uuid: str, pid: int, used: int | None) -> None:
        with self.lock:
            self.memory[(uuid, pid)] = used


def _fake(**kwargs: Any) -> FakeNvml:
    fake = FakeNvml(**kwargs)
    fake.set(THIS_GPU, PID, 500 * MIB)  # the CUDA context and the inputs
    fake.set(THIS_GPU, OTHER_PID, 70_000 * MIB)  # another process on this GPU
    fake.set(OTHER_GPU, PID, 30_000 * MIB)  # this PID on another GPU (never this rank's)
    return fake


def rising_and_falling(
    fake: FakeNvml, levels_mib: list[int], hold_s: float = 0.05
) -> Callable[[], None]:
    """A fake step: this PID's memory on this GPU goes through `levels_mib`, each held for
    `hold_s` (5 sampling intervals of 10 ms), while the other process's memory changes too."""

    def step() -> None:
        for i, level in enumerate(levels_mib):
            fake.set(THIS_GPU, PID, level * MIB)
            fake.set(THIS_GPU, OTHER_PID, (80_000 - i) * MIB)
            time.sleep(hold_s)

    return step


def test_the_peak_is_the_max_of_this_pid_on_this_gpu_only() -> None:
    fake = _fake()
    levels = [500, 900, 4_000, 2_500, 1_200, 600]  # the peak in the middle, not at the end
    sampler = ProcessMemorySampler(THIS_GPU, nvml=fake)
    with sampler:
        rising_and_falling(fake, levels)()
    assert sampler.peak_bytes == 4_000 * MIB  # not 600 (the end), not 80_000 or 30_000 (others)
    assert sampler.samples >= len(levels)  # sampled while the step ran, not only at its ends
    assert sampler.query == "nvmlDeviceGetComputeRunningProcesses_v3"
    assert f"pid {PID}" in sampler.source and THIS_GPU in sampler.source
    assert fake.initialised == 0  # nvmlInit and nvmlShutdown paired


def test_the_device_is_found_by_uuid() -> None:
    fake = _fake()
    fake.set(OTHER_GPU, PID, 123 * MIB)
    with ProcessMemorySampler(OTHER_GPU.removeprefix("GPU-"), nvml=fake) as sampler:
        pass
    assert sampler.peak_bytes == 123 * MIB  # the other GPU's list, its UUID given without GPU-
    assert nvml_uuid("1111-aaaa") == THIS_GPU and nvml_uuid(THIS_GPU) == THIS_GPU
    with ProcessMemorySampler("GPU-9999", nvml=fake) as missing:
        pass
    assert missing.peak_bytes is None and "NVML unavailable" in missing.source
    assert "NVML_ERROR_NOT_FOUND" in missing.source and fake.initialised == 0


def test_a_mig_instance_is_found_by_its_uuid_in_any_form() -> None:
    """Under MIG, CUDA (and torch's `uuid`) gives the instance's own UUID with no prefix and
    `nvml_uuid` makes it "GPU-...", which NVML does not know: main's lookup failed and the
    peak was None. `handle_by_uuid` tries the "MIG-" form, whose process list is the one with
    this process's memory on the instance."""
    instance = "MIG-5555-bbbb"
    fake = _fake()
    fake.mig = (instance,)
    fake.set(instance, PID, 321 * MIB)
    for given in ("5555-bbbb", nvml_uuid("5555-bbbb"), instance):
        with ProcessMemorySampler(given, nvml=fake) as sampler:
            pass
        assert sampler.peak_bytes == 321 * MIB, (given, sampler.source)
    assert handle_by_uuid(fake, "1111-aaaa") == f"handle:{THIS_GPU}"  # a whole GPU first
    with pytest.raises(RuntimeError, match="NVML_ERROR_NOT_FOUND: MIG-9999"):
        handle_by_uuid(fake, "9999")


def test_a_step_shorter_than_the_interval_is_sampled_at_both_ends() -> None:
    fake = _fake()
    with ProcessMemorySampler(THIS_GPU, interval_s=60.0, nvml=fake) as sampler:
        fake.set(THIS_GPU, PID, 2_000 * MIB)  # reserved during the step, held at its end
    assert sampler.peak_bytes == 2_000 * MIB and sampler.samples == 2


def test_old_drivers_fall_back_to_the_unversioned_query() -> None:
    fake = _fake(v3_fails=True)
    with ProcessMemorySampler(THIS_GPU, nvml=fake) as sampler:
        rising_and_falling(fake, [800, 1_500, 700])()
    assert sampler.peak_bytes == 1_500 * MIB
    assert sampler.query == "nvmlDeviceGetComputeRunningProcesses"
    assert fake.calls["v3"] == 1  # tried once, then not again
    without_v3 = _fake(has_v3=False)
    with ProcessMemorySampler(THIS_GPU, nvml=without_v3) as plain:
        pass
    assert plain.peak_bytes == 500 * MIB and "v3" not in without_v3.calls


def test_a_pid_nvml_does_not_list_has_no_number_and_says_why() -> None:
    fake = _fake()
    with ProcessMemorySampler(THIS_GPU, pid=424242, nvml=fake) as hidden:
        rising_and_falling(fake, [900, 1_000])()
    assert hidden.peak_bytes is None  # never the other processes' numbers
    assert "does not list this process (pid 424242)" in hidden.source
    assert "PID namespace" in hidden.source
    fake.set(THIS_GPU, PID, None)  # listed, memory withheld (WDDM)
    with ProcessMemorySampler(THIS_GPU, nvml=fake) as withheld:
        pass
    assert withheld.peak_bytes is None and "without its usedGpuMemory" in withheld.source


def test_without_pynvml_the_sampler_reports_nvml_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with ProcessMemorySampler(THIS_GPU) as sampler:
        pass
    assert sampler.peak_bytes is None and sampler.source.startswith("NVML unavailable")


def test_the_probe_uses_pynvml_from_sys_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default module is `import pynvml`: a fake in sys.modules is what the sampler polls."""
    fake = _fake()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with ProcessMemorySampler(THIS_GPU) as sampler:
        rising_and_falling(fake, [700, 3_000, 900])()
    assert sampler.peak_bytes == 3_000 * MIB


def test_cuda_probe_record_names_every_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_peak_memory's CUDA path (torch.cuda's calls faked): empty_cache and the peak
    reset come before the step, NVML is sampled while it runs, each number has its source."""
    fake = _fake()
    events: list[str] = []
    cuda = torch.cuda
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(cuda, "empty_cache", lambda: events.append("empty_cache"))
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: events.append("reset"))
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: 3 * MIB)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: 8 * MIB)
    monkeypatch.setattr(
        cuda,
        "get_device_properties",
        lambda device=None: types.SimpleNamespace(uuid=THIS_GPU.removeprefix("GPU-")),
    )
    step = rising_and_falling(fake, [500, 2_048, 1_000])

    def recorded_step() -> None:
        events.append("step")
        step()

    record = memory.measure_peak_memory(recorded_step, torch.device("cuda", 0), ())
    assert events.index("empty_cache") < events.index("reset") < events.index("step")
    assert events[-1] == "sync"  # synchronised after the step, before the last sample
    assert record.peak_bytes == 3 * MIB and record.source == "torch-cuda-allocator"
    assert record.reserved_peak_bytes == 8 * MIB
    assert record.nvml_process_peak_bytes == 2_048 * MIB
    sources = record.sources
    assert set(sources) == {"peak_bytes", "reserved_peak_bytes", "nvml_process_peak_bytes"}
    assert "max_memory_allocated" in sources["peak_bytes"]
    assert "max_memory_reserved" in sources["reserved_peak_bytes"]
    assert "usedGpuMemory of this process" in sources["nvml_process_peak_bytes"]


def test_an_older_gpu_record_keeps_its_device_wide_nvml_number() -> None:
    """Records written before the per-process probe carry nvml_used_bytes (device-wide, read
    once after the step) and no sources: read as they are, written back unchanged."""
    from cpbench.results.schema import MemorySection, migrate_record  # noqa: PLC0415

    old = {"peak_bytes": [3 * MIB], "source": "torch-cuda-allocator", "nvml_used_bytes": [9 * MIB]}
    memory_section = MemorySection.model_validate(migrate_record({"memory": old})["memory"])
    assert memory_section.nvml_used_bytes == [9 * MIB]
    assert memory_section.nvml_process_peak_bytes is None and memory_section.sources is None
    assert memory_section.model_dump(mode="json", exclude_unset=True) == old


# ------------------------------------------------ the process structure of each nvidia-ml-py

_V2 = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
       ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]  # fmt: skip
RELEASES: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    # release: (the structure `nvmlDeviceGetComputeRunningProcesses_v3` reads with, its fields)
    "12.535.77": ("c_nvmlProcessInfo_t", [*_V2, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]),
    "12.535.108": ("c_nvmlProcessInfo_t", _V2),  # = c_nvmlProcessInfo_v2_t
    "12.560.30": ("c_nvmlProcessInfo_v3_t", _V2),  # = c_nvmlProcessInfo_v2_t
    "13.580.82": ("c_nvmlProcessInfo_v3_t", _V2),
}
"""The ctypes field lists of pynvml.py in each nvidia-ml-py release (read from the wheels)."""


class _DriverEntry(ctypes.Structure):
    """nvml.h's nvmlProcessInfo_v2_t: what the driver writes per process for the v3 query."""

    _fields_ = _V2


def _pynvml_of(release: str, processes: list[tuple[int, int]]) -> Any:
    """A pynvml whose v3 query does what pynvml.py does: an array of the release's structure
    handed to the driver, which fills it with 24-byte entries, then read back entry by entry."""
    name, fields = RELEASES[release]
    struct = type(name, (ctypes.Structure,), {"_fields_": fields})
    driver = (_DriverEntry * len(processes))(*(_DriverEntry(p, m, 0, 0) for p, m in processes))

    def query(handle: object) -> list[Any]:
        array = (struct * len(processes))()
        size = min(ctypes.sizeof(array), ctypes.sizeof(driver))
        ctypes.memmove(array, driver, size)  # the driver writes its layout into the buffer
        return list(array)

    return types.SimpleNamespace(
        **{name: struct}, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid, nvmlDeviceGetComputeRunningProcesses_v3=query,
    )  # fmt: skip


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_process_list_is_read_right_with_each_releases_structure(release: str) -> None:
    """Two processes on the GPU, this one second (7 GiB): every supported release (>= the
    pyproject floor) reads 7 GiB; 12.535.77 (32-byte structure) would read garbage for the
    second entry, and the sampler refuses it with the reason instead of a number."""
    listed = [(OTHER_PID, 3 * 1024 * MIB), (PID, 7 * 1024 * MIB)]
    nvml = _pynvml_of(release, listed)
    entries = nvml.nvmlDeviceGetComputeRunningProcesses_v3(None)
    sampler = ProcessMemorySampler(THIS_GPU, nvml=nvml).start()
    sampler.stop()
    floor = _floor()
    if _version(release) >= floor:
        assert [(e.pid, e.usedGpuMemory) for e in entries] == listed
        assert sampler.peak_bytes == 7 * 1024 * MIB and process_struct_mismatch(nvml) is None
    else:
        assert [(e.pid, e.usedGpuMemory) for e in entries] != listed  # the misread
        assert sampler.peak_bytes is None and "32-byte entries" in sampler.source


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _floor() -> tuple[int, ...]:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    match = re.search(r'"nvidia-ml-py>=([0-9.]+)"', text)
    assert match, "pyproject.toml pins nvidia-ml-py with a floor"
    return _version(match.group(1))


def test_the_nvidia_ml_py_floor_excludes_the_misreading_release() -> None:
    """pyproject's floor admits no release whose structure mismatches (main's `>=12`
    admitted 12.535.77)."""
    assert _floor() >= (12, 535, 108)
    for release, (_, fields) in RELEASES.items():
        struct = type("S", (ctypes.Structure,), {"_fields_": fields})
        if _version(release) >= _floor():
            assert ctypes.sizeof(struct) == DRIVER_ENTRY_BYTES == ctypes.sizeof(_DriverEntry)
