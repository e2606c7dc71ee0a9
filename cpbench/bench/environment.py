"""What a result was measured on: versions, devices, hosts and the environment variables that
change communication behaviour. Collected on every rank (hostnames and devices differ)."""

from __future__ import annotations

import os
import platform
import socket
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
