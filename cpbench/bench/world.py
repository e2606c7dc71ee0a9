"""Worlds: where a task runs on every rank. A local `WorkerPool` (cpbench.bench.pool) spawns
the ranks; under torchrun (or SLURM + env://) the processes already are the world and each runs
the task in place (`InProcessWorld`)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any, Protocol

from cpbench.bench.pool import TaskError
from cpbench.errors import CpbenchError


class World(Protocol):
    """Where a task runs on every rank: a local pool or the torchrun world itself."""

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float) -> list[Any]: ...

    def close(self, force: bool = False) -> None: ...


def launched_by_torchrun() -> bool:
    """True when this process is one rank of an externally launched world."""
    env = os.environ
    return "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env


class InProcessWorld:
    """The world torchrun (or SLURM + env://) launched: this process is one of its ranks and
    runs every task itself; results of all ranks are gathered to every rank. A hung
    configuration cannot be killed from inside; the process group's timeout bounds it."""

    def __init__(self, device: str, timeout: float) -> None:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        if not dist.is_initialized():
            if device == "cuda":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(
                "nccl" if device == "cuda" else "gloo",
                timeout=datetime.timedelta(seconds=max(timeout, 60.0)),
            )
        if device == "cpu":
            torch.set_num_threads(1)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.spawns = 0

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float) -> list[Any]:
        import torch.distributed as dist  # noqa: PLC0415

        try:
            mine: Any = ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001 - every rank must reach the gather below
            mine = ("error", f"{type(exc).__name__}: {exc}")
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        errors = {r: g[1] for r, g in enumerate(gathered) if g[0] == "error"}
        if errors:
            first = min(errors)
            raise TaskError(f"rank {first}: {errors[first]}", errors, restarted=False)
        return [g[1] for g in gathered]

    def broadcast_from_rank0(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on rank 0 only and give its result (or its CpbenchError) to every rank."""
        import torch.distributed as dist  # noqa: PLC0415

        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", fn())
            except CpbenchError as exc:
                box[0] = ("error", str(exc))
        dist.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise CpbenchError(value)
        return value

    def close(self, force: bool = False) -> None:
        return None
