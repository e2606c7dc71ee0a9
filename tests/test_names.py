"""No top-level name is defined in two modules of the package: one name per concept.

A top-level name is what a module's body binds by `def`, `class` or assignment (also inside a
top-level `if` or `try`, e.g. a version switch); imports do not count, since importing a name is
how a second module uses the one definition. Private names count too: two `_row` helpers that
do different things are two concepts under one name for a reader as much as two public ones.
Only dunder names are exempt (`__all__`, a module `__getattr__`): Python gives them their
meaning, so every module that has one must spell it so.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

PACKAGE = Path(__file__).resolve().parent.parent / "cpbench"

def _bodies(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            yield from _bodies(node.body)
            for handler in getattr(node, "handlers", []):
                yield from _bodies(handler.body)
            yield from _bodies(node.orelse)
            yield from _bodies(getattr(node, "finalbody", []))
        else:
            yield node


def top_level_names(source: str) -> set[str]:
    """The names a module's body defines (def, class, assignment), dunders left out."""
    names: set[str] = set()
    for node in _bodies(ast.parse(source).body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def duplicates(root: Path) -> dict[str, list[str]]:
    """Each name defined at top level by more than one module under `root`, with the modules."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for name in top_level_names(path.read_text(encoding="utf-8")):
            where.setdefault(name, []).append(module)
    return {name: modules for name, modules in sorted(where.items()) if len(modules) > 1}


def test_no_top_level_name_is_defined_in_two_modules() -> None:
    found = duplicates(PACKAGE)
    assert not found, "defined in more than one module (import the one definition, or rename "
    "the one that means something else):\n" + "\n".join(
        f"{name}: {', '.join(modules)}" for name, modules in found.items()
    )


def test_the_finder_sees_every_kind_of_definition(tmp_path: Path) -> None:
    """def, class, assignment (also under `if`/`try`) count; imports and dunders do not."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text(
        "__all__ = ['f']\nfrom os import path\ndef f(): pass\nclass C: pass\nX: int = 1\n"
        "try:\n    import json\nexcept ImportError:\n    _y = 2\n",
        encoding="utf-8",
    )
    (package / "sub" / "b.py").write_text(
        "__all__ = []\npath = 1\nif True:\n    f = 1\nelse:\n    C = 2\nX = _y = 3\n",
        encoding="utf-8",
    )
    assert duplicates(package) == {name: ["pkg.a", "pkg.sub.b"] for name in ("C", "X", "_y", "f")}
