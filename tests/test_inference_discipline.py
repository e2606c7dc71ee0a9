"""The inference schemes on one gloo rank: float64 in, float64 accuracy out (they once merged
in float32: errors 2e-8 to 6e-7 against the float64 reference), and no tensor built from host
data inside a repeated prefill step (on a GPU a blocking copy inside the timed window)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from cpbench.attention.inference import prefill_attention
from cpbench.attention.inference_decode import decode_attention
from cpbench.attention.mesh import CPMesh
from cpbench.attention.reference import reference_attention
from cpbench.bench.inference_verify import (
    default_decode_cases,
    default_prefill_cases,
    run_inference_cases_on_rank,
)

ONE_RANK = CPMesh(ulysses=1, ring=1, rank=0, cp_ranks=(0,))
FLOAT64_TOLERANCE = 1e-12
"""float64 kernels and merges on unit-normal inputs of a few tokens; a float32 merge anywhere
on the path costs about 1e-7."""


@pytest.fixture(scope="module", autouse=True)
def one_rank_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A gloo world of one: the schemes' collectives (all-to-all, all-gather) run for real."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _qkv(keys: int, queries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, queries, 4, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, keys, 2, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, keys, 2, 16, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("scheme", ["pass_kv", "pass_q", "ulysses"])
@pytest.mark.parametrize("cached", [0, 7])
def test_prefill_in_float64_is_float64_accurate(scheme: str, cached: int) -> None:
    new = 9
    q, k, v = _qkv(cached + new, new)
    out = prefill_attention(q, k, v, ONE_RANK, cached, new, scheme=scheme)  # type: ignore[arg-type]
    want = reference_attention(q, k, v, True, None, cached)
    assert out.dtype == torch.float64
    assert float((out - want).abs().max()) < FLOAT64_TOLERANCE


@pytest.mark.parametrize("merge", ["all_gather", "all_to_all"])
def test_decode_in_float64_is_float64_accurate(merge: str) -> None:
    cached = 11
    q, k, v = _qkv(cached + 2, 2)
    out = decode_attention(q, k, v, ONE_RANK, cached, merge=merge)  # type: ignore[arg-type]
    want = reference_attention(q, k, v, True, None, cached)
    assert out.dtype == torch.float64
    assert float((out - want).abs().max()) < FLOAT64_TOLERANCE


class _TensorsFromHost(TorchDispatchMode):
    """Counts tensors made from Python data (`torch.tensor(list)` dispatches `lift_fresh`):
    on a GPU each is a blocking host-to-device copy."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten.lift_fresh.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scheme", ["pass_kv", "pass_q", "ulysses"])
def test_a_repeated_prefill_step_makes_no_tensor_from_host_data(scheme: str) -> None:
    q, k, v = _qkv(7 + 9, 9)
    prefill_attention(q, k, v, ONE_RANK, 7, 9, scheme=scheme)  # type: ignore[arg-type]
    with _TensorsFromHost() as mode:
        prefill_attention(q, k, v, ONE_RANK, 7, 9, scheme=scheme)  # type: ignore[arg-type]
    assert mode.count == 0


def test_every_default_inference_case_passes_on_a_world_of_one() -> None:
    """A world of 1 (one GPU) sends nothing: the all-to-all of pass-Q, Ulysses and the decode
    merges counts 0 bytes where the model lists no collective. Every case once failed there on
    `{'a2a_lse': 0, 'a2a_out': 0} != {}` with an exact output."""
    cases = [*default_prefill_cases(1, "bfloat16"), *default_decode_cases(1, "bfloat16")]
    records = run_inference_cases_on_rank(cases)
    failed = [r["label"] for r in records if r is None or r["passed"] is not True]
    assert len(records) == len(cases) > 100
    assert failed == []
