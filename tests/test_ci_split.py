"""The CI split (tests/ci_split.py): the guard of `torch_free` tests sees each kind of torch use
and none in pure code, fails the test that used torch, and CI's main-torch run leaves the
marked tests to the floor-torch run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cpbench.bench.pool import WorkerPool
from tests import ci_split, conftest


def test_the_guard_sees_each_kind_of_torch_use() -> None:
    with ci_split.torch_untouched() as uses:
        torch.zeros(2).sum()
    assert uses[0] == "read torch.zeros" and uses[1].endswith("zeros"), uses
    assert uses[2].startswith("called") and uses[2].endswith(".sum"), uses
    with ci_split.torch_untouched() as uses:
        torch.cuda.is_available()
    assert uses[0] == "read torch.cuda", uses
    with ci_split.torch_untouched() as uses:
        _ = torch.__version__
    assert uses == ["read torch.__version__"]
    with ci_split.torch_untouched() as uses:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert uses == ["started a subprocess"]
    with ci_split.torch_untouched() as uses, pytest.raises(AttributeError):
        WorkerPool.run(SimpleNamespace(), print)  # type: ignore[arg-type]
    assert uses == ["ran a task on a pool's ranks"]


def test_pure_code_touches_nothing_and_the_guard_leaves_no_trace() -> None:
    import json  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from cpbench.model.flops import phase_factor  # noqa: PLC0415

    with ci_split.torch_untouched() as uses:
        assert float(np.arange(4).sum()) == 6.0 and phase_factor("forward_backward") > 1
        assert json.loads(json.dumps({"a": [1, 2.5]})) == {"a": [1, 2.5]}
    assert uses == []
    assert type(torch) is type(sys) and not hasattr(torch, "_cpbench_uses")
    assert subprocess.Popen.__init__.__name__ == "__init__"
    with ci_split.torch_untouched() as uses:
        pass
    assert uses == []


def _item(marked: bool) -> Any:
    marks: list[Any] = []
    return SimpleNamespace(
        path=Path("test_x.py"), marks=marks,
        get_closest_marker=lambda name: (name == "torch_free" and marked) or None,
        add_marker=marks.append,
    )  # fmt: skip


def test_a_marked_test_that_used_torch_fails_and_a_clean_one_passes() -> None:
    for body, fails in ((lambda: torch.ones(1), True), (lambda: sum(range(3)), False)):
        wrapper = conftest.pytest_runtest_call(_item(marked=True))
        next(wrapper)
        body()
        if fails:
            with pytest.raises(pytest.fail.Exception, match="marked torch_free, but it read torch.ones, called"):
                wrapper.send(None)
        else:
            with pytest.raises(StopIteration):
                wrapper.send(None)


@pytest.mark.parametrize(("ci", "skipped"), [("1", True), ("0", False)])
def test_ci_s_main_run_leaves_the_marked_tests_to_the_floor_run(
    monkeypatch: pytest.MonkeyPatch, ci: str, skipped: bool
) -> None:
    monkeypatch.setenv("CPBENCH_CI", ci)
    monkeypatch.setattr(ci_split, "on_the_main_torch", lambda: True)
    marked, other = _item(marked=True), _item(marked=False)
    conftest.pytest_collection_modifyitems([marked, other])
    assert [m.kwargs["reason"] for m in marked.marks] == [ci_split.IN_THE_FLOOR_RUN] * skipped
    assert other.marks == []
    monkeypatch.setattr(ci_split, "on_the_main_torch", lambda: False)  # the floor run keeps them
    floor = _item(marked=True)
    conftest.pytest_collection_modifyitems([floor])
    assert floor.marks == []


@pytest.mark.torch_free
def test_the_modules_ordered_first_exist() -> None:
    """A renamed module would drop out of the order silently (and end a worker late)."""
    here = Path(__file__).parent
    assert [m for m in conftest.HEAVIEST_FIRST if not (here / m).is_file()] == []
    assert len(set(conftest.HEAVIEST_FIRST)) == len(conftest.HEAVIEST_FIRST)
