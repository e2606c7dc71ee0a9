"""Functions the prefill tests send to the pool's ranks (importable by spawned ranks)."""

from __future__ import annotations

import torch

from cpbench.attention.kernels import NaiveKernel
from cpbench.attention.kernels.base import Band
from cpbench.bench.inference_verify import run_inference_cases_on_rank
from cpbench.model.inference import DecodeCase, PrefillCase


class TopLeftCausalKernel(NaiveKernel):
    """A wrong scheme: every piece masked top-left causal, as if the cache offset were 0 (the
    bug of a prefill that applies the training causal mask to T queries on P + T keys)."""

    name = "top_left_causal"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(q, k, v, True, scale, band)


def prefill_with_wrong_offset(cases: list[PrefillCase]) -> list[dict | None]:
    """The prefill check of `cases` run with the top-left-causal kernel."""
    return run_inference_cases_on_rank(cases, "cpu", TopLeftCausalKernel())


def decode_with_wrong_offset(cases: list[DecodeCase]) -> list[dict | None]:
    """The decode check of `cases` run with the top-left-causal kernel."""
    return run_inference_cases_on_rank(cases, "cpu", TopLeftCausalKernel())
