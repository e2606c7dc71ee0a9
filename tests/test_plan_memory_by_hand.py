"""The whole-model plan's memory by hand: the weight, gradient and optimizer bytes one rank holds
at each ZeRO stage (docs/plan.md, "Memory per rank"), written here as numbers for a small model,
so that a stage threshold off by one, a wrong divisor or a wrong byte count fails.

The model: h = 64, 4 layers, 4 query and 2 KV heads of d_h = 16, SwiGLU MLP f = 128, v = 1000,
untied embeddings. Per layer: attention h (a d_h + 2 a_kv d_h) + a d_h h = 64 x 128 + 64 x 64 =
12288, MLP 3 h f = 24576 (linear 36864), norms 2 h = 128: 36992 parameters. Embedding and
output projection v h = 64000 each.

The plan: TP 2, CP 1 x 2, PP 2, DP 2; ZeRO shards over d x c = 4 ranks. A stage holds 2 layers:
2 x (36864 / 2 + 128) = 37120 parameters per rank; the first stage also the embedding / TP
(32000): P = 69120; the last the output projection / TP (32000) and the final norm (64):
P = 69184. Bytes per parameter: 2 (bf16 weights), 4 (fp32 gradients), 12 (fp32 master + Adam
m, v): weights / 4 from ZeRO 3, gradients / 4 from ZeRO 2, optimizer / 4 from ZeRO 1.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpbench.model.plan.memory import Parallelism, params_per_rank, stage_memory
from cpbench.model.plan.transformer import ModelSpec

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

MODEL = ModelSpec("hand", 64, 4, 4, 2, 16, 128, "swiglu", 1000, source="test")
SHARDED = ("weights", "gradients", "optimizer", "ZeRO-3 gathered weights")

# (stage, ZeRO) -> weights, gradients, optimizer, ZeRO-3 gathered weights, in bytes per rank.
# ZeRO 3 gathers 2 layers' full weights (the running one and the prefetched one) / TP in bf16:
# 2 x 36992 / 2 x 2 B = 73984 B.
EXPECTED = {
    # first stage, P = 69120: 2 P = 138240, 4 P = 276480, 12 P = 829440
    ("first", 0): (138240, 276480, 829440, 0),
    ("first", 1): (138240, 276480, 829440 / 4, 0),  # 207360
    ("first", 2): (138240, 276480 / 4, 829440 / 4, 0),  # 69120
    ("first", 3): (138240 / 4, 276480 / 4, 829440 / 4, 73984),  # 34560
    # last stage, P = 69184: 2 P = 138368, 4 P = 276736, 12 P = 830208
    ("last", 0): (138368, 276736, 830208, 0),
    ("last", 1): (138368, 276736, 830208 / 4, 0),  # 207552
    ("last", 2): (138368, 276736 / 4, 830208 / 4, 0),  # 69184
    ("last", 3): (138368 / 4, 276736 / 4, 830208 / 4, 73984),  # 34592
}


def plan(zero: int) -> Parallelism:
    return Parallelism(tp=2, ulysses=1, ring=2, pp=2, dp=2, zero=zero)


def test_parameters_per_rank_by_hand() -> None:
    assert MODEL.layer_params == 36992
    assert params_per_rank(MODEL, 2, first=True, last=False, pp=2, tp=2) == 69120
    assert params_per_rank(MODEL, 2, first=False, last=True, pp=2, tp=2) == 69184
    # PP 1, tied embeddings: every layer (4 x 18560), the embedding / TP, no output projection
    # of its own, the final norm: 74240 + 32000 + 64 = 106304
    tied = replace(MODEL, tied_embeddings=True)
    assert params_per_rank(tied, 4, first=True, last=True, pp=1, tp=2) == 106304
    # PP > 1 with tied embeddings: the last stage holds a copy of the embedding / TP
    assert params_per_rank(tied, 2, first=False, last=True, pp=2, tp=2) == 69184


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("stage", ["first", "last"])
def test_weight_gradient_and_optimizer_bytes_per_zero_stage(stage: str, zero: int) -> None:
    memory = stage_memory(MODEL, plan(zero), 4096, stage, attention_buffers=0.0)
    got = tuple(memory.component(name) for name in SHARDED)
    assert got == pytest.approx(EXPECTED[(stage, zero)], rel=1e-12)
    names = [c.name for c in memory.components]
    assert ("ZeRO-3 gathered weights" in names) == (zero == 3)
    # the stage changes nothing else: activations, buffers and logits are ZeRO 0's
    others = {c.name: c.bytes for c in memory.components if c.name not in SHARDED}
    baseline = stage_memory(MODEL, plan(0), 4096, stage, attention_buffers=0.0)
    assert others == {c.name: c.bytes for c in baseline.components if c.name not in SHARDED}
    assert memory.total == pytest.approx(sum(EXPECTED[(stage, zero)]) + sum(others.values()))


def test_zero_shards_over_dp_times_cp_not_dp_alone() -> None:
    # DP 2 x CP 4 = 8 ranks: ZeRO 3 on the first stage holds 138240 / 8, 276480 / 8, 829440 / 8
    par = Parallelism(tp=2, ulysses=2, ring=2, pp=2, dp=2, zero=3)
    memory = stage_memory(MODEL, par, 4096, "first", attention_buffers=0.0)
    got = tuple(memory.component(name) for name in SHARDED)
    assert got == pytest.approx((17280, 34560, 103680, 73984), rel=1e-12)
