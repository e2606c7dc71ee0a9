"""One configuration object: only `CpProblem` declares the attention problem's fields.

The candidate (`MeshCandidate`), the benchmark point (`BenchConfig`) and the verify case
(`VerifyCase`) inherit them; every other class that would declare them again is a second shape
of the configuration, which this test refuses. File schemas (a record's `config` section, a
scenario's axes, a hardware profile's tables) spell the same names because they are the files'
keys; they are listed here by name, each with the function that converts it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cpbench.config.bench import BenchConfig, VerifyCase
from cpbench.config.problem import CpProblem, MeshCandidate

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

PACKAGE = Path(__file__).resolve().parent.parent / "cpbench"
SHAPE_FIELDS = {"seq_len", "heads", "kv_heads", "head_dim"}
MESH_FIELDS = {"ulysses", "ring"}
"""A class declaring three shape fields and a mesh degree describes the attention problem on a
mesh (the sizes alone, `AttentionShape`, a model's layer or a kernel test, are not)."""
FILE_SCHEMAS = {
    "cpbench/config/problem.py::CpProblem": "the one configuration object",
    "cpbench/results/schema.py::ConfigSection": "a record's config: BenchConfig.to_dict/from_dict",
    "cpbench/model/calibrate/table.py::TableRow": "a row of a user's table of step times (CSV / "
    "JSONL, docs/cost-model.md): validated, then `candidate()` builds the MeshCandidate",
    "cpbench/app/formulas_schema.py::Inputs": "the `inputs` section of `formulas --json` (the "
    "problem as printed, with the mask's kind and bytes per element): an output shape, kept as "
    "it was before the report became typed",
}


def _declared_fields(node: ast.ClassDef) -> set[str]:
    return {
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }


def _is_problem(fields: set[str]) -> bool:
    return len(fields & SHAPE_FIELDS) >= 3 and bool(fields & MESH_FIELDS)


def _classes_declaring_the_problem() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and _is_problem(_declared_fields(node)):
                found.append(f"{path.relative_to(PACKAGE.parent).as_posix()}::{node.name}")
    return found


def test_only_the_problem_declares_the_attention_problem() -> None:
    extra = sorted(set(_classes_declaring_the_problem()) - set(FILE_SCHEMAS))
    assert not extra, f"a second shape of the configuration (inherit CpProblem instead): {extra}"


def test_the_check_sees_a_second_shape() -> None:
    """The walker finds a class that declares the fields (so the test above can fail)."""
    source = "class Shadow:\n    seq_len: int\n    heads: int\n    ulysses: int\n"
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef) and not _is_problem(_declared_fields(node))
    source = source.replace("ulysses", "kv_heads") + "    head_dim: int\n    ring: int\n"
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef) and _is_problem(_declared_fields(node))


@pytest.mark.parametrize("kind", [MeshCandidate, BenchConfig, VerifyCase])
def test_every_configuration_is_a_problem(kind: type) -> None:
    assert issubclass(kind, CpProblem)


def test_a_point_is_its_problem_with_a_run() -> None:
    point = BenchConfig(
        seq_len=64, heads=4, kv_heads=1, head_dim=8, dtype="float32", ulysses=2, ring=2,
        layout="zigzag", documents=(64,), device="cpu", world_size=4,
    )  # fmt: skip
    problem = CpProblem(**point.problem_fields())
    # one document is none, normalised once in the problem; the geometry is the problem's
    assert point.documents is None and problem.mask == point.mask
    assert (point.replication, point.run_len, point.ring_steps) == (2, 64, 2)
    assert problem.symbols() == point.symbols()
    with pytest.raises(Exception, match=r"ulysses \(2\) x ring \(2\) = 4 != world size \(8\)"):
        BenchConfig(**point.problem_fields(), device="cpu", world_size=8).require_feasible()
