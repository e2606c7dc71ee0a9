"""A kernel that cannot run a verify case says so before it runs: the case is skipped with the
reason (exit 0 when every other case passes), not a wrong result. The first GPU run (one H200,
no flash-attn) reported 60 of 145 training cases FAILED, each a refusal of a window or
document mask by cuDNN."""

from __future__ import annotations

import pytest

from cpbench.app.verify import run_verify
from cpbench.bench.reference import run_batch
from cpbench.errors import CpbenchError, KernelRefused


def _case(name: str) -> dict:
    if name == "refused":
        raise KernelRefused("kernel 'cudnn' cannot apply the band pieces of this mask")
    if name == "bad":
        raise CpbenchError("documents (3) do not fit seq_len (2)")
    return {"label": name, "passed": True}


def test_a_refusal_is_skipped_with_its_reason_and_an_error_is_a_failure() -> None:
    records = run_batch(["ok", "refused", "bad"], _case, lambda name: {"label": name})
    assert records[0] == {"label": "ok", "passed": True}
    assert records[1] == {
        "label": "refused",
        "passed": None,
        "skipped": "kernel 'cudnn' cannot apply the band pieces of this mask",
    }
    assert records[2] is not None and records[2]["passed"] is False
    assert "do not fit" in records[2]["error"]


def test_a_named_kernel_that_runs_nothing_here_is_bad_input() -> None:
    with pytest.raises(CpbenchError, match="kernel 'efficient' needs a CUDA device"):
        run_verify(1, "cpu", "float32", "efficient")


def test_a_verify_row_keeps_its_record_and_refuses_a_wrong_type() -> None:
    """`VerifyRow.from_record`: the typed fields of a case's record, the record itself kept
    whole for `--json`; a field of the wrong type is refused naming the case and the field."""
    from cpbench.app.verify import VerifyRow  # noqa: PLC0415

    record = {"seq_len": 64, "ulysses": 1, "ring": 2, "layout": "zigzag", "causal": True,
              "heads": 8, "kv_heads": 2, "scheme": "ring", "label": "ring U1xR2", "mask": "causal",
              "passed": False, "error": "boom"}  # fmt: skip
    row = VerifyRow.from_record(record)
    assert (row.passed, row.error, row.ring, row.skipped) == (False, "boom", 2, None)
    assert row.errors == {} and row.known_issues == ()
    assert row.to_dict() == record and list(row.to_dict()) == list(record)
    with pytest.raises(ValueError, match="'ring U1xR2': ring is True, not int"):
        VerifyRow.from_record({**record, "ring": True})
    with pytest.raises(ValueError, match="passed is 'yes', not bool"):
        VerifyRow.from_record({**record, "passed": "yes"})
