"""The launched rank: this process's place in a world that torchrun or srun started, read from
the launcher's environment variables alone (nothing here imports torch or a process group, so
the local pool can ask it before anything is started: bench/pool.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from cpbench.errors import CpbenchError


@dataclass(frozen=True)
class LaunchedRank:
    """This process's place in a world that torchrun or srun launched."""

    rank: int
    """Global rank (torchrun's RANK, srun's SLURM_PROCID)."""
    world_size: int
    """Number of ranks (WORLD_SIZE, SLURM_NTASKS)."""
    local_rank: int | None
    """Rank on this node (LOCAL_RANK, SLURM_LOCALID); None when the launcher gave none."""
    launcher: Literal["torchrun", "slurm"]
    """Which variables it came from ("torchrun" covers any env:// launch)."""


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise CpbenchError(f"{name}={env[name]!r} must be an integer") from None


def launched_rank(env: Mapping[str, str] | None = None) -> LaunchedRank | None:
    """This process's rank in a launched world, or None when it runs on its own.

    torchrun (any env:// launch) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
    srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, which count when torchrun's are
    absent and MASTER_ADDR is set (a batch script alone also has SLURM_PROCID 0 and
    SLURM_NTASKS, and must not be taken for a rank of a world)."""
    env = os.environ if env is None else env
    if "MASTER_ADDR" not in env:
        return None
    if "RANK" in env and "WORLD_SIZE" in env:
        local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID"))
        return LaunchedRank(
            _env_int(env, "RANK"),
            _env_int(env, "WORLD_SIZE"),
            None if local is None else _env_int({"LOCAL_RANK": local}, "LOCAL_RANK"),
            "torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        local_id = _env_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else None
        return LaunchedRank(
            _env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_NTASKS"), local_id, "slurm"
        )
    return None
