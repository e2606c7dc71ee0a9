"""Which of CI's two suite runs (the main torch, then the floor torch: `.ci/run`) runs a test.

Every test runs in a developer's `python -m pytest -q` on the main torch. CI runs the suite twice,
and a test whose outcome cannot depend on the torch runs in one of the two only:

* `ONCE_PER_CI`: minute-long checks of cpbench's own logic (the mutation check, the flash-attn 2
  rule at worlds 4 and 8, the GPU acceptance script's dry run): on the main torch only;
* `torch_free` (the marker): tests that touch no torch at all (the cost model, the planner, the
  recommender, the report, the readers). Under CI (CPBENCH_CI=1) they are left to the
  floor-torch run; wherever they run, `torch_untouched` fails one that calls a torch function,
  reads an attribute of a torch module, starts a process or runs a task on ranks, so the marker
  cannot hide a test that the floor torch could fail.

Both skip reasons are on tests/conftest.py's allow-list, each only where it holds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

# The class bound here, before any test replaces the module's name (tests/conftest.py's
# `lend`); cpbench.bench.pool imports the standard library's multiprocessing only: no torch.
from cpbench.bench.pool import WorkerPool

MAIN_TORCH = (2, 13)
"""The torch of CI's first suite run (the README's quick start pins 2.13.0)."""

ONCE_PER_CI = "runs once per CI, on the main torch"
"""Skip reason of the checks left out of the floor-torch run (see the module docstring)."""

IN_THE_FLOOR_RUN = "torch-free: runs once per CI, in the floor-torch run"
"""Skip reason of a `torch_free` test in CI's main-torch run."""


def torch_release() -> tuple[int, int]:
    """This torch's (major, minor)."""
    import torch  # noqa: PLC0415 - only where a test asks

    release = torch.__version__.split("+")[0].split(".")
    return int(release[0]), int(release[1])


def on_the_main_torch() -> bool:
    """Whether this torch is CI's main one (or newer)."""
    return torch_release() >= MAIN_TORCH


def in_ci() -> bool:
    """Whether this session is CI's (`.ci/run` sets CPBENCH_CI=1)."""
    return os.environ.get("CPBENCH_CI") == "1"


class _WatchedModule(types.ModuleType):
    """A torch module's class while a torch-free test runs: every attribute read is a use (but
    the dunders that the import machinery reads; `__version__` is one)."""

    def __getattribute__(self, name: str) -> Any:
        uses = types.ModuleType.__getattribute__(self, "__dict__").get("_cpbench_uses")
        if uses is not None and (not name.startswith("__") or name == "__version__"):
            uses.append(f"read {types.ModuleType.__getattribute__(self, '__name__')}.{name}")
        return types.ModuleType.__getattribute__(self, name)


@contextlib.contextmanager
def torch_untouched() -> Iterator[list[str]]:
    """Collect what the block does with torch: each torch function called (a tensor made or
    used), each attribute of a torch module read, torch imported, a process started (a CLI in
    a subprocess, a rank), a task run on a pool's ranks. The list is empty for a block that
    touched no torch."""
    uses: list[str] = []
    patched: list[tuple[Any, str, Any]] = []

    def watch(owner: Any, name: str, what: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            uses.append(what)
            return real(*args, **kwargs)

        patched.append((owner, name, real))
        setattr(owner, name, wrapper)

    import multiprocessing.process  # noqa: PLC0415

    watch(subprocess.Popen, "__init__", "started a subprocess")
    watch(multiprocessing.process.BaseProcess, "start", "started a process")
    watch(WorkerPool, "run", "ran a task on a pool's ranks")
    imported = "torch" in sys.modules
    modules = [m for name, m in list(sys.modules.items())
               if (name == "torch" or name.startswith("torch.")) and type(m) is types.ModuleType]
    mode: Any = None
    if imported:
        from torch.overrides import TorchFunctionMode  # noqa: PLC0415

        class Calls(TorchFunctionMode):
            def __torch_function__(self, func: Any, types_: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:  # fmt: skip
                uses.append(f"called {getattr(func, '__qualname__', func)}")
                return func(*args, **(kwargs or {}))

        mode = Calls()
        mode.__enter__()
    for m in modules:
        m._cpbench_uses = uses  # type: ignore[attr-defined]
        m.__class__ = _WatchedModule
    try:
        yield uses
    finally:
        for m in modules:
            m.__class__ = types.ModuleType
            del m._cpbench_uses  # type: ignore[attr-defined]
        if mode is not None:
            mode.__exit__(None, None, None)
        for owner, name, real in reversed(patched):
            setattr(owner, name, real)
        if not imported and "torch" in sys.modules:
            uses.append("imported torch")
