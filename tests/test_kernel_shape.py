"""The kernel's piece shape (issue 24 Build 1): a full (unmasked) piece runs faster per FLOP
than a causal one, by the ratio read off FlashAttention-2's published A100 benchmark; which
ring steps compute full pieces follows the layout. Every expected number is recomputed from
the figure's bars, not from the code's table."""

from __future__ import annotations

import pytest

from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate
from cpbench.model.cost.kernel import full_over_causal, piece_factor
from cpbench.model.cost.prediction import predict
from cpbench.model.cost.work import step_piece_causal
from cpbench.model.hardware.loading import load_profile

# Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png @4f285b3, FlashAttention-2
# bars, head dim 128, TFLOP/s: (b) without causal mask, (d) with causal mask
FULL = {1024: 173, 2048: 187, 4096: 196, 8192: 201, 16384: 203}
CAUSAL = {1024: 133, 2048: 155, 4096: 173, 8192: 182, 16384: 189}


@pytest.mark.parametrize("seq_len", sorted(FULL))
def test_full_over_causal_is_the_figures_ratio(seq_len: int) -> None:
    assert full_over_causal(seq_len) == pytest.approx(FULL[seq_len] / CAUSAL[seq_len], rel=1e-9)


def test_full_over_causal_between_and_outside_the_bars() -> None:
    # halfway in log2 between 2k and 4k: the mean of the two ratios
    middle = 2 ** 11.5
    expected = (187 / 155 + 196 / 173) / 2
    assert full_over_causal(middle) == pytest.approx(expected, rel=1e-9)
    assert full_over_causal(256) == pytest.approx(173 / 133, rel=1e-9)  # below 1k: the 1k one
    assert full_over_causal(1 << 20) == pytest.approx(203 / 189, rel=1e-9)  # above 16k
    # the ratio shrinks with length: the causal tail of short rows matters less
    assert full_over_causal(1024) > full_over_causal(4096) > full_over_causal(16384) > 1.0


def test_the_factor_applies_to_flashattention_2_on_cuda_only() -> None:
    assert piece_factor("flash_attn", "cuda", 128, True, "forward", 4096) == 1.0
    assert piece_factor("flash_attn", "cuda", 128, False, "forward", 4096) == pytest.approx(
        196 / 173, rel=1e-9
    )
    for kernel, device in (("flash_attn3", "cuda"), ("cudnn", "cuda"), ("cpu_sdpa", "cpu")):
        assert piece_factor(kernel, device, 128, False, "backward", 4096) == 1.0


def _candidate(seq_len: int, ring: int, layout: str, causal: bool = True) -> MeshCandidate:
    return MeshCandidate.for_shape(
        shape=AttentionShape(seq_len, 32, 8, 128), ulysses=1, ring=ring, layout=layout,
        dtype="bfloat16", causal=causal, phase="fwd",
    )  # fmt: skip


def test_which_ring_steps_compute_full_pieces() -> None:
    assert step_piece_causal(_candidate(65536, 4, "zigzag")) == (True, False, False, False)
    assert step_piece_causal(_candidate(65536, 4, "contiguous")) == (True, False, False, False)
    # striped: every step's block is triangular (its diagonal shifted by a token)
    assert step_piece_causal(_candidate(65536, 4, "striped")) == (True, True, True, True)
    assert step_piece_causal(_candidate(65536, 4, "zigzag", causal=False)) == (False,) * 4
    assert step_piece_causal(_candidate(65536, 1, "contiguous")) == (True,)


def test_a_full_mask_runs_at_the_full_rate_on_one_gpu() -> None:
    """One A100 (flash_attn, the a100-80gb default), L = 4096, forward: a full mask computes
    twice the pairs of a causal one (L^2 vs L^2 / 2) at 196 / 173 of its rate, so its kernel
    time (compute-only less the one step overhead) is 2 x 173 / 196 of the causal one's."""
    profile = load_profile("a100-80gb")
    assert profile.default_kernel == "flash_attn"
    causal = predict(_candidate(4096, 1, "contiguous"), profile, 1, memory=False)
    full = predict(_candidate(4096, 1, "contiguous", causal=False), profile, 1, memory=False)
    overhead = profile.step_overhead_s
    ratio = (full.compute_only_s - overhead) / (causal.compute_only_s - overhead)
    assert ratio == pytest.approx(2 * 173 / 196, rel=1e-6)


def test_zigzag_off_diagonal_steps_run_at_the_full_rate_and_striped_ones_at_the_causal() -> None:
    """8 A100s, L = 65536 (n = 8192 a rank), forward, three meshes with the same 8 step
    overheads and merges: a full mask (8 steps of n^2 pairs, full pieces), causal zigzag (step
    0: n^2 / 2 causal, 7 steps of n^2 / 2 full) and causal striped (step 0 as zigzag, 7 steps of
    n(n+1)/2 causal). With a = n^2 / full rate and b = n^2 / causal rate the differences are
    full - zigzag = 4.5 a - 0.5 b and striped - zigzag = 3.5 (1 + 1/n) b - 3.5 a; solved for a
    and b, b / a is the figure's 201 / 182 at 8k."""
    profile = load_profile("a100-80gb")
    n = 8192

    def compute(layout: str, causal: bool) -> float:
        c = _candidate(65536, 8, layout, causal)
        return predict(c, profile, 8, memory=False).compute_only_s

    zigzag, striped = compute("zigzag", True), compute("striped", True)
    full = compute("zigzag", False)
    d1, d2 = full - zigzag, striped - zigzag
    b = (d1 + 4.5 * d2 / 3.5) / (4.5 * (1 + 1 / n) - 0.5)
    a = (1 + 1 / n) * b - d2 / 3.5
    assert b / a == pytest.approx(201 / 182, rel=1e-6)
    assert zigzag < striped
