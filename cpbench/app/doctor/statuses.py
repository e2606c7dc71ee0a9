"""What can run here: each local kernel x dtype (`select_kernel`'s rules), each implementation on
a typical configuration of this machine, and the torch.distributed backends."""

from __future__ import annotations

from cpbench.app.doctor.schema import BackendStatus, ImplStatus, KernelStatus
from cpbench.config.bench import BenchConfig
from cpbench.config.impls import IMPLS
from cpbench.config.vocabulary import BACKENDS, DEFAULT_DTYPE, DTYPES, Device
from cpbench.errors import CpbenchError


def kernel_statuses(device: Device) -> list[KernelStatus]:
    """Every kernel x dtype through `select_kernel` (its CpbenchError is the reason)."""
    import torch  # noqa: PLC0415 - here: reading a saved report needs none of it

    from cpbench.attention.kernels import select_kernel  # noqa: PLC0415

    out = []
    for name in BACKENDS:
        for dtype in DTYPES:
            resolved: str | None = None
            reason: str | None = None
            try:
                resolved = select_kernel(device, getattr(torch, dtype), name).name
            except CpbenchError as exc:  # the kernel's rule
                reason = str(exc)
            except Exception as exc:  # noqa: BLE001 - a broken install (an ABI mismatch)
                reason = f"{type(exc).__name__}: {exc}"
            out.append(KernelStatus(name=name, device=device, dtype=dtype,
                                    usable=reason is None, resolved=resolved, reason=reason))
    return out


def probe_config(device: Device, world_size: int) -> BenchConfig:
    """A typical configuration of this machine (a ring over every GPU, 2 ranks on CPU, in the
    device's default dtype) on which the impls' capability rules are checked."""
    return BenchConfig(
        seq_len=4096 * world_size, batch=1, heads=8, kv_heads=8, head_dim=64,
        dtype=DEFAULT_DTYPE[device], causal=True, ulysses=1, ring=world_size, layout="zigzag",
        kv_replication=None, kernel="auto", phase="fwd+bwd", device=device,
        world_size=world_size,
    )


def impl_statuses(config: BenchConfig) -> list[ImplStatus]:
    """Every impl: its install hint first, then its rule for `config`."""
    from cpbench.impls import get_adapter  # noqa: PLC0415

    out = []
    for name in IMPLS:
        adapter = get_adapter(name)
        try:
            reason = adapter.installed() or adapter.capability(config)
        except Exception as exc:  # noqa: BLE001 - a library that fails in an unforeseen way
            reason = f"checking it raised {type(exc).__name__}: {exc}"
        out.append(ImplStatus(name=name, version=adapter.version(), kernel=adapter.kernel,
                              usable=reason is None, reason=reason))
    return out


def backend_statuses(gpu_count: int) -> list[BackendStatus]:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    has = dist.is_available()
    gloo = has and dist.is_gloo_available()
    nccl = has and dist.is_nccl_available()
    nccl_reason = None
    if not nccl:
        nccl_reason = f"torch {torch.__version__} is built without NCCL"
    elif gpu_count == 0:
        nccl_reason = "built, but no GPU is visible"
    return [
        BackendStatus(name="gloo", built=gloo, usable=gloo,
                      reason=None if gloo else f"torch {torch.__version__} lacks gloo"),
        BackendStatus(name="nccl", built=nccl, usable=nccl and gpu_count > 0, reason=nccl_reason),
    ]

