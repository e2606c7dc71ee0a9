"""Caches that hold process groups: the one rebuild (`bench/world.py`'s `_destroy`, which calls
`attention.mesh.clear_mesh_cache` after destroying the default group) forgets every one of
them, so a configuration after a failed one never meets destroyed groups."""

from __future__ import annotations

import ast
from pathlib import Path

import torch.distributed as dist

from cpbench.attention.mesh import build_mesh, clear_mesh_cache
from tests.impl_support import use_stand_ins

ROOT = Path(__file__).resolve().parents[1]
GROUP_WORDS = ("cp_group(", "PROCESS_GROUP", "new_group", "DeviceMesh", "set_seq_parallel_pg")
"""What in a function's source says that its result holds process groups."""


def _cached_functions() -> list[tuple[str, ast.FunctionDef, str]]:
    """(file, function, decorator) for every function of cpbench under a cache decorator."""
    found = []
    for path in sorted((ROOT / "cpbench").rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    text = ast.unparse(dec)
                    if any(w in text for w in ("cache", "lru_cache")):
                        found.append((str(path.relative_to(ROOT)), node, text))
    return found


def test_every_cache_of_process_groups_is_a_group_cache() -> None:
    """A function whose result holds process groups is cached with `group_cache` (cleared by
    the rebuild), never a bare functools.cache: on main impls/usp.py's `_process_groups`
    (yunchang's groups) and impls/torch_cp.py's `_device_mesh` were not."""
    holders = []
    for path, node, decorator in _cached_functions():
        body = ast.unparse(node)
        if any(word in body for word in GROUP_WORDS):
            holders.append((path, node.name))
            assert decorator == "group_cache", (path, node.name, decorator)
    assert ("cpbench/impls/usp.py", "_process_groups") in holders
    assert ("cpbench/impls/torch_cp.py", "_device_mesh") in holders


def test_clearing_the_mesh_cache_forgets_the_impls_groups(tmp_path: Path) -> None:
    """On a 1-rank gloo world: yunchang's groups, torch_cp's device mesh and a cpbench mesh
    are cached, and `clear_mesh_cache` (what the rebuild calls) empties all three caches."""
    use_stand_ins()
    from cpbench.impls import torch_cp, usp  # noqa: PLC0415

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        clear_mesh_cache()
        first = usp._process_groups(1, 1)
        assert usp._process_groups(1, 1) is first  # cached
        mesh = torch_cp._device_mesh("cpu")
        assert torch_cp._device_mesh("cpu") is mesh
        assert build_mesh(1, 1) is build_mesh(1, 1)
        clear_mesh_cache()
        assert usp._process_groups.cache_info().currsize == 0  # type: ignore[attr-defined]
        assert torch_cp._device_mesh.cache_info().currsize == 0  # type: ignore[attr-defined]
    finally:
        clear_mesh_cache()
        dist.destroy_process_group()
