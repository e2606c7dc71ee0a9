"""The lock a sweep holds on its results file while it appends to it (`<out>.lock`): an OS
advisory lock, so it dies with its process and a killed sweep never leaves a stale one."""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
from pathlib import Path
from types import TracebackType

from cpbench.errors import CpbenchError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, sweeps are not locked
    fcntl = None  # type: ignore[assignment]


def lock_path(out: Path) -> Path:
    """The lock file of a sweep writing `out`: `<out>.lock`."""
    out = Path(out)
    return out.with_name(out.name + ".lock")


def _holder(path: Path) -> str:
    """Who holds the lock at `path`, as its holder wrote it (pid, host, start time)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):  # written just now, not yet readable
        return "a process that is starting"


class ResultsLock:
    """`with ResultsLock(out): ...` appends to `out` alone: a second holder is refused at once
    with a `CpbenchError` naming the first (its pid, host and start time)."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = lock_path(self.out)
        self._fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None or self._fd is not None:
            return
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise CpbenchError(
                    f"cannot write results to {self.out}: {exc.strerror or exc}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise CpbenchError(
                    f"{self.out} is being written by another sweep ({_holder(self.path)}; lock "
                    f"{self.path}): wait for it to end, or pass --out for a new file"
                ) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
                    return  # a file system without advisory locks: the sweep goes unlocked
                raise
            # The holder before us may have removed the file between our open and our lock:
            # then the lock is on a file nobody else will open; take the one at the path.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode("utf-8"))
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # still holding it: nobody takes this file now
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> ResultsLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
