"""Shared fixtures and the skip allow-list.

Fixtures: one persistent pool of gloo ranks per world size for the whole session (spawning a
rank costs seconds, so every multi-rank test reuses them).

Skips: a test may skip only for a platform reason on `PLATFORM_SKIPS`, and only where that
reason holds (e.g. torch_cp only on a torch older than 2.13). Any other skip fails the session
(exit 1) with the list printed: a skip nobody allowed is coverage silently lost. `.ci/run` sets
CPBENCH_CI=1, where what CI installs (Chromium) must not be missing either. Under pytest-xdist
the workers' reports reach these hooks in the controlling process, which sets the exit code.

Order: the heaviest modules first (`HEAVIEST_FIRST`), so that xdist's workers end together.

Bytecode: the suite writes cpbench's `__pycache__` even where PYTHONDONTWRITEBYTECODE is set
(this machine image sets it): the suite starts hundreds of Pythons (CLI runs, ranks, workers),
and without cached bytecode each one compiles every cpbench module it imports again (the GPU
acceptance dry run: 55.9 s without, 43.6 s with, on 2 cores).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import ci_split

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # before any subprocess or xdist worker starts
sys.dont_write_bytecode = False

if TYPE_CHECKING:
    from cpbench.bench.pool import WorkerPool


@pytest.fixture(scope="session")
def pool() -> Iterator[Callable[[int], WorkerPool]]:
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415 - torch, when used

    pools: dict[int, WorkerPool] = {}

    def get(world_size: int) -> WorkerPool:
        if world_size not in pools:
            pools[world_size] = WorkerPool(WorldSpec(world_size, "cpu"))
        return pools[world_size]

    yield get
    for p in pools.values():
        # At once: the session is over and nothing is left to finish; a polite close waits for
        # each rank's interpreter to tear torch down, one rank after another (5-10 s here).
        p.close(force=True)


class LentPool:
    """Stands in for a `WorkerPool` that a command or a sweep creates: the session's pool of
    that world size, started where needed; closing it keeps it open (the session closes it),
    so an in-process sweep or `cpbench verify` spawns no ranks of its own."""

    def __init__(self, lent: WorkerPool) -> None:
        self.lent = lent
        self.spawns = 0
        """Spawns made while lent (a rank killed after a timeout is respawned)."""

    def start(self) -> None:
        before = self.lent.spawns
        self.lent.start()
        self.spawns += self.lent.spawns - before

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
        self.start()
        return self.lent.run(fn, *args, timeout=timeout)

    def close(self, force: bool = False) -> None:
        return None

    def __enter__(self) -> WorkerPool:
        self.start()
        return self.lent

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def lend_the_session_pool(
    pool: Callable[[int], WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """For the test: every `WorkerPool(WorldSpec(n, "cpu"))` that the code under test creates
    (a sweep, `cpbench run`, `cpbench verify`) is the session's pool of n ranks, lent."""
    lend(pool, monkeypatch)


def lend(pool: Callable[[int], WorkerPool], monkeypatch: pytest.MonkeyPatch,
         *users: Any) -> None:  # fmt: skip
    """`lend_the_session_pool` for fixtures of a wider scope (with their own MonkeyPatch);
    `users`: modules that imported `WorkerPool` by name at their import (patched there too)."""
    from cpbench.bench import pool as pool_module  # noqa: PLC0415

    real = pool_module.WorkerPool
    default = pool_module.WorldSpec

    def pool_for(spec: Any, *args: Any, **kwargs: Any) -> Any:
        if spec == default(spec.world_size, "cpu") and not args and not kwargs:
            return LentPool(pool(spec.world_size))
        return real(spec, *args, **kwargs)

    for module in (pool_module, *users):
        monkeypatch.setattr(module, "WorkerPool", pool_for)


# ------------------------------------------------------------------------ order of the modules

HEAVIEST_FIRST: tuple[str, ...] = (
    "test_gpu_acceptance.py",
    "test_torchrun.py",
    "test_sweep.py",
    "test_kernels.py",
    "test_verify_flash_rule.py",
    "test_mutation.py",
    "test_cp_attention.py",
    "test_sweep_safety.py",
    "test_calibrate.py",
    "test_report.py",
    "test_masks_attention.py",
    "test_impls.py",
    "test_fuzz_readers.py",
    "test_render_width.py",
    "test_inference.py",
    "test_recommend_scale.py",
    "test_plan_search.py",
    "test_report_browser.py",
)
"""The modules of longest time, longest first (seconds per module in CI's two split runs,
tests/ci_split.py, on 2 cores: 65 to 11 s). They start first: pytest-xdist hands whole modules
to its workers in this order (pyproject's `--dist loadscope --no-loadscope-reorder`), so the
last modules to finish are short ones and the workers end together (with test_sweep_safety's
26 s last, one worker ended 16 s after the other). The GPU acceptance dry run starts beside the
torchrun tests, not beside the flash-attn 2 rule's 8 ranks: its setup took 86 s there, 61 s
here (the whole main-torch run 331.7 s -> 297.9 s). A module not named here keeps its place
after them; the order changes nothing else."""


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixtures
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept
    free = [item for item in items if item.get_closest_marker("torch_free")]
    if free and ci_split.in_ci() and ci_split.on_the_main_torch():
        for item in free:  # CI's floor-torch run has them (tests/ci_split.py)
            item.add_marker(pytest.mark.skip(reason=ci_split.IN_THE_FLOOR_RUN))


