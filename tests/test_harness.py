"""The one measurement (`cpbench.bench.harness.measure_step`) with a toy step kind on a 1-rank
gloo world: the order check -> row check -> prepare -> timing per variant -> one counted step
-> one probed step, what lands in the `RankMeasurement`, and a failed check stopping it all."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from cpbench.attention.comm import ByteCounter
from cpbench.bench.harness import Prepared, StepKind, measure_step
from cpbench.config.bench import BenchConfig
from cpbench.errors import CpbenchError

CONFIG = BenchConfig(
    seq_len=64, heads=2, kv_heads=2, head_dim=8, batch=1, ulysses=1, ring=1,
    layout="contiguous", dtype="float32", device="cpu", world_size=1,
)  # fmt: skip
SETTINGS = {"warmup": 1, "iters": 2, "precision": None, "budget": 1.0}
"""A fixed count: 1 warm-up and 2 timed steps per variant."""


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _toy_kind(log: list[Any], fail_check: bool = False) -> StepKind:
    """A kind whose step multiplies two matrices and records 64 bytes when counted."""
    x = torch.ones(16, 16)

    def check() -> dict[str, Any]:
        log.append("check")
        if fail_check:
            raise CpbenchError("the toy check failed")
        return {"passed": True}

    def step(variant: str = "full", counter: ByteCounter | None = None) -> None:
        log.append((variant, counter is not None))
        x @ x  # noqa: B018 - the work timed
        if counter is not None:
            counter.record("toy_send", 64)

    @contextlib.contextmanager
    def counting(counter: ByteCounter) -> Iterator[ByteCounter]:
        log.append("counting")
        yield counter

    def prepare() -> Prepared:
        log.append("prepare")
        return Prepared(step, (x,), "toy", "1.0", variants=("full", "compute"), kv_cache_bytes=7)

    return StepKind(
        check=check,
        prepare=prepare,
        row_check=lambda: log.append("rows") or {"rows": 3},  # type: ignore[func-returns-value]
        counting=counting,
    )


def test_a_step_kind_is_checked_then_timed_counted_and_probed(one_rank: None) -> None:
    log: list[Any] = []
    measured = measure_step(_toy_kind(log), CONFIG, SETTINGS, torch.device("cpu"))
    timed = [("full", False)] * 3 + [("compute", False)] * 3
    assert log == ["check", "rows", "prepare", *timed, "counting", ("full", True), ("full", False)]
    assert measured.kernel == "toy" and measured.kernel_version == "1.0"
    assert measured.accuracy == {"passed": True} and measured.sampled_rows == {"rows": 3}
    assert measured.full.warmup == 1 and len(measured.full.samples) == 2
    assert measured.compute is not None and len(measured.compute.samples) == 2
    assert measured.comm is None  # not a variant of this kind
    assert measured.bytes == {"fwd": {"toy_send": 64}}
    assert measured.kv_cache_bytes == 7 and measured.gpu is None
    assert measured.memory.peak_bytes >= 16 * 16 * 4  # the product's output, at least


def test_a_failed_check_stops_before_anything_is_built_or_timed(one_rank: None) -> None:
    log: list[Any] = []
    with pytest.raises(CpbenchError, match="the toy check failed"):
        measure_step(_toy_kind(log, fail_check=True), CONFIG, SETTINGS, torch.device("cpu"))
    assert log == ["check"]
