"""Worlds: where a task runs on every rank, a local `WorkerPool` or the torchrun/srun processes.

How a launched world fails and recovers: docs/internals.md, "The pool and launched worlds"."""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from cpbench.bench.launch import launched_rank
from cpbench.bench.pool import ERROR_GRACE_SECONDS, TaskError, TaskTimeout, accepts_device_id
from cpbench.errors import EXIT_WRONG_RESULT, CpbenchError, RunFailure

HARD_STOP_SECONDS = 5.0
"""After a rank's task is interrupted, how long it gets to come back before the process is given
up (its record written by rank 0, then every rank exits)."""
POLL_SECONDS = 0.1
"""How often the watchdog looks at the clock and at the other ranks' outcomes."""
PG_TIMEOUT_MARGIN = 60.0
"""The process group's own timeout is the task timeout plus the hard stop plus this margin, so
that cpbench's watchdog acts (and writes the record) before NCCL's watchdog kills the process."""
ABANDON_WAIT_SECONDS = 30.0
"""How long a rank that gives up waits for rank 0 to write the record before it exits."""
STORE_PREFIX = "cpbench"
INTERRUPT_SIGNAL = getattr(signal, "SIGALRM", None)

Outcome = Literal["ok", "error", "timeout", "stopped"]


class World(Protocol):
    """Where a task runs on every rank: a local pool or the launched world itself."""

    def start(self) -> None:
        """Make every rank ready to run a task (spawn a pool, build the process group), so
        that what is measured around a task does not include it."""

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float) -> list[Any]: ...

    def close(self, force: bool = False) -> None: ...


# ------------------------------------------------------------------------ the launched rank


def launched_by_torchrun() -> bool:
    """True when this process is one rank of an externally launched world (torchrun, srun)."""
    return launched_rank() is not None


def cuda_index(local_rank: int | None, device_count: int) -> int:
    """The GPU this rank uses: its local rank; 0 when the launcher made one GPU visible per
    task (srun --gpus-per-task 1), whatever the local rank."""
    if device_count < 1:
        raise CpbenchError("device cuda: no GPU is visible to this rank")
    if device_count == 1:
        return 0
    if local_rank is None:
        raise CpbenchError(
            f"{device_count} GPUs are visible but the launcher set neither LOCAL_RANK nor "
            "SLURM_LOCALID: every rank would use GPU 0 (set one, or one GPU per task)"
        )
    if not 0 <= local_rank < device_count:
        raise CpbenchError(
            f"local rank {local_rank} has no GPU: {device_count} are visible on this node "
            "(start at most one rank per GPU)"
        )
    return local_rank


# ------------------------------------------------------------------------------ the watchdog


class _Interrupted(BaseException):
    """Raised in the main thread by the watchdog's signal: the task must stop (a BaseException,
    so that the task's own `except Exception` blocks do not swallow it)."""


@dataclass
class _Reply:
    outcome: Outcome
    value: Any
    order: int = 0
    """When a failure was reported, 1 for the first of this task (the cause), 0 for ok."""
    abandoned: bool = False
    """Written by a rank that gave the task up (its process is exiting): the others give up
    too, at once, instead of waiting out their deadline or a rebuild that rank cannot join."""


