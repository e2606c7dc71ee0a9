"""What a result was measured on: versions, devices, hosts and the environment variables that
change communication behaviour. Collected on every rank (hostnames and devices differ)."""

from __future__ import annotations

import os
import platform
import socket
import time
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
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = None
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
LOAD_MARGIN = 0.5
"""Load average above the ranks' own (ranks x threads) plus this margin counts as other load."""


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
    """The host's load now: the 1-minute load average and the CPU time counters."""
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return {"load1": load, "cpu_times": _cpu_times(), "time": time.monotonic()}


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
    gpus: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The record's `environment.machine`: ranks per core (CPU runs), the load average and CPU
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
    # The 1-minute average before a configuration still holds the previous one's ranks (a
    # sweep runs them back to back): only load beyond what these ranks make is other load.
    expected = max(cores, busy) if device == "cpu" else 0
    if load_before is not None and device == "cpu" and load_before > expected + LOAD_MARGIN:
        warnings.append(
            f"other load before the run: 1-minute load average {load_before:.2f} > "
            f"{expected} ({busy} busy rank thread(s) on {cores} cores)"
        )
    steal = steal_share(before, after)
    if steal is not None and steal > STEAL_WARNING:
        warnings.append(f"CPU steal {steal:.1%} of the CPU time during the run (a shared VM)")
    for gpu in gpus or []:
        reasons = gpu.get("throttle") or []
        if reasons:
            warnings.append(f"GPU {gpu.get('index')}: clocks throttled ({', '.join(reasons)})")
    return {
        "cores": cores,
        "ranks_on_node": ranks_here,
        "threads_per_rank": threads_per_rank,
        "ranks_per_core": per_core,
        "oversubscribed": bool(per_core is not None and per_core > 1),
        "load1_before": load_before,
        "load1_after": load_after,
        "own_load": min(busy, cores) if device == "cpu" else 0,
        "steal": steal,
        "seconds": after["time"] - before["time"],
        "gpus": gpus,
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


def gpu_clock_state(device_index: int) -> dict[str, Any] | None:
    """This rank's GPU clocks and throttle reasons from NVML (read only; found by UUID); None
    where NVML is missing or fails."""
    try:
        from cpbench.bench.nvml import _load_nvml, nvml_uuid  # noqa: PLC0415

        nvml = _load_nvml()
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVML is optional
        return None
    try:
        uuid = nvml_uuid(torch.cuda.get_device_properties(device_index).uuid)
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
        sm = int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        sm_max = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        mask = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        return {
            "index": device_index,
            "sm_clock_mhz": sm,
            "sm_clock_max_mhz": sm_max,
            "throttle": [name for bit, name in THROTTLE_NAMES.items() if mask & bit and bit != 0x1],
        }
    except Exception:  # noqa: BLE001 - a query the driver lacks
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001,S110
            pass
