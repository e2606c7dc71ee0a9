"""What a result was measured on: versions, devices, hosts and the environment variables that
change communication behaviour. Collected on every rank (hostnames and devices differ)."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL", "GLOO_", "OMP_", "MASTER_", "NVTE_")


def _flash_attn_version() -> str | None:
    try:
        import flash_attn  # noqa: PLC0415 - optional
    except ImportError:
        return None
    return str(getattr(flash_attn, "__version__", "unknown"))


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class RankHost:
    """A rank's host and device (`rank_environment`)."""

    hostname: str
    device: str
    """The device's name ("cpu: <model>" on the CPU)."""
    torch_threads: int
    """torch's intra-op threads of the rank's process."""


def rank_environment(device: str) -> dict[str, Any]:
    """This rank's host and device."""
    if device == "cuda":
        index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
    else:
        name = f"cpu: {_cpu_model()}"
    return {
        "hostname": socket.gethostname(),
        "device": name,
        "torch_threads": torch.get_num_threads(),
    }


def process_environment() -> dict[str, Any]:
    """Versions and variables, the same on every rank of a run."""
    nccl = None
    if torch.cuda.is_available():
        with contextlib.suppress(AttributeError, RuntimeError):
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    from cpbench import __version__  # noqa: PLC0415

    return {
        "cpbench": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "flash_attn": _flash_attn_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


# ------------------------------------------------------------------------- the machine's state

STEAL_WARNING = 0.02
"""CPU steal above this share of the CPU time during a configuration is warned about."""
OTHER_CPU_WARNING = 0.10
"""CPU time of other processes above this share of the machine's CPU time during a
configuration is warned about (background daemons stay well below it: 0.3 % measured in 3 s
windows on the idle 2-core development VM; one stranger burning a core during a 2-rank sweep
there: 39-42 %)."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times() -> dict[str, int] | None:
    """The aggregate "cpu" line of /proc/stat in clock ticks (user ... steal); None where it
    cannot be read."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1 : 1 + len(names)]]
    return dict(zip(names, values, strict=False))


def host_snapshot() -> dict[str, Any]:
    """The host's load now: the 1-minute load average, the machine's CPU time counters and
    this process's own CPU seconds (all its threads)."""
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return {
        "load1": load,
        "cpu_times": _cpu_times(),
        "time": time.monotonic(),
        "process_cpu": time.process_time(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }


_waiting_since: list[float] = []
"""This process's CPU seconds when it began waiting for its next task (pool workers)."""


def rank_waiting() -> None:
    """Called by a pool worker before it waits for its next task: what it spends from here
    (receiving and unpickling the task, importing the modules it names) is the task's."""
    _waiting_since[:] = [time.process_time()]


def rank_cpu_mark() -> dict[str, Any]:
    """Where a rank's task starts: its process's CPU seconds (all threads; from when a pool
    worker began waiting for the task), pid and host."""
    start = _waiting_since[0] if _waiting_since else time.process_time()
    return {"start": start, "pid": os.getpid(), "host": socket.gethostname()}


@dataclass(frozen=True)
class RankCpu:
    """A rank task's CPU use (`rank_cpu_usage`)."""

    seconds: float
    """CPU seconds of the rank's process (all threads) in the task."""
    pid: int
    host: str


def rank_cpu_usage(mark: dict[str, Any]) -> RankCpu:
    """A rank task's CPU use since `rank_cpu_mark` (its measurement's `cpu`)."""
    return RankCpu(time.process_time() - mark["start"], mark["pid"], mark["host"])


def _clock_ticks_per_second() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


def other_cpu_share(
    before: dict[str, Any],
    after: dict[str, Any],
    ranks_cpu: Sequence[RankCpu | None] | None,
) -> float | None:
    """Share of the machine's CPU time that processes other than this one and its ranks on
    this host used between two snapshots: (busy CPU time of the machine - the ranks' and this
    process's own CPU time) / all CPU time, from /proc/stat and each process's own clock
    (a rank that is this process is counted once). None where /proc/stat is unreadable,
    nothing elapsed, or a rank did not report its CPU time."""
    a, b = before.get("cpu_times"), after.get("cpu_times")
    if not a or not b or ranks_cpu is None or any(c is None for c in ranks_cpu):
        return None
    delta = {k: b[k] - a[k] for k in a if k in b}
    total = sum(delta.values())
    if total <= 0:
        return None
    idle = delta.get("idle", 0) + delta.get("iowait", 0) + delta.get("steal", 0)
    busy_s = (total - idle) / _clock_ticks_per_second()
    host, pid = before.get("host"), before.get("pid")
    here = [c for c in ranks_cpu if c is not None and c.host == host]
    own_s = sum(c.seconds for c in here)
    if pid is None or all(c.pid != pid for c in here):
        own_s += float(after.get("process_cpu", 0.0)) - float(before.get("process_cpu", 0.0))
    return max(0.0, busy_s - own_s) / (total / _clock_ticks_per_second())


def steal_share(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """Share of the CPU time stolen by the hypervisor between two snapshots (None where
    /proc/stat is unreadable or nothing elapsed)."""
    a, b = before.get("cpu_times"), after.get("cpu_times")
    if not a or not b or "steal" not in a or "steal" not in b:
        return None
    total = sum(b.values()) - sum(a.values())
    return (b["steal"] - a["steal"]) / total if total > 0 else None


def machine_state(
    before: dict[str, Any],
    after: dict[str, Any],
    world_size: int,
    threads_per_rank: int,
    device: str,
    nodes: int = 1,
    gpus: list[GpuClocks] | None = None,
    ranks_cpu: Sequence[RankCpu | None] | None = None,
) -> dict[str, Any]:
    """The record's `environment.machine`: ranks per core (CPU runs), the load average, the
    CPU time other processes used (`other_cpu_share`, from the ranks' `ranks_cpu`) and CPU
    steal around the configuration, each GPU's clocks and throttling, and the warnings these
    call for (oversubscribed cores, other load, steal, throttling)."""
    cores = usable_cores()
    ranks_here = max(1, world_size // max(1, nodes))
    busy = ranks_here * max(1, threads_per_rank) if device == "cpu" else ranks_here
    per_core = busy / cores if device == "cpu" else None
    warnings: list[str] = []
    if per_core is not None and per_core > 1:
        warnings.append(
            f"oversubscribed: {ranks_here} ranks x {threads_per_rank} thread(s) on {cores} "
            f"cores = {per_core:.2g} per core; ranks wait for each other's cores, so times "
            "are noisy and include scheduling"
        )
    load_before, load_after = before.get("load1"), after.get("load1")
    # Measured, not inferred from the load average: the 1-minute average lags by a minute
    # (before a configuration it still holds the previous one's ranks) and counts the ranks'
    # communication threads too.
    other = other_cpu_share(before, after, ranks_cpu)
    if other is not None and other > OTHER_CPU_WARNING:
        warnings.append(
            f"other load during the run: other processes used {other:.0%} of the machine's "
            f"CPU time (> {OTHER_CPU_WARNING:.0%}; the ranks' and cpbench's own excluded)"
        )
    steal = steal_share(before, after)
    if steal is not None and steal > STEAL_WARNING:
        warnings.append(f"CPU steal {steal:.1%} of the CPU time during the run (a shared VM)")
    for gpu in gpus or []:
        if gpu.throttle:
            warnings.append(f"GPU {gpu.index}: clocks throttled ({', '.join(gpu.throttle)})")
    return {
        "cores": cores,
        "ranks_on_node": ranks_here,
        "threads_per_rank": threads_per_rank,
        "ranks_per_core": per_core,
        "oversubscribed": bool(per_core is not None and per_core > 1),
        "load1_before": load_before,
        "load1_after": load_after,
        "own_load": min(busy, cores) if device == "cpu" else 0,
        "other_cpu": other,
        "steal": steal,
        "seconds": after["time"] - before["time"],
        "gpus": [asdict(gpu) for gpu in gpus] if gpus else None,
        "warnings": warnings,
    }


THROTTLE_NAMES = {
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
"""NVML clock-throttle reason bits (nvmlClocksThrottleReasons); "gpu idle" is not a problem."""


@dataclass(frozen=True)
class GpuClocks:
    """A rank's GPU clocks and throttling (`gpu_clock_state`; the record's machine.gpus)."""

    index: int
    sm_clock_mhz: int
    sm_clock_max_mhz: int
    throttle: list[str]
    """The clock-throttle reasons in effect (`THROTTLE_NAMES`, "gpu idle" left out)."""


def gpu_clock_state(device_index: int) -> GpuClocks | None:
    """This rank's GPU clocks and throttle reasons from NVML (read only; found by UUID); None
    where NVML is missing or fails."""
    try:
        from cpbench.bench.nvml import handle_by_uuid, load_nvml  # noqa: PLC0415

        nvml = load_nvml()
    except Exception:  # noqa: BLE001 - NVML is optional
        return None
    try:
        handle = handle_by_uuid(nvml, torch.cuda.get_device_properties(device_index).uuid)
        sm = int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        sm_max = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        mask = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        throttle = [name for bit, name in THROTTLE_NAMES.items() if mask & bit and bit != 0x1]
        return GpuClocks(device_index, sm, sm_max, throttle)
    except Exception:  # noqa: BLE001 - a query the driver lacks
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
