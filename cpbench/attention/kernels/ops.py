"""What the GPU kernels ask of the installed torch and libraries, behind one small indirection.

Why by the schema's names, and what tests replace: docs/internals.md, "Local attention kernels"."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cpbench.errors import CpbenchError


def aten_op(name: str) -> Any:
    """The default overload of `torch.ops.aten.<name>` (its `_schema` names the arguments)."""
    return getattr(torch.ops.aten, name).default


def call_op(name: str, **arguments: Any) -> Any:
    """Call `aten.<name>` with the arguments its schema names, each by name. Arguments the
    schema lacks are dropped (they belong to another torch release); a schema argument that is
    neither given nor defaulted is an error naming it."""
    op = aten_op(name)
    kwargs: dict[str, Any] = {}
    for arg in op._schema.arguments:
        if arg.name in arguments:
            kwargs[arg.name] = arguments[arg.name]
        elif not arg.has_default_value():
            raise CpbenchError(
                f"aten.{name} of torch {torch.__version__} takes {arg.name!r} ({arg.type}), "
                f"which cpbench does not pass: this torch release is not supported by the kernel"
            )
    return op(**kwargs)


def call_with_signature(
    fn: Callable[..., Any],
    known: dict[str, Any],
    *args: Any,
    required: Sequence[tuple[str, ...]] = (),
) -> Any:
    """Call a Python function (flash-attn's private API) with `args` positionally and, by
    name, those of `known` its signature has (the others belong to another release). A
    parameter without a default that neither covers, or a `required` group (one setting's
    names across releases, e.g. the window) it takes none of, is an error naming it: a dropped
    argument that changes the mathematics is never silent. `custom_op` wrappers are inspected
    through the function they wrap."""
    params = list(inspect.signature(getattr(fn, "_init_fn", fn)).parameters.values())
    names = {param.name for param in params}
    module = getattr(fn, "__module__", "?")
    for group in required:
        if not names.intersection(group):
            raise CpbenchError(
                f"{module}.{getattr(fn, '__name__', fn)} takes no {' / '.join(group)}, which "
                f"this call needs (its value changes the result): this release of the library "
                f"cannot run it"
            )
    kwargs: dict[str, Any] = {}
    for param in params[len(args) :]:
        if param.name in known:
            kwargs[param.name] = known[param.name]
        elif param.default is inspect.Parameter.empty and param.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            raise CpbenchError(
                f"{module}.{getattr(fn, '__name__', fn)} takes {param.name!r}, which cpbench "
                f"does not pass: this release of the library is not supported by the kernel"
            )
    return fn(*args, **kwargs)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """`x` itself when its last dimension is contiguous, else a contiguous copy: exactly what
    flash-attn's `maybe_contiguous` does, so a strided view (K or V of the packed
    `[B, S, 2, H, D]` buffer, a row slice of a ring block) reaches the kernel without a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA device, None for other devices or without CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def cudnn_version() -> int | None:
    """cuDNN's version number (e.g. 90100 for 9.1.0), None when cuDNN is not usable."""
    if not torch.backends.cudnn.is_available():
        return None
    version = torch.backends.cudnn.version()
    return int(version) if version is not None else None
