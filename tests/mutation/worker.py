"""The process that runs the mutants' tests (`runner.run_mutants` starts it in the tree copy).

It imports the heavy libraries cpbench uses (torch, numpy, pandas, scipy, pydantic, typer,
rich) once, never cpbench itself, then for the baseline and each mutant forks a child that
runs pytest on the copy: every child imports cpbench afresh from the files as they are at that
moment, and none pays torch's import again (seconds per mutant on a busy machine). The child
runs in its own process group, so a timeout kills the ranks its tests spawned too.

Input (argv[1]): a JSON file {"runs": [{"name", "file", "old", "new", "tests"}...], "timeout"};
a run without "file" is the baseline. Output: one JSON line per run on stdout:
{"name", "code" (pytest's exit code, null on a timeout), "output" (the tail), "seconds"}; one
progress line per run on stderr.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRELOADED = (
    "torch",
    "torch.distributed",
    "torch.distributed._functional_collectives",
    "torch.testing",
    "torch.fx.experimental.symbolic_shapes",  # (and sympy) the first backward imports it: 0.7 s
    "numpy",
    "pandas",  # results.frame's: 0.3 s of every child that imports the sweep
    "scipy.stats",
    "scipy.optimize",
    "pydantic",
    "typer",
    "typer.testing",
    "rich",
    "pytest",
    # pytest's plugins: imported here, a child neither imports them nor rewrites their asserts
    # again. hypothesis (its plugin imports the library at every session's end) was 1.7 s of a
    # child's 2.2 s on a unit-level mutant.
    "xdist.plugin",
    "xdist.looponfail",
    "_hypothesis_pytestplugin",
    "hypothesis",
    "hypothesis.strategies",
)
"""Imported before any fork; none of them is mutated (cpbench is never imported here)."""


def _preload() -> None:
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # The preloaded objects are never garbage: out of the collector's sight, so that pytest's
    # two full collections at each child's end (its unraisable-exception hook) do not walk
    # torch's heap (0.3 s a child).
    gc.freeze()


def _child(tests: list[str], log: int) -> None:
    """In the forked child: pytest on `tests`, output into `log`; never returns."""
    os.setpgid(0, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 3
    try:
        import pytest  # noqa: PLC0415

        # -n 0: in this child, not in xdist workers (pyproject's addopts)
        # the preloaded plugins cannot be assert-rewritten, and need not be: no warning for it
        code = int(pytest.main(["-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-rf",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning", *tests]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(tests: list[str], timeout_s: float) -> tuple[int | None, str, float]:
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(tests, log.fileno())
        code: int | None = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - start > timeout_s:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        log.seek(0)
        output = log.read().decode(errors="replace")
    return code, output[-6000:], seconds


def main() -> None:
    spec: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    _preload()
    for run in spec["runs"]:
        path = Path(run["file"]) if run.get("file") else None
        original = path.read_text() if path else ""
        if path:
            path.write_text(original.replace(run["old"], run["new"]))
        try:
            code, output, seconds = _run(run["tests"], spec["timeout"])
        finally:
            if path:
                path.write_text(original)
        print(json.dumps({"name": run["name"], "code": code, "output": output, "seconds": seconds}))
        sys.stdout.flush()
        # progress on stderr (the runner passes it through): a full run takes many minutes
        print(f"{run['name']}: pytest exit {code} in {seconds:.1f} s", file=sys.stderr, flush=True)
        if run.get("must_pass") and code != 0:
            break  # the baseline failed: no mutant's verdict would mean anything


if __name__ == "__main__":
    main()
