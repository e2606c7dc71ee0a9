"""The mutation check's fast subset (tests/mutation, docs/mutation.md): each planted defect of
the judge, the tolerance, the sampled-row check, the byte comparison, the layouts, the cost
model and the exit codes is applied to a copy of the tree, and its unit-level tests must fail
there. The whole list (the multi-rank tests included) runs with `python -m tests.mutation`."""

from __future__ import annotations

from tests.mutation.mutants import MUTANTS
from tests.mutation.runner import run_mutants


def test_every_fast_mutant_is_caught() -> None:
    fast = [m for m in MUTANTS if m.fast]
    assert len(fast) >= 10
    results = run_mutants(fast, timeout_s=120.0)
    missed = [(r.mutant.name, r.outcome) for r in results if r.outcome != "caught"]
    assert not missed
    assert all(r.catching_test for r in results)


def test_every_mutant_applies_to_the_tree_once() -> None:
    """The list is not stale: each mutant's old text occurs exactly once, names are unique."""
    from tests.mutation.runner import ROOT  # noqa: PLC0415

    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert (ROOT / m.file).read_text().count(m.old) == 1, m.name
        assert m.old != m.new and m.tests, m.name
