"""The mutation check's fast subset (tests/mutation, docs/mutation.md): each planted defect of
the judge, the tolerance, the sampled-row check, the byte comparison, the layouts, the cost
model and the exit codes is applied to a copy of the tree, and its unit-level tests must fail
there. The whole list (the multi-rank tests included) runs with `python -m tests.mutation`."""

from __future__ import annotations

import pytest

from tests.ci_split import ONCE_PER_CI, on_the_main_torch
from tests.mutation.mutants import MUTANTS, Mutant
from tests.mutation.runner import run_mutants

VERIFY_EXIT = "tests/test_judge.py::test_verify_exits_1_when_a_case_failed_its_check"
HARMLESS = Mutant(
    "harmless-docstring",
    "cpbench/errors.py",
    '"""Ctrl-C (128 + SIGINT): every record finished so far is kept."""',
    '"""Ctrl-C (128 + SIGINT), every record finished so far is kept."""',
    "changes nothing: the runner must call it survived, not caught",
    (VERIFY_EXIT,),
)
STALE = Mutant(
    "stale-text",
    "cpbench/errors.py",
    "EXIT_BAD_INPUT = 3",
    "EXIT_BAD_INPUT = 1",
    "text that is not in the file: the runner must call it stale",
    (VERIFY_EXIT,),
)


@pytest.mark.skipif(not on_the_main_torch(), reason=ONCE_PER_CI)
def test_every_fast_mutant_is_caught() -> None:
    """The CI subset, and the runner's own verdicts: a mutant that changes nothing survives,
    one whose text is not in the file is stale (a runner that calls everything caught fails)."""
    fast = [m for m in MUTANTS if m.fast]
    assert len(fast) >= 10
    results = run_mutants([*fast, HARMLESS, STALE], timeout_s=120.0, jobs=2)
    outcomes = {r.mutant.name: r.outcome for r in results}
    assert outcomes.pop(HARMLESS.name) == "survived"
    assert outcomes.pop(STALE.name) == "stale"
    missed = [(name, outcome) for name, outcome in outcomes.items() if outcome != "caught"]
    assert not missed
    assert all(r.catching_test for r in results if r.outcome == "caught")


def test_every_mutant_applies_to_the_tree_once() -> None:
    """The list is not stale: each mutant's old text occurs exactly once, names are unique."""
    from tests.mutation.runner import ROOT  # noqa: PLC0415

    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert (ROOT / m.file).read_text().count(m.old) == 1, m.name
        assert m.old != m.new and m.tests, m.name
        assert not any(t.startswith("-") for t in m.tests), m.name  # the baseline's union
