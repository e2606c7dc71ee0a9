"""The package's layers import only downward, and no two modules import each other.

Every `import` and `from ... import` in the package counts, including the ones inside functions
(deferred imports still make a dependency). A layer may import its own modules and any layer
below it; pure layers (config, model) never import torch.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

PACKAGE = Path(__file__).resolve().parent.parent / "cpbench"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "units", "files", "reading", ""),  # "" = the package root (__version__)
    ("config",),
    ("model",),
    ("compat",),  # the torch-version compatibility shims every torch-using layer calls
    ("attention",),
    ("impls",),
    ("bench",),
    ("results",),
    ("app",),
    ("render",),
    ("cli", "__main__"),
)
"""Bottom to top. The root name of each module (`cpbench.<root>...`) decides its layer."""
PURE = ("config", "model", "errors", "units", "files", "reading")
"""Layers that never import torch (the CLI validates and the model answers without it)."""


def _layer(root: str) -> int:
    for index, names in enumerate(LAYERS):
        if root in names:
            return index
    raise AssertionError(f"cpbench.{root} is in no layer of tests/test_layers.py: add it")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names this module imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _internal(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:
        target = target.rsplit(".", 1)[0] if "." in target else ""
    return target or None


def _root(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = _modules()


@functools.cache
def _edges() -> dict[str, set[str]]:
    """Each module's imports of other cpbench modules. Parsed when a test first asks, not at
    collection: every xdist worker collects this file (2.5 s of parsing each)."""
    return {
        name: {
            t
            for t in (_internal(i, MODULES) for i in _imports(name, path))
            if t is not None and t != name and not name.startswith(t + ".")
        }
        for name, path in MODULES.items()
    }


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_downward(module: str) -> None:
    own = _layer(_root(module))
    upward = sorted(t for t in _edges()[module] if _layer(_root(t)) > own)
    assert not upward, f"{module} (layer {own}) imports a higher layer: {', '.join(upward)}"


def test_no_import_cycle() -> None:
    """No module reaches itself through the import graph (Tarjan-free: DFS with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(_edges()[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name)
    # A package __init__ that re-exports its own submodules is not a cycle of layers; only
    # report cycles that do not pass through such an __init__ of the same package.
    real = [c for c in cycles if not _through_own_init(c)]
    assert not real, "import cycles:\n" + "\n".join(real)


def _through_own_init(cycle: str) -> bool:
    names = cycle.split(" -> ")
    return any(
        MODULES[n].name == "__init__.py" and all(m == n or m.startswith(n + ".") for m in names)
        for n in names
    )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _root(m) in PURE))
def test_pure_layers_do_not_import_torch(module: str) -> None:
    torch_imports = sorted(i for i in _imports(module, MODULES[module]) if i.split(".")[0] == "torch")
    assert not torch_imports, f"{module} is pure Python but imports {', '.join(torch_imports)}"


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The parser sees deferred imports too (else the layer test could not fail)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from cpbench.cli.main import app\n", encoding="utf-8")
    assert "cpbench.cli.main" in _imports("cpbench.model.m", source)
