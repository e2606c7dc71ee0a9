"""NVML's view of one process's GPU memory, sampled while a step runs.

What NVML counts, and why by UUID and PID: docs/internals.md, "A process's GPU memory from NVML"."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Any

DEFAULT_INTERVAL_S = 0.01
"""Seconds between two samples (each one driver query, made off the main thread; the probe's
step is not one of the timed iterations)."""

QUERIES = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses",
)
"""The running-process queries tried, in order: `_v3` where nvidia-ml-py and the driver have it,
then the unversioned one (which nvidia-ml-py maps to the newest version it knows); the first
that answers is used from then on and named in the record."""


DRIVER_ENTRY_BYTES = 24
"""What the driver writes per process for the `_v3` query: nvml.h's `nvmlProcessInfo_v2_t`
(pid, usedGpuMemory, gpuInstanceId, computeInstanceId: 4 + 4 padding + 8 + 4 + 4 bytes)."""


def process_struct_mismatch(nvml: Any) -> str | None:
    """Why this pynvml would misread the running-process list, None when the structure it reads
    the entries with (`c_nvmlProcessInfo_v3_t`, before 12.560 `c_nvmlProcessInfo_t`) has the
    driver's size. nvidia-ml-py 12.535.77 added a field (32-byte entries), so every process
    after the first was read from the wrong offset; 12.535.108 restored the 24-byte layout
    (pyproject's floor)."""
    struct = getattr(nvml, "c_nvmlProcessInfo_v3_t", None) or getattr(
        nvml, "c_nvmlProcessInfo_t", None
    )
    if struct is None or ctypes.sizeof(struct) == DRIVER_ENTRY_BYTES:
        return None
    return (
        f"this nvidia-ml-py (pynvml) reads running processes as "
        f"{ctypes.sizeof(struct)}-byte entries where the driver writes {DRIVER_ENTRY_BYTES}: "
        f"every process after the first would be misread; install nvidia-ml-py>=12.535.108"
    )


UUID_PREFIXES = ("GPU-", "MIG-")
"""NVML's UUID strings: "GPU-<uuid>" for a whole GPU, "MIG-<uuid>" for a MIG instance (R470
and later; `nvidia-smi -L` lists both)."""


def nvml_uuid(uuid: object) -> str:
    """A GPU UUID as NVML takes it ("GPU-..."): torch's `get_device_properties(i).uuid` prints
    without the prefix on some versions and with it on others. A bare UUID may also be a MIG
    instance's (CUDA reports the instance's own UUID, torch adds no prefix): `handle_by_uuid`
    tries "MIG-" too."""
    text = str(uuid)
    return text if text.startswith(UUID_PREFIXES) else f"GPU-{text}"


def uuid_key(uuid: object) -> str:
    """The UUID without its NVML prefix, lower case: what a torch UUID, a CUDA_VISIBLE_DEVICES
    entry and NVML's "GPU-" / "MIG-" strings are compared by."""
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


def handle_by_uuid(nvml: Any, uuid: object) -> Any:
    """NVML's handle of the device with this UUID: as given (when it has a prefix), then as a
    GPU ("GPU-<key>") and as a MIG instance ("MIG-<key>"): `nvml_uuid` makes a MIG instance's
    bare UUID "GPU-...", which NVML does not know, and the instance's own handle is the one
    whose process list has this process's memory (under MIG the parent GPU's has none per
    instance). Raises the last NVML error when none matches."""
    text, key = str(uuid), uuid_key(uuid)
    candidates = list(dict.fromkeys([text, *(f"{p}{key}" for p in UUID_PREFIXES)]))
    if not text.startswith(UUID_PREFIXES):
        candidates.remove(text)
    error: Exception | None = None
    for candidate in candidates:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(candidate)
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotFound: try the next form
            error = exc
    assert error is not None
    raise error


def load_nvml(nvml: Any = None) -> Any:
    """The NVML module, initialised: `nvml` (tests pass a fake), else nvidia-ml-py's pynvml.
    Raises what the import or nvmlInit raises (no library, no driver); the caller shuts it down.
    cpbench's one NVML loader (the memory sampler, the clock reader, `cpbench doctor`)."""
    if nvml is None:
        import pynvml  # noqa: PLC0415 - optional at run time: no driver, no library

        nvml = pynvml
    nvml.nvmlInit()
    return nvml


class ProcessMemorySampler:
    """`with ProcessMemorySampler(uuid) as sampler: step()` then `sampler.peak_bytes` (None when
    unknown) and `sampler.source` (what measured it, or why there is no number).

    `nvml` is the pynvml module (`import pynvml` when None; tests pass a fake); `pid` defaults
    to this process."""

    def __init__(
        self,
        device_uuid: str,
        pid: int | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        nvml: Any = None,
    ) -> None:
        self.device_uuid = nvml_uuid(device_uuid)
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self.peak_bytes: int | None = None
        self.samples = 0
        self.error: str | None = None
        self.query: str | None = None
        self._nvml: Any = nvml
        self._initialised = False
        self._handle: Any = None
        self._listed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ sampling

    def _processes(self) -> list[Any]:
        """The running compute processes of the device (the first query that works)."""
        nvml = self._nvml
        assert nvml is not None
        if self.query is not None:
            return list(getattr(nvml, self.query)(self._handle))
        error: Exception | None = None
        for name in QUERIES:
            query = getattr(nvml, name, None)
            if query is None:
                continue
            try:
                processes = list(query(self._handle))
            except Exception as exc:  # noqa: BLE001 - an old driver lacks v3: try the next
                error = exc
                continue
            self.query = name
            return processes
        raise RuntimeError(f"no NVML running-process query works here ({error})")

    def sample(self) -> int | None:
        """One sample: this PID's memory on the device now (None when NVML does not list it);
        the peak is updated."""
        used: int | None = None
        listed = False
        for process in self._processes():
            if int(process.pid) != self.pid:
                continue
            listed = True
            if process.usedGpuMemory is not None:  # None: the driver withholds it (WDDM)
                used = (used or 0) + int(process.usedGpuMemory)  # one entry per MIG instance
        with self._lock:
            self.samples += 1
            self._listed = self._listed or listed
            if used is not None:
                self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)
        return used

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - keep what was sampled, say what failed
                self.error = f"sampling stopped: {type(exc).__name__}: {exc}"
                return

    # ------------------------------------------------------------------------------ lifetime

    def start(self) -> ProcessMemorySampler:
        try:
            self._nvml = load_nvml(self._nvml)
            self._initialised = True
            mismatch = process_struct_mismatch(self._nvml)
            if mismatch is not None:
                raise RuntimeError(mismatch)
            self._handle = handle_by_uuid(self._nvml, self.device_uuid)
            self.sample()
        except Exception as exc:  # noqa: BLE001 - NVML missing or failing: no number, a reason
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"
            self._shutdown()
            return self
        self._thread = threading.Thread(target=self._run, name="cpbench-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self.error is None:
                try:
                    self.sample()  # the step's end (the caller synchronised the device)
                except Exception as exc:  # noqa: BLE001
                    self.error = f"last sample failed: {type(exc).__name__}: {exc}"
        self._shutdown()

    def _shutdown(self) -> None:
        if self._initialised and self._nvml is not None:
            with contextlib.suppress(Exception):  # nothing to do about a failing shutdown
                self._nvml.nvmlShutdown()
            self._initialised = False

    def __enter__(self) -> ProcessMemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------- answer

    @property
    def source(self) -> str:
        """What measured `peak_bytes`, or why it is None."""
        if self.peak_bytes is not None:
            text = (
                f"NVML {self.query}: usedGpuMemory of this process (pid {self.pid}) on "
                f"{self.device_uuid}, max of {self.samples} samples every "
                f"{self.interval_s * 1e3:g} ms during the step"
            )
            return f"{text} ({self.error})" if self.error else text
        if self.error is not None:
            return self.error
        if self._listed:
            return (
                f"NVML {self.query} lists this process (pid {self.pid}) on {self.device_uuid} "
                f"without its usedGpuMemory (the driver withholds it)"
            )
        return (
            f"NVML {self.query} does not list this process (pid {self.pid}) on "
            f"{self.device_uuid} in {self.samples} samples (a container's PID namespace "
            f"hides it from the driver)"
        )
