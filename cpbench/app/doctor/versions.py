"""What is installed: torch's build (CUDA, NCCL, cuDNN) and the attention libraries' versions,
read from distribution metadata so that nothing heavy is imported to learn a version."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence

from cpbench.app.doctor.schema import Package

PACKAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("torch", "torch", ("torch",)),
    ("flash-attn", "flash_attn", ("flash-attn", "flash_attn")),
    ("FlashAttention-3", "flash_attn_interface", ("flash_attn_3", "flash-attn-3",
                                                  "flashattn-hopper")),
    ("TransformerEngine", "transformer_engine", ("transformer-engine", "transformer_engine",
                                                 "transformer-engine-torch")),
    ("ring-flash-attn", "ring_flash_attn", ("ring-flash-attn",)),
    ("yunchang", "yunchang", ("yunchang",)),
    ("nvidia-ml-py", "pynvml", ("nvidia-ml-py", "pynvml")),
)
"""(name, top-level module, distributions that may provide it, first match wins)."""


def package_versions(
    packages: Sequence[tuple[str, str, Sequence[str]]] = PACKAGES,
) -> list[Package]:
    """Each package's version from its distribution's metadata, and whether its module is on
    the path (found, not imported): no CUDA library is loaded to learn a version."""
    owners = importlib.metadata.packages_distributions()
    out = []
    for name, module, candidates in packages:
        version, distribution = None, None
        for dist in [*owners.get(module, []), *candidates]:
            try:
                version, distribution = importlib.metadata.version(dist), dist
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        out.append(Package(name=name, module=module, distribution=distribution,
                           version=version, found=found))
    return out


def nccl_version() -> str | None:
    import torch  # noqa: PLC0415 - torch where its build is asked, not at import
    import torch.distributed as dist  # noqa: PLC0415

    if not (dist.is_available() and dist.is_nccl_available()):
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(x) for x in version) if isinstance(version, tuple) else str(version)


def format_cudnn(code: int | None) -> str | None:
    """cuDNN's version integer as text: 90100 -> '9.1.0' (cuDNN 9 counts major * 10000),
    8902 -> '8.9.2' (cuDNN 8 counts major * 1000)."""
    if code is None:
        return None
    major, rest = (code // 10000, code % 10000) if code >= 90000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def cudnn_release() -> str | None:
    import torch  # noqa: PLC0415

    try:
        return format_cudnn(torch.backends.cudnn.version())
    except (AttributeError, RuntimeError):
        return None


def cuda_reason() -> str | None:
    """Why torch cannot use CUDA here (None when it can)."""
    import torch  # noqa: PLC0415

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and not visible.strip():
            return "CUDA_VISIBLE_DEVICES is empty"
        return "torch sees no CUDA device (no driver, or no GPU)"
    return None

