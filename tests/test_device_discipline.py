"""Device discipline, checked on CPU (a CPU run cannot see a device mismatch): every tensor the
attention schemes, the harness and the adapters create is made on a named device, except the
host-side index and input arithmetic listed here with its reason; and a repeated step makes no
tensor from host data (on a GPU a blocking copy inside the timed window: prefill is checked in
tests/test_inference_discipline.py, training and decode here)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from cpbench.attention.api import cp_attention
from cpbench.attention.inference_decode import decode_attention
from cpbench.attention.mesh import CPMesh

PACKAGE = Path(__file__).resolve().parent.parent / "cpbench"
CHECKED = ("attention", "bench", "impls")
FACTORIES = frozenset(
    {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
     "rand", "randn", "randint"}
)  # fmt: skip
HOST_SIDE = {
    ("attention/layouts.py", "_ring_positions"): "position arithmetic, moved at use (.to)",
    ("attention/layouts.py", "reassemble"): "the inverse permutation, moved at use (.to)",
    ("bench/reference.py", "_global_inputs"): "seeded inputs from a CPU generator, then moved",
    ("bench/inference_verify.py", "case_inputs"): "seeded inputs from a CPU generator, then moved",
    ("bench/rowcheck.py", "sampled_rows"): "the sampled row indices, moved at use",
    ("bench/rowcheck.py", "full_length_row_check"): "seeded inputs from a CPU generator, then moved",
    ("impls/te.py", "te_positions"): "TE's position split, moved at use",
}
"""(module, function) -> why a tensor made there without `device=` is host-side by design."""


def device_less_factories(source: str, module: str) -> Iterator[tuple[str, int, str]]:
    """(function, line, call) of each `torch.<factory>(...)` without `device=` outside HOST_SIDE."""
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
                and node.func.attr in FACTORIES
                and not any(k.arg == "device" for k in node.keywords)
                and (module, fn.name) not in HOST_SIDE
            ):
                yield fn.name, node.lineno, ast.unparse(node)


def test_every_tensor_is_made_on_a_named_device() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line} in {fn}: {call}"
        for layer in CHECKED
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for fn, line, call in device_less_factories(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE))
        )
    ]
    assert not found, "a tensor made on the CPU by default (an NCCL world has no CPU backend; "
    "pass device=, or list a host-side function in HOST_SIDE with why):\n" + "\n".join(found)


def test_the_check_sees_a_planted_cpu_tensor() -> None:
    # the decode check's defect: byte counts all-reduced from a CPU tensor over the CP group
    planted = "def f(lk, group):\n    n = torch.tensor([lk.nbytes], dtype=torch.int64)\n"
    assert [(fn, line) for fn, line, _ in device_less_factories(planted, "bench/x.py")] == [("f", 2)]
    fixed = planted.replace("dtype=torch.int64", "dtype=torch.int64, device=lk.device")
    assert not list(device_less_factories(fixed, "bench/x.py"))


def test_every_listed_host_side_function_exists() -> None:
    for module, fn in HOST_SIDE:
        tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == fn for n in ast.walk(tree)), (
            module, fn,
        )  # fmt: skip


# --------------------------------------------------------- no host data inside a repeated step

ONE_RANK = CPMesh(ulysses=1, ring=1, rank=0, cp_ranks=(0,))


@pytest.fixture(scope="module", autouse=True)
def one_rank_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class TensorsFromHost(TorchDispatchMode):
    """Counts tensors made from Python data (`torch.tensor(list)` dispatches `lift_fresh`)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten.lift_fresh.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _training_step() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, 4, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 16, 2, 16, generator=g, requires_grad=True) for _ in range(2))
    cp_attention(q, k, v, ONE_RANK, causal=True).sum().backward()


def _decode_step() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 16, generator=g)
    k, v = (torch.randn(1, 13, 2, 16, generator=g) for _ in range(2))
    decode_attention(q, k, v, ONE_RANK, 11)


@pytest.mark.parametrize("step", [_training_step, _decode_step])
def test_a_repeated_step_makes_no_tensor_from_host_data(step) -> None:  # type: ignore[no-untyped-def]
    step()  # the first call may build its caches
    with TensorsFromHost() as mode:
        step()
    assert mode.count == 0


def test_the_mode_sees_a_planted_host_tensor() -> None:
    with TensorsFromHost() as mode:
        torch.tensor([1, 2, 3], device="cpu")
    assert mode.count == 1
