"""External attention implementations behind one adapter protocol (`cpbench.impls.base`).

The table of impls and libraries: docs/internals.md, "Implementation adapters". Imports no torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from cpbench.config.impls import DEFAULT_IMPL, IMPL_HELP, IMPLS, base_name, check_impl

if TYPE_CHECKING:
    from cpbench.config.bench import BenchConfig
    from cpbench.impls.base import Adapter

_ADAPTER_CLASSES = {
    "cpbench": ("cpbench.impls.cpbench_impl", "CpbenchAdapter"),
    "torch_cp": ("cpbench.impls.torch_cp", "TorchCpAdapter"),
    "ring_flash_attn": ("cpbench.impls.ring_flash", "RingFlashAdapter"),
    "yunchang": ("cpbench.impls.usp", "UspAdapter"),
    "transformer_engine": ("cpbench.impls.te", "TeAdapter"),
}
"""Each base impl name's (module, adapter class); the class is built with the impl name."""

_ADAPTERS: dict[str, Adapter] = {}


def get_adapter(name: str) -> Adapter:
    """The adapter of an impl name (imports its module, not the library)."""
    check_impl(name)
    if name not in _ADAPTERS:
        module, cls = _ADAPTER_CLASSES[base_name(name)]
        _ADAPTERS[name] = getattr(importlib.import_module(module), cls)(name)
    return _ADAPTERS[name]


def skip_reason(config: BenchConfig) -> str | None:
    """Why `config` cannot run with its impl (the library's rule, or that the library is not
    installed, with the install hint); None when it can. Capability comes first: it is pure
    and names the rule even where the library is not installed."""
    adapter = get_adapter(config.impl)
    return adapter.capability(config) or adapter.installed()


__all__ = [
    "DEFAULT_IMPL",
    "IMPLS",
    "IMPL_HELP",
    "get_adapter",
    "skip_reason",
]
