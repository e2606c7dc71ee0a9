"""The suite's skip rule (tests/conftest.py): a skip whose reason is not on the platform
allow-list, or is on it but does not hold here, fails the session; an allowed one does not.
Run as inner pytest sessions in subprocesses (the rule's state is the session's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = '''
import pytest


def test_runs() -> None:
    assert True


def test_browser() -> None:
    pytest.skip("chromium is not installed (Debian: apt-get install chromium); CI runs this")


@pytest.mark.xfail(reason="an expected failure is not a skip", strict=True)
def test_expected() -> None:
    raise AssertionError
'''

UNLISTED = '''
import pytest


@pytest.mark.parametrize("n", [1, 2])
def test_case(n: int) -> None:
    if n == 2:
        pytest.skip("a row sees no key")
'''


def _session(
    folder: Path, ci: bool, *files: str, workers: int = 0
) -> subprocess.CompletedProcess[str]:
    """An inner session on `files`; `workers` > 0: in that many pytest-xdist workers, as the
    suite runs (their reports reach the rule in the controlling process)."""
    env = {k: v for k, v in os.environ.items() if k != "CPBENCH_CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if ci:
        env["CPBENCH_CI"] = "1"
    # no:hypothesispytest: its plugin imports hypothesis at each session's end (1.7 s a process)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest", "-n", str(workers), "--rootdir", str(folder), *files],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_only_allowed_platform_skips_pass(tmp_path: Path) -> None:
    (tmp_path / "test_allowed.py").write_text(ALLOWED)
    (tmp_path / "test_unlisted.py").write_text(UNLISTED)
    here = _session(tmp_path, False, "test_allowed.py")
    assert here.returncode == 0, here.stdout
    assert "1 passed, 1 skipped, 1 xfailed" in here.stdout
    assert "not on the allow-list" not in here.stdout
    # under CI Chromium is installed: its skip is no longer allowed; an unlisted reason never is
    ci = _session(tmp_path, True, "test_allowed.py", "test_unlisted.py", workers=2)
    assert ci.returncode == 1, ci.stdout
    assert "2 passed, 2 skipped, 1 xfailed" in ci.stdout
    listed = ci.stdout.split("skips not on the allow-list", 1)[1]
    assert "test_allowed.py::test_browser: chromium is not installed" in listed
    assert "test_unlisted.py::test_case[2]: a row sees no key" in listed
    assert "test_case[1]" not in listed
