"""Shared fixtures: one persistent pool of gloo ranks per world size for the whole session
(spawning a rank costs seconds, so every multi-rank test reuses them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cpbench.bench.pool import WorkerPool, WorldSpec


@pytest.fixture(scope="session")
def pool() -> Iterator[Callable[[int], WorkerPool]]:
    pools: dict[int, WorkerPool] = {}

    def get(world_size: int) -> WorkerPool:
        if world_size not in pools:
            pools[world_size] = WorkerPool(WorldSpec(world_size, "cpu"))
        return pools[world_size]

    yield get
    for p in pools.values():
        p.close()