class _Watch:
    """One task on one rank: a thread that interrupts the main thread at the deadline or soon
    after another rank failed, and gives the process up when the task does not come back."""

    def __init__(
        self,
        store: Any,
        key: str,
        rank: int,
        timeout: float,
        give_up: Callable[[str], None],
    ) -> None:
        self.store, self.key, self.rank = store, key, rank
        self.timeout = timeout
        self.give_up = give_up
        self.deadline = time.monotonic() + timeout
        self.running = True
        self.reason: Outcome = "timeout"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cpbench-watchdog", daemon=True)
        self._main = threading.main_thread().ident
        self._can_signal = (
            INTERRUPT_SIGNAL is not None and threading.current_thread() is threading.main_thread()
        )
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.running:
            raise _Interrupted(self.reason)

    def __enter__(self) -> _Watch:
        if self._can_signal:
            self._previous = signal.signal(INTERRUPT_SIGNAL, self._handler)  # type: ignore[arg-type]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self._done.set()
        self._thread.join()
        if self._can_signal and self._previous is not None:  # None: set outside Python
            signal.signal(INTERRUPT_SIGNAL, self._previous)  # type: ignore[arg-type]

    def _failures(self) -> int:
        try:
            return int(self.store.add(f"{self.key}/failures", 0))
        except Exception:  # noqa: BLE001 - the store is gone: the deadline still holds
            return 0

    def _watch(self) -> None:
        stop_at = self.deadline
        interrupted = False
        while not self._done.wait(POLL_SECONDS):
            now = time.monotonic()
            if not interrupted and stop_at > now + ERROR_GRACE_SECONDS and self._failures():
                # Another rank failed: this one is probably waiting for it in a collective.
                self.reason = "stopped"
                stop_at = now + ERROR_GRACE_SECONDS
            if not interrupted and now >= stop_at:
                interrupted = True
                if self.running and self._can_signal and self._main is not None:
                    signal.pthread_kill(self._main, INTERRUPT_SIGNAL)  # type: ignore[arg-type]
            if interrupted and self.running and now >= stop_at + HARD_STOP_SECONDS:
                why = (
                    f"ran past its timeout ({self.timeout:g} s)"
                    if self.reason == "timeout"
                    else "was stopped because another rank failed"
                )
                self.give_up(
                    f"rank {self.rank}: the task {why} but did not come back within "
                    f"{HARD_STOP_SECONDS:g} s (stuck in a collective or in native code)"
                )
                return


# ----------------------------------------------------------------------- the launched world


