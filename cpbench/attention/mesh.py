"""The U x R context-parallel mesh: rank-grid arithmetic and the one place that creates process
groups. CP rank p = ring_rank * U + ulysses_rank: Ulysses groups are runs of U consecutive ranks
(inside a node, for the all-to-all's bandwidth), ring groups strided by U (across nodes)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch.distributed as dist

from cpbench.errors import CpbenchError


def mesh_grid(ulysses: int, ring: int) -> tuple[list[list[int]], list[list[int]]]:
    """(ulysses groups, ring groups) as lists of CP ranks, from plain index arithmetic."""
    if ulysses <= 0 or ring <= 0:
        raise CpbenchError(f"ulysses ({ulysses}) and ring ({ring}) must be positive")
    ulysses_groups = [[j * ulysses + u for u in range(ulysses)] for j in range(ring)]
    ring_groups = [[j * ulysses + u for j in range(ring)] for u in range(ulysses)]
    return ulysses_groups, ring_groups


@dataclass(frozen=True)
class CPMesh:
    """One rank's view of a U x R mesh: its coordinates and the process groups it talks on."""

    ulysses: int
    """U: ranks in a Ulysses (all-to-all) group."""
    ring: int
    """R: ranks in a ring (point-to-point) group."""
    rank: int
    """This rank's index in the CP group, 0 .. U*R-1."""
    cp_ranks: tuple[int, ...]
    """Global ranks of the CP group, indexed by CP rank."""
    ulysses_group: dist.ProcessGroup | None = field(default=None, compare=False)
    """Group of this rank's Ulysses peers; None when U == 1."""
    ring_group: dist.ProcessGroup | None = field(default=None, compare=False)
    """Group of this rank's ring peers; None when R == 1."""
    cp_group: dist.ProcessGroup | None = field(default=None, compare=False)
    """The whole CP group (used to gather sharded tensors back)."""

    @property
    def world(self) -> int:
        return self.ulysses * self.ring

    @property
    def ring_rank(self) -> int:
        return self.rank // self.ulysses

    @property
    def ulysses_rank(self) -> int:
        return self.rank % self.ulysses

    def ring_peer(self, ring_rank: int) -> int:
        """Global rank of ring rank `ring_rank` in this rank's ring group."""
        return self.cp_ranks[(ring_rank % self.ring) * self.ulysses + self.ulysses_rank]

    @property
    def ring_next(self) -> int:
        return self.ring_peer(self.ring_rank + 1)

    @property
    def ring_prev(self) -> int:
        return self.ring_peer(self.ring_rank - 1)


_MESH_CACHE: dict[tuple[int, int, tuple[int, ...]], CPMesh] = {}
_GROUP_CACHES: list[Callable[[], None]] = []
"""The `cache_clear` of every other cache that holds process groups (`group_cache`)."""

_F = TypeVar("_F", bound=Callable[..., Any])


def group_cache(fn: _F) -> _F:
    """`functools.cache` for a function whose results hold process groups (an impl's groups,
    a device mesh): registered so that `clear_mesh_cache` forgets them with the meshes."""
    cached = functools.cache(fn)
    _GROUP_CACHES.append(cached.cache_clear)
    return cast(_F, cached)


def clear_mesh_cache() -> None:
    """Forget every cached mesh and every `group_cache`: call after destroying the default
    process group (its subgroups die with it), before building groups over a new one."""
    _MESH_CACHE.clear()
    for clear in _GROUP_CACHES:
        clear()


def build_mesh(
    ulysses: int,
    ring: int,
    group: dist.ProcessGroup | None = None,
    ranks: tuple[int, ...] | None = None,
) -> CPMesh:
    """Build (or fetch from cache: a worker creates each set of groups once) the U x R mesh
    over `group` (default: the whole world), whose global `ranks` a caller may give: a rank
    outside a `new_group` group holds torch's shared placeholder, whose ranks are those of the
    last such group. Collective: every rank of the default group calls it with the same
    arguments, in the same order (process-group creation is collective)."""
    if not dist.is_initialized():
        raise CpbenchError("build_mesh needs an initialised torch.distributed process group")
    cp_ranks = ranks or tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
    if ulysses * ring != len(cp_ranks):
        raise CpbenchError(
            f"ulysses ({ulysses}) x ring ({ring}) = {ulysses * ring} != world size ({len(cp_ranks)})"
        )
    key = (ulysses, ring, cp_ranks)
    if key in _MESH_CACHE:
        return _MESH_CACHE[key]
    me = dist.get_rank()
    ulysses_groups, ring_groups = mesh_grid(ulysses, ring)
    my_ulysses = my_ring = None
    # new_group is collective over the default group: every rank creates every group.
    if ulysses > 1:
        for members in ulysses_groups:
            g = dist.new_group([cp_ranks[r] for r in members])
            if me in (cp_ranks[r] for r in members):
                my_ulysses = g
    if ring > 1:
        for members in ring_groups:
            g = dist.new_group([cp_ranks[r] for r in members])
            if me in (cp_ranks[r] for r in members):
                my_ring = g
    mesh = CPMesh(
        ulysses=ulysses,
        ring=ring,
        rank=cp_ranks.index(me) if me in cp_ranks else -1,
        cp_ranks=cp_ranks,
        ulysses_group=my_ulysses,
        ring_group=my_ring,
        cp_group=group or dist.group.WORLD,
    )
    _MESH_CACHE[key] = mesh
    return mesh
