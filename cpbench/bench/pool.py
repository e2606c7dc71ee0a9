"""A persistent pool of ranks: started once per world size, then runs many tasks.

Why, and how it forks and recovers: docs/internals.md, "The pool and launched worlds"."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import multiprocessing as mp  # the standard library's: importing this module imports no torch
import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

from cpbench.config.constraints import check_cpu_world
from cpbench.errors import RunFailure

ERROR_GRACE_SECONDS = 2.0
"""After one rank reports an error, how long the others get to report theirs before the pool
is presumed stuck (they are usually blocked in a collective the failed rank never joins)."""


class TaskError(RunFailure):
    """A task raised on at least one rank, or a rank died."""

    def __init__(self, message: str, errors: dict[int, str], restarted: bool) -> None:
        super().__init__(message)
        self.errors = errors
        self.restarted = restarted


class TaskTimeout(RunFailure):
    """A task ran past its timeout; the pool's ranks were killed."""


@dataclass(frozen=True)
class WorldSpec:
    world_size: int
    device: str  # "cpu" or "cuda"
    threads_per_rank: int = 1

    def __post_init__(self) -> None:
        if self.device != "cuda":
            check_cpu_world(self.world_size)

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


def accepts_device_id(init: Callable[..., Any]) -> bool:
    """Whether `init_process_group` takes `device_id` (torch 2.3 and later; checked on the
    function itself, so that a backported or trimmed build answers for itself)."""
    try:
        return "device_id" in inspect.signature(init).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


FORKSERVER_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.fx.experimental.symbolic_shapes",
    "cpbench.bench.measure",
    "cpbench.bench.environment",
)
"""What the forkserver of CPU ranks imports once (seconds: torch, sympy),
so that each rank it forks starts in a fraction of a second instead of importing them again.
The same modules a spawned rank imports before it says "ready"."""