class InProcessWorld:
    """The world torchrun or srun launched: this process is one of its ranks and runs every
    task itself; the results of all ranks are given to every rank.

    A task that raises on a rank, or runs past its timeout, ends as `TaskError`/`TaskTimeout`
    on every rank (as the local pool reports it), and the process group is rebuilt for the next
    task. `on_abandon` (set by the caller) is called on rank 0 when a task cannot be stopped,
    with the failure to record, just before the process exits."""

    def __init__(self, device: str, timeout: float) -> None:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        launch = launched_rank()
        if launch is None and not dist.is_initialized():
            raise CpbenchError(
                "not a rank of a launched world: start it with torchrun, or srun with "
                "MASTER_ADDR and MASTER_PORT set"
            )
        self.device = device
        self.backend = "nccl" if device == "cuda" else "gloo"
        self.pg_timeout = timeout + HARD_STOP_SECONDS + PG_TIMEOUT_MARGIN
        self.on_abandon: Callable[[RunFailure], None] | None = None
        self.spawns = 0
        self._runs = 0
        self._key, self._timeout = "", timeout
        self._owned = not dist.is_initialized()
        self._cuda_index: int | None = None
        if self._owned:
            assert launch is not None
            self.rank, self.world_size = launch.rank, launch.world_size
            if device == "cuda":
                self._cuda_index = cuda_index(launch.local_rank, torch.cuda.device_count())
                torch.cuda.set_device(self._cuda_index)
            if launch.launcher == "slurm" and "MASTER_PORT" not in os.environ:
                raise CpbenchError(
                    "srun launch: MASTER_PORT is not set (export it, with MASTER_ADDR, to the "
                    "first node's address and a free port)"
                )
            for name, value in (
                ("RANK", launch.rank),
                ("WORLD_SIZE", launch.world_size),
                ("LOCAL_RANK", launch.local_rank),
            ):  # libraries (TE, yunchang) read torchrun's names
                if value is not None:
                    os.environ.setdefault(name, str(value))
            self._store, _, _ = next(
                dist.rendezvous(
                    "env://",
                    rank=self.rank,
                    world_size=self.world_size,
                    timeout=datetime.timedelta(seconds=self.pg_timeout),
                )
            )
        else:  # the caller built the process group: use it, never rebuild or destroy it
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self._store = dist.distributed_c10d._get_default_store()
        self._prefix = self._generation()
        if self._owned:
            self._start()
        if device == "cpu":
            torch.set_num_threads(1)
        from cpbench.bench.memory import freeze_startup_objects  # noqa: PLC0415 - torch

        freeze_startup_objects()  # as a pool's rank does before it says "ready"

    def _generation(self) -> str:
        """This world's own key prefix in the store. The store outlives it: torchrun keeps its
        agent's store across restarts (`--max-restarts`) and a process may build several worlds
        in turn, so every world takes the next generation number of this launch attempt (every
        rank builds its worlds in the same order)."""
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        joined = int(self._store.add(f"{STORE_PREFIX}/attempt{attempt}/joined", 1))
        return f"{STORE_PREFIX}/attempt{attempt}/world{(joined - 1) // self.world_size}"

    def _start(self) -> None:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        extra: dict[str, Any] = {}
        if self._cuda_index is not None and accepts_device_id(dist.init_process_group):
            extra["device_id"] = torch.device("cuda", self._cuda_index)
        dist.init_process_group(
            self.backend,
            store=dist.PrefixStore(f"{self._prefix}/pg{self.spawns}", self._store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.pg_timeout),
            **extra,
        )
        self.spawns += 1

    def _destroy(self) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        if self._owned and dist.is_initialized():
            dist.destroy_process_group()
            # Meshes hold the destroyed groups: the next task must build its own.
            from cpbench.attention.mesh import clear_mesh_cache  # noqa: PLC0415

            clear_mesh_cache()

    def start(self) -> None:
        """A fresh process group after close() (none to build otherwise)."""
        import torch.distributed as dist  # noqa: PLC0415

        if self._owned and not dist.is_initialized():
            self._start()

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float) -> list[Any]:
        """Run `fn(*args)` on this rank, as every rank does; return all ranks' results in rank
        order, or raise `TaskError`/`TaskTimeout` on every rank."""
        self.start()
        seq, self._runs = self._runs, self._runs + 1
        key = f"{self._prefix}/run{seq}"
        self._forget(seq - 2)  # every rank has read those: it finished the run after them
        watch = _Watch(self._store, key, self.rank, timeout, self._give_up_from_watchdog)
        self._key, self._timeout = key, timeout
        with watch:
            try:
                try:
                    reply = _Reply("ok", fn(*args))
                finally:
                    watch.running = False
            except _Interrupted:
                watch.running = False  # the interrupt may have landed before the finally ran
                what = "timed out" if watch.reason == "timeout" else "was stopped"
                reply = _Reply(watch.reason, f"rank {self.rank} {what}")
            except Exception as exc:  # noqa: BLE001 - reported to every rank below
                watch.running = False
                reply = _Reply("error", f"{type(exc).__name__}: {exc}")
            if reply.outcome != "ok":
                reply.order = int(self._store.add(f"{key}/failures", 1))
            try:
                payload = pickle.dumps(reply)
            except Exception as exc:  # noqa: BLE001 - an unpicklable result must not hang peers
                reply = _Reply("error", f"rank {self.rank}: result not picklable: {exc}")
                reply.order = int(self._store.add(f"{key}/failures", 1))
                payload = pickle.dumps(reply)
            self._store.set(f"{key}/rank{self.rank}", payload)
            if reply.outcome != "ok" and self.backend == "gloo":
                # gloo peers waiting on this rank raise once its sockets close. (NCCL peers
                # wait on the GPU, which this does not reach: they are stopped by their own
                # watchdog, and destroying a communicator with work in flight can block.)
                self._destroy()
            replies = self._collect(key, watch.deadline + HARD_STOP_SECONDS + ERROR_GRACE_SECONDS)
        gone = [r for r, x in enumerate(replies) if x.abandoned]
        if gone:
            self._give_up(f"rank {self.rank}: rank {gone[0]} gave the task up", [])
        failed = {r: x for r, x in enumerate(replies) if x.outcome != "ok"}
        if not failed:
            return [x.value for x in replies]
        with self._guard(self.pg_timeout, "rebuilding the process group after a failure"):
            self._destroy()
            if self._owned:
                self._start()
        raise _failure(failed, timeout)

    @contextlib.contextmanager
    def _guard(self, seconds: float, what: str) -> Iterator[None]:
        """Give the process up when the block does not end within `seconds`."""
        timer = threading.Timer(
            seconds, self._give_up, (f"rank {self.rank}: {what} took over {seconds:g} s", [])
        )
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _collect(self, key: str, until: float) -> list[_Reply]:
        keys = [f"{key}/rank{r}" for r in range(self.world_size)]
        try:
            self._store.wait(keys, datetime.timedelta(seconds=max(until - time.monotonic(), 1.0)))
        except RuntimeError:  # the store's wait timed out (its error type differs by version)
            missing = [r for r, k in enumerate(keys) if not self._store.check([k])]
            self._give_up(
                f"ranks {missing} did not report within {self._timeout:g} s (+ "
                f"{HARD_STOP_SECONDS:g} s to stop): hung or dead",
                missing,
            )
        return [pickle.loads(self._store.get(k)) for k in keys]

    def _forget(self, seq: int) -> None:
        if seq < 0:
            return
        for name in (f"rank{self.rank}", "failures"):
            with contextlib.suppress(Exception):
                self._store.delete_key(f"{self._prefix}/run{seq}/{name}")

    def _give_up_from_watchdog(self, message: str) -> None:
        self._give_up(message, [self.rank])

    def _give_up(self, message: str, stuck: list[int]) -> None:
        """The task cannot be stopped: rank 0 records what is known, every rank exits."""
        key = self._key
        known: dict[int, _Reply] = {}
        for r in range(self.world_size):
            with contextlib.suppress(Exception):
                if self._store.check([f"{key}/rank{r}"]):
                    known[r] = pickle.loads(self._store.get(f"{key}/rank{r}"))
        for r in stuck:
            known.setdefault(r, _Reply("timeout", f"rank {r}: {message}", order=10**6))
        if self.rank in stuck:
            # The others wait for this rank's reply in the store, where no signal reaches them
            # (nor the launcher's SIGTERM): this one tells them to exit now.
            with contextlib.suppress(Exception):
                gone = replace(known[self.rank], abandoned=True)
                self._store.set(f"{key}/rank{self.rank}", pickle.dumps(gone))
        failed = {r: x for r, x in known.items() if x.outcome != "ok"}
        failure = _failure(failed, self._timeout) if failed else TaskTimeout(message)
        print(
            f"cpbench: {message}. The process group cannot be recovered, so this rank exits "
            "and the launcher ends the job; every configuration finished so far is saved "
            "(rerun with --resume to continue).",
            file=sys.stderr,
            flush=True,
        )
        if self.rank == 0:
            try:
                if self.on_abandon is not None:
                    self.on_abandon(failure)
            finally:
                with contextlib.suppress(Exception):
                    self._store.set(f"{key}/recorded", b"1")
        else:
            with contextlib.suppress(Exception):
                self._store.wait(
                    [f"{key}/recorded"], datetime.timedelta(seconds=ABANDON_WAIT_SECONDS)
                )
        os._exit(EXIT_WRONG_RESULT)

    def broadcast_from_rank0(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on rank 0 only and give its result (or its CpbenchError) to every rank."""
        import torch.distributed as dist  # noqa: PLC0415

        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", fn())
            except CpbenchError as exc:
                box[0] = ("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - every rank must leave the broadcast
                box[0] = ("failure", f"{type(exc).__name__}: {exc}")
        dist.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise CpbenchError(value)
        if status == "failure":
            raise RunFailure(f"rank 0: {value}")
        return value

    def close(self, force: bool = False) -> None:
        """Destroy the process group this world created (the next `run` builds a new one)."""
        self._destroy()


def _failure(failed: dict[int, _Reply], timeout: float) -> RunFailure:
    """The failure every rank raises: the first reported one names the cause (a rank that
    raised, or one past its timeout); the ranks stopped because of it follow."""
    cause_rank = min(failed, key=lambda r: (failed[r].order, r))
    cause = failed[cause_rank]
    if cause.outcome in ("timeout", "stopped"):
        late = sorted(r for r, x in failed.items() if x.outcome == "timeout")
        return TaskTimeout(
            f"task did not finish within {timeout:g} s on ranks {late or [cause_rank]}; "
            "they were interrupted"
        )
    errors = {r: str(x.value) for r, x in failed.items()}
    others = len(failed) - 1
    return TaskError(
        f"rank {cause_rank}: {cause.value}"
        + (f" (and {others} more ranks stopped)" if others else ""),
        errors,
        restarted=True,
    )


@contextlib.contextmanager
def launched_world(device: str, timeout: float) -> Iterator[InProcessWorld]:
    """An `InProcessWorld` that is closed (its process group destroyed) at the end."""
    world = InProcessWorld(device, timeout)
    try:
        yield world
    finally:
        world.close()