def _untouched(item: pytest.Item) -> Iterator[None]:
    """A `torch_free` test fails when it, or a fixture it sets up, touched torch
    (`ci_split.torch_untouched`)."""
    if not item.get_closest_marker("torch_free"):
        return (yield)
    with ci_split.torch_untouched() as uses:
        result = yield
    if uses:
        shown = ", ".join(dict.fromkeys(uses))
        pytest.fail(f"marked torch_free, but it {shown[:300]}: unmark it (tests/ci_split.py)",
                    pytrace=False)
    return result


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_untouched)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_untouched)


# ------------------------------------------------------------------------ skip allow-list


def _cuda() -> bool:
    import torch  # noqa: PLC0415 - at the session's end, where torch is loaded anyway

    return torch.cuda.is_available()


def _cpu_flash_without_gqa() -> bool:
    from cpbench import compat  # noqa: PLC0415

    return not compat.cpu_flash_supports_gqa()


@dataclass(frozen=True)
class PlatformSkip:
    """A skip reason allowed where `holds()` says the platform lacks the thing."""

    pattern: str
    """Regular expression the skip's reason must match (from its start)."""
    holds: Callable[[], bool]
    """Whether the reason is true here (then the skip is allowed)."""
    why: str
    """Where this skip happens and why it is not a loss of coverage where allowed."""


PLATFORM_SKIPS: tuple[PlatformSkip, ...] = (
    PlatformSkip(
        r"torch \S+ lacks what the torch_cp adapter uses",
        lambda: ci_split.torch_release() < (2, 13),
        "torch_cp follows torch 2.13's private context-parallel modules; the floor torch "
        "(2.5.1) has none: its torch_cp cases are out there (test_impls names it)",
    ),
    PlatformSkip(
        r"this torch's CPU flash op has no GQA",
        _cpu_flash_without_gqa,
        "the native-GQA branch of the CPU op exists from torch 2.9 (test_compat)",
    ),
    PlatformSkip(
        r"chromium is not installed",
        lambda: os.environ.get("CPBENCH_CI") != "1",
        "the report's browser tests; CI installs Chromium, so there the skip is not allowed",
    ),
    PlatformSkip(
        re.escape(ci_split.ONCE_PER_CI),
        lambda: not ci_split.on_the_main_torch(),
        "the flash-attn 2 rule verify at worlds 4 and 8, the mutation check's fast subset and "
        "the GPU acceptance dry run (minutes each) test cpbench's logic; the floor-torch run "
        "keeps world 2 and every other test (tests/ci_split.py)",
    ),
    PlatformSkip(
        re.escape(ci_split.IN_THE_FLOOR_RUN),
        lambda: ci_split.in_ci() and ci_split.on_the_main_torch(),
        "CI's main-torch run leaves the tests that touch no torch to its floor-torch run "
        "(tests/ci_split.py); everywhere else they run",
    ),
    PlatformSkip(
        r"no /proc/stat on this platform",
        lambda: not Path("/proc/stat").exists(),
        "the other-load measurement reads Linux's /proc/stat",
    ),
    PlatformSkip(
        r"needs a CUDA GPU",
        lambda: not _cuda(),
        "tests/test_cuda_kernels.py runs the kernels' ops on a real GPU (the GPU acceptance "
        "device command runs it); the CPU suite checks their marshalling against fakes",
    ),
    PlatformSkip(
        r"(kernel not usable|no mask band) on this GPU: ",
        _cuda,
        "a kernel this GPU or install cannot run, or one without a mask band (the reason named)",
    ),
    PlatformSkip(
        r"a real flash-attn is installed",
        lambda: importlib.util.find_spec("flash_attn") is not None,
        "the flash-attn stand-in test cannot replace a real installation",
    ),
)

_SKIPS: list[tuple[str, str]] = []
"""(test id, reason) of every skip this session."""


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return re.sub(r"^Skipped: ", "", text)


def not_allowed(skips: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips whose reason is on no allow-list entry that holds here. An entry's `holds()`
    is asked only when a skip's reason matches it: most import torch (2 s in a process that
    has not, such as each process of test_skip_allowlist's inner sessions)."""
    patterns = [(re.compile(s.pattern), s.holds) for s in PLATFORM_SKIPS]
    matched = {i for i, (p, _) in enumerate(patterns) for _, why in skips if p.match(why)}
    allowed = [p for i, (p, holds) in enumerate(patterns) if i in matched and holds()]
    return [(test, why) for test, why in skips if not any(p.match(why) for p in allowed)]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append((report.nodeid, _reason(report)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not_allowed(_SKIPS) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    bad = not_allowed(_SKIPS)
    if not bad:
        return
    terminalreporter.section("skips not on the allow-list (tests/conftest.py): the session fails")
    for test, why in bad:
        terminalreporter.line(f"{test}: {why}")