def _context(device: str) -> Any:
    """How ranks start: CUDA ranks are spawned (a fresh interpreter each: nothing of the parent's
    CUDA state can leak in); CPU ranks are forked from one forkserver per parent process, which
    has imported `FORKSERVER_PRELOAD` and nothing else (no thread pool, no process group), so a
    fork is as clean as a spawn and costs none of the imports. (Tensors in a task's arguments
    or results travel as torch.multiprocessing sends them: importing torch registers its
    reductions with the standard library's pickler.)"""
    if device == "cuda" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def start_forkserver_early(device: str) -> None:
    """Start the forkserver of CPU ranks now, so that its imports (seconds) run beside this
    process's own instead of after them: a command calls it first thing. Nothing happens where
    ranks will not come from it: a CUDA device, "auto" on a host with an NVIDIA driver, a
    process that is itself a rank of a launched world (torchrun, srun)."""
    from multiprocessing import forkserver  # noqa: PLC0415

    from cpbench.bench.launch import launched_rank  # noqa: PLC0415

    if device == "cuda" or (device == "auto" and os.path.exists("/dev/nvidiactl")):
        return
    if launched_rank() is None and _context("cpu").get_start_method() == "forkserver":
        with _interrupts_held():
            forkserver.ensure_running()


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """A Ctrl-C while a rank or the forkserver starts waits until it has started, then arrives.
    SIGINT is blocked in this thread, and the server inherits the mask: a Ctrl-C while it
    imports `FORKSERVER_PRELOAD` (the first seconds of a command) stays pending there until
    it ignores SIGINT to serve, not a traceback from its imports. Here it is held, never lost
    (ignoring it once let a sweep run on to exit 0): pending in this thread, or, when another
    thread took it, noted by a handler; either way it is raised again when the window ends.
    Killing a half-started rank would leave one whose pid is unknown."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # The forkserver starts multiprocessing's resource tracker, which blocks SIGINT around its
    # own start and then *unblocks* it: started first, it cannot open this window early.
    resource_tracker.ensure_running()
    held: list[int] = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending here arrives now
        if held:
            signal.raise_signal(signal.SIGINT)  # as if it came now: to `previous`


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_main(
    rank: int, spec: WorldSpec, port: int, tasks: Any, results: Any, env: dict[str, str]
) -> None:
    import datetime  # noqa: PLC0415 - runs in the child

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    # A forkserver's child inherits the server's environment, frozen when the server started:
    # the rank takes the parent's environment as it is now (as a spawned one does).
    os.environ.clear()
    os.environ.update(env)
    # The process that started this rank (not the forkserver that forked it): its end of a
    # pipe closes when it dies, however it dies.
    parent = mp.parent_process()
    # Ctrl-C is the parent's to handle: it kills the ranks and keeps what was measured.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held while the server started
    torch.set_num_threads(spec.threads_per_rank)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads_per_rank))
    extra: dict[str, Any] = {}
    if spec.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        if accepts_device_id(dist.init_process_group):
            extra["device_id"] = device  # binds the communicator to this GPU up front
    dist.init_process_group(
        spec.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=spec.world_size,
        timeout=datetime.timedelta(seconds=600),
        **extra,
    )
    # The measurement's modules (seconds on a loaded machine) are imported before "ready", so
    # a configuration's --timeout times the configuration, not a fresh rank's imports; so is
    # the module torch's first `backward(grad)` imports (autograd's `_make_grads` ->
    # symbolic_shapes -> sympy: 1-5 s).
    for module in FORKSERVER_PRELOAD:
        importlib.import_module(module)
    from cpbench.bench.environment import rank_waiting  # noqa: PLC0415
    from cpbench.bench.memory import freeze_startup_objects  # noqa: PLC0415

    freeze_startup_objects()
    results.put(("ready", rank, "ok", None))
    rank_waiting()
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():  # do not linger as an orphan
                break
            continue
        if task is None:
            break
        task_id, fn, args = task
        try:
            results.put((task_id, rank, "ok", fn(*args)))
        except BaseException as exc:  # report everything; the parent decides what to do
            message = f"{type(exc).__name__}: {exc}"
            results.put((task_id, rank, "error", (message, traceback.format_exc())))
        rank_waiting()
    dist.destroy_process_group()


class WorkerPool:
    """`with WorkerPool(WorldSpec(4, "cpu")) as pool: per_rank = pool.run(fn, arg, timeout=60)`"""

    def __init__(self, spec: WorldSpec, start_timeout: float = 120.0) -> None:
        self.spec = spec
        self.start_timeout = start_timeout
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._next_id = 0
        self.spawns = 0

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> None:
        if self.alive:
            return
        self.close()
        ctx = _context(self.spec.device)
        port = _free_port()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.spec.world_size)]
        try:
            for rank in range(self.spec.world_size):
                proc = ctx.Process(
                    target=_worker_main,
                    args=(rank, self.spec, port, self._tasks[rank], self._results,
                          dict(os.environ)),  # fmt: skip
                    daemon=True,
                )
                self._procs.append(proc)
                with _interrupts_held():  # the first start may start the forkserver
                    proc.start()
            self.spawns += 1
            self._collect("ready", self.start_timeout)
        except BaseException:
            # A Ctrl-C while ranks start: kill them before this process drops the queues, or a
            # rank still unpickling its arguments prints a traceback (a semaphore gone).
            self.close(force=True)
            raise

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
        """Run `fn(*args)` on every rank; return the results in rank order."""
        self.start()
        task_id = self._next_id
        self._next_id += 1
        for q in self._tasks:
            q.put((task_id, fn, args))
        return self._collect(task_id, timeout)

    def _collect(self, task_id: Any, timeout: float) -> list[Any]:
        n = self.spec.world_size
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        grace_deadline: float | None = None
        while len(results) + len(errors) < n:
            now = time.monotonic()
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            if now >= limit:
                if errors:  # the other ranks are stuck waiting for the failed one
                    self.close(force=True)
                    raise TaskError(self._error_message(errors), errors, restarted=True)
                self.close(force=True)
                raise TaskTimeout(
                    f"task did not finish within {timeout:g} s on ranks "
                    f"{sorted(set(range(n)) - set(results))}; the pool's ranks were killed"
                )
            try:
                tid, rank, status, payload = self._results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    codes = {r: self._procs[r].exitcode for r in dead}
                    for r in dead:
                        errors.setdefault(r, f"rank {r} died (exit code {codes[r]})")
                    self.close(force=True)
                    raise TaskError(self._error_message(errors), errors, restarted=True) from None
                continue
            if tid != task_id:
                continue  # a late answer of an earlier, abandoned task
            if status == "ok":
                results[rank] = payload
            else:
                errors[rank] = payload[0]
                grace_deadline = time.monotonic() + min(ERROR_GRACE_SECONDS, timeout)
        if errors:
            raise TaskError(self._error_message(errors), errors, restarted=False)
        return [results[r] for r in range(n)]

    @staticmethod
    def _error_message(errors: dict[int, str]) -> str:
        first = min(errors)
        return f"rank {first}: {errors[first]}" + (
            f" (and {len(errors) - 1} more ranks)" if len(errors) > 1 else ""
        )

    def close(self, force: bool = False) -> None:
        """Stop the ranks: politely, or at once (`force`) when they may be stuck."""
        for q in self._tasks:
            with contextlib.suppress(OSError, ValueError):
                q.put(None)
        for proc in self._procs:
            if proc.pid is None:  # never started (interrupted before it)
                continue
            proc.join(timeout=0.0 if force else 5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        self._procs = []
        self._tasks = []

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
