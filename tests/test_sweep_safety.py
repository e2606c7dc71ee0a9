"""A sweep's manners: the lock on its results file, SIGTERM as Ctrl-C, a quiet early Ctrl-C,
the count and estimate before it starts, and Python warnings as cpbench's own lines."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench.app.sweep import CONFIRM_ABOVE, estimate_sweep, run_sweep
from cpbench.cli.main import app
from cpbench.errors import CpbenchError
from cpbench.results.lock import ResultsLock, lock_path
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.store import read_records
from tests.test_sweep import _scenario

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
HOLD = "from cpbench.results.lock import ResultsLock; import sys, time; " \
    "ResultsLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)"  # fmt: skip


def _holder(out: Path) -> subprocess.Popen[str]:
    """A process that holds the lock of `out` until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _group(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes of process group `pgid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append((int(entry), cmdline))
    return found


def _wait_gone(pgid: int) -> None:
    for _ in range(100):  # the ranks and the forkserver go with the parent
        if not _group(pgid):
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"processes of the stopped sweep still running after 10 s: {_group(pgid)}")


# ------------------------------------------------------------------------------------ the lock


def test_a_second_sweep_on_a_held_file_exits_2_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    holder = _holder(out)
    try:
        started = time.monotonic()
        res = runner.invoke(app, ["sweep", str(_scenario(tmp_path)), "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert time.monotonic() - started < 60  # at once: nothing measured
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith("cpbench: error: ") and "is being written by another sweep" in line
        assert f"pid {holder.pid} on {socket.gethostname()}, started " in line, line
        assert not out.exists() or out.read_text() == ""
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_no_stale_lock_and_a_sweep_holds_it_while_it_writes(
    tmp_path: Path, lend_the_session_pool: None
) -> None:
    out = tmp_path / "r.jsonl"
    holder = _holder(out)
    with pytest.raises(CpbenchError, match=f"pid {holder.pid} "):
        ResultsLock(out).acquire()
    holder.send_signal(signal.SIGKILL)  # no cleanup: its lock file stays, its lock does not
    holder.wait()
    assert lock_path(out).exists()
    refused: list[str] = []

    def on_start(config: object) -> None:  # while the sweep runs, its file is held
        try:
            ResultsLock(out).acquire()
        except CpbenchError as exc:
            refused.append(str(exc))

    scenario = load_scenario(str(_scenario(tmp_path, kv_heads="[4]")))  # 2 configurations
    result = run_sweep(scenario, "cpu", 2, out, on_start=on_start)
    assert len(read_records(out)) == len(result.records) == 2
    assert len(refused) == 2 and all(f"pid {os.getpid()} on " in r for r in refused)
    assert not lock_path(out).exists()  # released (and removed) at the end
    with ResultsLock(out):  # and free again
        pass


# ------------------------------------------------------------------------------ the signals


def test_sigterm_during_a_sweep_is_handled_as_ctrl_c(
    tmp_path: Path, lend_the_session_pool: None
) -> None:
    """SIGTERM (a scheduler's, to the whole process group: the CLI, its forkserver and ranks)
    after two records: exit 143 (128 + SIGTERM), the "interrupted" line, every line a whole
    record, nothing left running and no `pymp-*` folder left in the temporary directory."""
    path = _scenario(tmp_path, kv_heads="[4, 2]", head_dim="[16, 32]")
    path.write_text(path.read_text().replace("iters = 2\n", "iters = 16\n"))  # see the Ctrl-C test
    out = tmp_path / "r.jsonl"
    # a short folder of its own: the forkserver's socket lives in it, and an AF_UNIX path has
    # at most 107 bytes (pytest's tmp_path under an xdist worker is longer)
    temp = Path(tempfile.mkdtemp(prefix="cpb-"))
    cmd = [sys.executable, "-m", "cpbench.cli", "sweep", str(path), "--out", str(out)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        start_new_session=True, env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < 2
    ):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, output[-2000:])
    assert "interrupted: every configuration finished so far is saved" in output
    assert "Traceback" not in output, output[-2000:]
    kept = read_records(out)
    assert 2 <= len(kept) < 8 and {r["status"] for r in kept} == {"ok"}
    _wait_gone(proc.pid)
    left = [p.name for p in temp.iterdir() if p.name.startswith("pymp-")]
    shutil.rmtree(temp, ignore_errors=True)
    assert not left
    assert not lock_path(out).exists()


def test_a_launchers_sigterm_keeps_the_in_flight_marker(tmp_path: Path) -> None:
    """Under torchrun a SIGTERM may mean that another rank died (the agent stops the rest), not
    a person's Ctrl-C: rank 0 keeps the in-flight marker of the configuration that ran, so
    --resume records it as failed instead of running it (and dying) again."""
    from cpbench.app.sweep import INFLIGHT_ERROR, _prepare_output  # noqa: PLC0415
    from cpbench.results.store import inflight_path  # noqa: PLC0415
    from tests.test_torchrun import DRIVER, TORCHRUN, _clean_env  # noqa: PLC0415
    from tests.test_torchrun import _scenario as launched_scenario  # noqa: PLC0415

    out = tmp_path / "r.jsonl"
    scenario = launched_scenario(tmp_path, "[40]", timeout=600)  # 40 hangs on both ranks
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(DRIVER), str(scenario),
           str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=_clean_env(), start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not inflight_path(out).exists():
        time.sleep(0.1)
    assert inflight_path(out).exists()
    proc.send_signal(signal.SIGTERM)  # the agent passes it on to its workers
    output, _ = proc.communicate(timeout=120)
    _wait_gone(proc.pid)
    assert inflight_path(out).exists(), output[-3000:]
    assert read_records(out) == []
    _prepare_output(out, resume=True, launched=True)
    (record,) = read_records(out)
    assert record["status"] == "failed" and record["config"]["head_dim"] == 40
    assert record["error"].startswith(INFLIGHT_ERROR.split("{")[0])


def test_ctrl_c_while_the_forkserver_imports_prints_no_traceback(tmp_path: Path) -> None:
    """Ctrl-C (to the foreground process group) as soon as the forkserver of CPU ranks exists,
    while it still imports torch: one line from the CLI, exit 130, no traceback from anyone."""
    cmd = [sys.executable, "-m", "cpbench.cli", "sweep", str(_scenario(tmp_path)),
           "--out", str(tmp_path / "r.jsonl"), "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        "forkserver" in cmdline for pid, cmdline in _group(proc.pid) if pid != proc.pid
    ):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert proc.returncode == 130, (proc.returncode, output[-2000:])
    _wait_gone(proc.pid)


def test_a_ctrl_c_while_the_forkserver_starts_is_kept_for_the_parent() -> None:
    """Inside the window where the forkserver is started, a child inherits SIGINT blocked (so a
    Ctrl-C cannot interrupt its imports), and a Ctrl-C to the parent is not lost (CI once saw a
    sweep run on to exit 0): it is held until the window ends, then raises KeyboardInterrupt."""
    from cpbench.bench.pool import _interrupts_held  # noqa: PLC0415

    probe = "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"
    reached_the_end_of_the_window = False
    # A pytest-xdist worker ignores SIGINT: this test gives itself Python's own handler.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _interrupts_held():
                child = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                       text=True)  # fmt: skip
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                time.sleep(0.2)  # a delivered signal would raise here
                reached_the_end_of_the_window = True
    finally:
        signal.signal(signal.SIGINT, outer)
    assert reached_the_end_of_the_window
    assert child.stdout.strip() == "True", child.stdout + child.stderr
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.torch_free
def test_a_ctrl_c_another_thread_takes_in_that_window_is_held_too() -> None:
    """The parent has other threads (a progress bar's, a queue's feeder): the kernel gives a
    Ctrl-C to one that does not block SIGINT; it is held all the same, then raised."""
    from cpbench.bench.pool import _interrupts_held  # noqa: PLC0415

    reached_the_end_of_the_window = False
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # started outside the window: SIGINT unblocked
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with _interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)  # to the process: the other thread takes it
                time.sleep(0.2)
                reached_the_end_of_the_window = True
    finally:
        signal.signal(signal.SIGINT, outer)
        stop.set()
        other.join()
    assert reached_the_end_of_the_window


FORKSERVER_MASK = """
import os, signal, sys
from cpbench.bench.pool import start_forkserver_early
start_forkserver_early("cpu")
for pid in os.listdir("/proc"):
    try:
        status = open(f"/proc/{pid}/status").read()
        cmdline = open(f"/proc/{pid}/cmdline").read()
    except OSError:
        continue
    if f"PPid:\\t{os.getpid()}\\n" in status and "forkserver" in cmdline:
        fields = dict(line.split(":\\t", 1) for line in status.splitlines() if ":\\t" in line)
        bit = 1 << (signal.SIGINT - 1)
        print(bool(int(fields["SigBlk"], 16) & bit), bool(int(fields["SigIgn"], 16) & bit))
"""


def test_the_started_forkserver_cannot_take_a_ctrl_c() -> None:
    """The forkserver, just started (still importing torch), has SIGINT blocked or ignored:
    multiprocessing's resource tracker unblocks SIGINT when it starts, which once let a Ctrl-C
    interrupt the server's imports with a traceback."""
    done = subprocess.run([sys.executable, "-c", FORKSERVER_MASK], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    blocked, ignored = (word == "True" for word in done.stdout.split())
    assert blocked or ignored, done.stdout


# ------------------------------------------------------------------ count and estimate first


@pytest.mark.torch_free
def test_a_sweep_tells_its_count_and_estimate_before_it_starts(tmp_path: Path) -> None:
    path = _scenario(tmp_path, kv_heads="[3, 1]")
    path.write_text(path.read_text().replace("heads = [4]", "heads = [3]"))  # no Ulysses 2
    scenario = load_scenario(str(path))
    points = scenario.distinct("cpu", 2)
    off = estimate_sweep(scenario, points)  # the tiny scenario times a fixed count
    assert (off.measured, off.skipped, off.timed_seconds) == (2, 2, None)
    assert off.line().startswith("2 configurations to measure (2 more recorded as skipped)")
    assert "precision off" in off.line() and "60 s timeout, 2 min at most" in off.line()
    timed = estimate_sweep(scenario, points, precision=0.05, timeout=10)
    # budget 2 s (the default): the full step 2 s, the compute and comm variants 1 s each
    assert timed.timed_seconds == 2 * 2 * 2.0
    assert "about 8 s at the scenario's time budget" in timed.line()
    assert "10 s timeout, 20 s at most" in timed.line()


def test_a_large_sweep_asks_in_a_terminal_and_not_outside_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _scenario(tmp_path)
    text = path.read_text().replace("seq_len = [64]", f"seq_len = {list(range(64, 64 * 600, 64))}")
    path.write_text(text.replace('mesh = "all"', 'mesh = ["1x2", "2x1"]'))
    scenario = load_scenario(str(path))
    n = estimate_sweep(scenario, scenario.distinct("cpu", 2)).measured
    assert n > CONFIRM_ABOVE
    out = tmp_path / "r.jsonl"
    import typer  # noqa: PLC0415

    from cpbench.app import sweep as sweep_service  # noqa: PLC0415

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep started")

    monkeypatch.setattr(sweep_service, "run_sweep", never)
    asked: list[str] = []
    def confirm(text: str, default: bool) -> bool:
        asked.append(text)
        return False

    monkeypatch.setattr(typer, "confirm", confirm)
    res = runner.invoke(app, ["sweep", str(path), "--out", str(out)])  # not a terminal
    assert isinstance(res.exception, AssertionError) and not asked
    monkeypatch.setattr("cpbench.cli.sweep.in_terminal", lambda: True)
    res = runner.invoke(app, ["sweep", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert asked and f"{n:,} configurations to measure" in res.stdout
    assert f"not started ({n:,} configurations): pass --yes" in res.stderr
    res = runner.invoke(app, ["sweep", str(path), "--out", str(out), "--yes"])
    assert isinstance(res.exception, AssertionError) and len(asked) == 1


# -------------------------------------------------------------------------------- warnings


@pytest.mark.torch_free
def test_python_warnings_print_as_cpbench_lines(tmp_path: Path) -> None:
    """A torn last line (cpbench's UserWarning) and a library's RuntimeWarning reach the user
    as `cpbench: warning: ...` lines: no module path, no source line."""
    good = tmp_path / "a.jsonl"
    good.write_text((ROOT / "tests" / "fixtures" / "sweep.jsonl").read_text() + '{"torn')
    res = runner.invoke(app, ["compare", str(good), str(good)])
    assert res.exit_code in (0, 1), res.output
    lines = [line for line in res.stderr.splitlines() if "torn" in line]
    assert lines and all(line.startswith("cpbench: warning: ") for line in lines), res.stderr
    assert ".py:" not in res.stderr and "warnings.warn" not in res.stderr


@pytest.mark.torch_free
def test_a_library_warning_names_its_category(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings  # noqa: PLC0415

    def parse_precision(text: str | None) -> float:
        warnings.warn("divide by zero", RuntimeWarning, stacklevel=1)  # as numpy words it
        raise CpbenchError("stop here")

    monkeypatch.setattr("cpbench.cli.sweep.parse_precision", parse_precision)
    res = runner.invoke(app, ["sweep", str(_scenario(tmp_path))])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [
        "cpbench: warning: RuntimeWarning: divide by zero",
        "cpbench: error: stop here",
    ]
