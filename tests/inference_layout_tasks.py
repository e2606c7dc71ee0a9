"""Functions the new-token layout tests send to the pool's ranks (importable by spawned ranks)."""

from __future__ import annotations

from unittest import mock

import torch

from cpbench.attention.mesh import CPMesh
from cpbench.bench import inference_verify
from cpbench.bench.inference_verify import run_inference_cases_on_rank
from cpbench.model.inference import PrefillCase, new_token_segments, split_starts


def shard_tail_first(
    q_new: torch.Tensor,
    k_all: torch.Tensor,
    v_all: torch.Tensor,
    mesh: CPMesh,
    cached_len: int,
    new_token_layout: str = "zigzag",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A wrong sharding: rank r holds the right chunks of the balanced layout (r and
    2W - 1 - r) and the right cache shard, but its two chunks tail first (the order a
    head-tail split gets when it concatenates the chunks the wrong way round)."""
    runs = new_token_segments(q_new.shape[1], mesh.world, "zigzag")[mesh.rank][::-1]
    cache = split_starts(cached_len, mesh.world)
    c0, c1 = cache[mesh.rank], cache[mesh.rank + 1]

    def new(x: torch.Tensor) -> list[torch.Tensor]:
        return [x[:, s : s + n] for s, n in runs]

    def kv(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, c0:c1], *new(x[:, cached_len:])], dim=1)

    return torch.cat(new(q_new), dim=1), kv(k_all), kv(v_all)


def prefill_with_tail_first_chunks(cases: list[PrefillCase]) -> list[dict | None]:
    """The prefill check of balanced `cases` with every rank's chunks sharded tail first (the
    attention and the gather back take them head first, as the layout defines)."""
    with mock.patch.object(inference_verify, "shard_prefill", shard_tail_first):
        return run_inference_cases_on_rank(cases, "cpu")
