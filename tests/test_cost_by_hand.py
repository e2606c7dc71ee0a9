"""The cost model by hand: for each scheme, one small case whose per-step compute and
communication, exposed time and total are worked out from the formulas of docs/design.md
section 2 and docs/inference.md ("The model"), written here as numbers, not taken from
`predict()`. A change that prices one step, one hop or one overlap differently fails here.

The profile `HAND` is built so that the arithmetic is short (every time in milliseconds):

- kernel: peak 0.067108864 TFLOP/s x efficiency 0.25 at 256 tokens (0.5 at 1024, linear in
  log2 between) = 2^24 FLOP per ms at a kernel length of 256, 2^25 at 1024; head dim 128, so
  FlashAttention-2's head-dim factor is 1;
- memory: 1.31072e10 B/s = 2^17 B per 0.01 ms (the ring's fp32 merges);
- step overhead 0.01 ms; overlap 0.5 (a step takes max(c, h) + 0.5 min(c, h));
- intra-node send/recv: 0.02 ms + bytes / (2^17 B per ms); all-to-all: 0.03 ms + bytes /
  (2^16 B per ms). Every case fits one node of 8.

Shapes: d_h = 128, B = 1, bf16 (2 bytes), causal. A forward pair costs 4 B (h/U) d_h FLOPs
(512 per query head a rank attends for), the backward 2.5 times that.
"""

from __future__ import annotations

import pytest

from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.model.cost.breakdown import PhaseTime
from cpbench.model.cost.prediction import Prediction, predict
from cpbench.model.hardware.file_schema import profile_from_dict
from cpbench.model.inference_cost import price_decode, price_prefill

MS = 1e-3

HAND = profile_from_dict(
    {
        "name": "hand",
        "description": "a profile for arithmetic by hand",
        "devices_per_node": 8,
        "memory": {"capacity_gib": 80.0, "bandwidth_GBps": 13.1072, "source": "test"},
        "peak_tflops": {"bfloat16": 0.067108864, "source": "test"},  # 2^26 FLOP/ms
        "efficiency": {  # every kernel family reads the default's curve
            "default": "flash_attn",
            "flash_attn": {"seq_len": [256, 1024], "efficiency": [0.25, 0.5], "source": "test"},
        },
        "overheads": {"step_overhead_us": 10.0, "overlap": 0.5, "source": "test"},  # 0.01 ms
        "links": {
            "intra_node": {
                "name": "NVLink (test)",
                "all_to_all": {"latency_us": 30.0, "busbw_GBps": 0.065536},  # 0.03 ms, 2^16 B/ms
                "send_recv": {"latency_us": 20.0, "busbw_GBps": 0.131072},  # 0.02 ms, 2^17 B/ms
            },
            "inter_node": {
                "name": "NIC (test)",
                "devices_per_nic": 2,
                "all_to_all": {"latency_us": 1000.0, "busbw_GBps": 0.001},
                "send_recv": {"latency_us": 1000.0, "busbw_GBps": 0.001},
            },
        },
    },
    "test_cost_by_hand.py",
)


def ms(value: float) -> object:
    """`value` milliseconds, to float precision."""
    return pytest.approx(value * MS, rel=1e-9, abs=1e-15)


def check_phase(
    t: PhaseTime, *, total: float, compute: float, imbalance: float, exposed: float,
    comm: float, ulysses: float, ring: float, memory: float, overlappable: float,
    flops: float, steps: float,
) -> None:  # fmt: skip
    """Every field of a phase's breakdown (times in ms)."""
    assert t.total_s == ms(total)
    assert t.compute_s == ms(compute)
    assert t.imbalance_s == ms(imbalance)
    assert t.exposed_comm_s == ms(exposed)
    assert t.comm_s == ms(comm)
    assert t.ulysses_comm_s == ms(ulysses)
    assert t.ring_comm_s == ms(ring)
    assert t.memory_bound_s == ms(memory)
    assert t.overlappable_s == ms(overlappable)
    assert t.slowest_flops == pytest.approx(flops, rel=1e-12)
    assert t.steps == pytest.approx(steps, rel=1e-12)
    # the breakdown adds up: compute + imbalance + exposed = total
    assert t.compute_s + t.imbalance_s + t.exposed_comm_s == pytest.approx(t.total_s, rel=1e-12)


def hops(p: Prediction, phase: str) -> list[tuple[str, float]]:
    """(kind, bytes) of each communication term of a phase, in the order they were priced."""
    return [(term.kind, term.bytes) for term in p.comm_terms if term.phase == phase]


def ring(layout: str, **extra: object) -> Prediction:
    """R = 4, U = 1, L = 1024, one query and one KV head: a ring shard of n = 256 tokens."""
    fields: dict[str, object] = {"seq_len": 1024, "heads": 1, "kv_heads": 1, "head_dim": 128}
    fields.update(ulysses=1, ring=4, layout=layout, **extra)
    return predict(MeshCandidate(**fields), HAND, memory=False)  # type: ignore[arg-type]


# Common to the R = 4 rings below (n = 256, kernel at 256 tokens: 2^24 FLOP/ms):
# - a K/V chunk is 2 B n h_kv d_h = 65536 elements, 131072 B in bf16: a hop 0.02 + 1 = 1.02 ms;
#   a dK/dV chunk (fp32) 262144 B: 0.02 + 2 = 2.02 ms; both in one exchange 0.02 + 3 = 3.02 ms;
# - forward merge from step 1 on: 7 passes x B n h d_h = 7 x 32768 x 4 B = 7 x 2^17 B = 0.07 ms;
# - backward accumulation every step: (3 x 32768 + 7 x 65536) x 4 B = 17 x 2^17 B = 0.17 ms;
# - a diagonal block (n^2/2 = 32768 pairs) is 2^24 FLOPs = 1 ms forward, 2.5 ms backward;
#   a full block (n^2 = 65536 pairs) 2 ms forward, 5 ms backward;
# - the mean rank: L^2/2 x 512 / 4 = 2^26 FLOPs = 4 ms forward (10 ms backward), plus 4 step
#   overheads and the merges: 4 + 0.04 + 3 x 0.07 = 4.25 ms, 10 + 0.04 + 4 x 0.17 = 10.72 ms.
KV_HOP, DKV_HOP = 131072.0, 262144.0


def test_ring_contiguous_forward_and_backward_by_hand() -> None:
    p = ring("contiguous")
    # Forward: step 0 computes the own diagonal block (1 + 0.01 = 1.01 ms); steps 1-3 the
    # busiest rank sees a whole chunk (2 + 0.01 + 0.07 = 2.08 ms). K/V hops at steps 0-2.
    #   step 0: max(1.01, 1.02) + 0.5 x 1.01 = 1.525
    #   step 1: max(2.08, 1.02) + 0.5 x 1.02 = 2.59
    #   step 2: 2.59
    #   step 3: 2.08 (nothing in flight)
    # total 8.785; busiest-rank compute 1.01 + 3 x 2.08 = 7.25, so 1.535 exposed, imbalance
    # 7.25 - 4.25 = 3.0; hops 3 x 1.02 = 3.06, hidden 1.01 + 1.02 + 1.02 = 3.05.
    check_phase(
        p.forward, total=8.785, compute=4.25, imbalance=3.0, exposed=1.535, comm=3.06,
        ulysses=0.0, ring=3.06, memory=0.21, overlappable=3.05,
        flops=(32768 + 3 * 65536) * 512, steps=4,
    )  # fmt: skip
    assert hops(p, "forward") == [("send_recv", KV_HOP)] * 3
    # Backward: step 0 2.5 + 0.01 + 0.17 = 2.68 ms, steps 1-3 5 + 0.01 + 0.17 = 5.18 ms. In
    # flight: the next K/V at steps 0-2; the dK/dV accumulator posted after step s - 1 from
    # step 2 on (the own chunk's gradient stays home, so the first leaves after step 1):
    #   step 0: K/V        1.02: max(2.68, 1.02) + 0.51 = 3.19
    #   step 1: K/V        1.02: 5.18 + 0.51 = 5.69
    #   step 2: K/V + dK/dV 3.02: 5.18 + 1.51 = 6.69
    #   step 3: dK/dV      2.02: 5.18 + 1.01 = 6.19
    #   home:   dK/dV      2.02 exposed
    # total 23.78; compute 2.68 + 3 x 5.18 = 18.22 (balanced 10.72, imbalance 7.5); exposed
    # 23.78 - 18.22 = 5.56; hops 1.02 + 1.02 + 3.02 + 2.02 + 2.02 = 9.1, hidden 1.02 + 1.02 +
    # 3.02 + 2.02 = 7.08.
    check_phase(
        p.backward, total=23.78, compute=10.72, imbalance=7.5, exposed=5.56, comm=9.1,
        ulysses=0.0, ring=9.1, memory=0.68, overlappable=7.08,
        flops=(32768 + 3 * 65536) * 512 * 2.5, steps=4,
    )  # fmt: skip
    assert hops(p, "backward") == [
        ("send_recv", KV_HOP), ("send_recv", KV_HOP), ("send_recv", KV_HOP + DKV_HOP),
        ("send_recv", DKV_HOP), ("send_recv", DKV_HOP),
    ]  # fmt: skip
    assert p.step_s == ms(8.785 + 23.78)
    assert p.compute_only_s == ms(7.25 + 18.22)
    assert p.comm_only_s == ms(3.06 + 9.1)


def test_ring_zigzag_forward_and_backward_by_hand() -> None:
    p = ring("zigzag")
    # Every rank computes half a chunk at every step: step 0 1.01 ms, steps 1-3 1 + 0.01 +
    # 0.07 = 1.08 ms forward.
    #   step 0: max(1.01, 1.02) + 0.5 x 1.01 = 1.525
    #   steps 1, 2: max(1.08, 1.02) + 0.5 x 1.02 = 1.59 each
    #   step 3: 1.08
    # total 5.785; compute 1.01 + 3 x 1.08 = 4.25 (balanced: no imbalance), exposed 1.535.
    check_phase(
        p.forward, total=5.785, compute=4.25, imbalance=0.0, exposed=1.535, comm=3.06,
        ulysses=0.0, ring=3.06, memory=0.21, overlappable=3.05,
        flops=4 * 32768 * 512, steps=4,
    )  # fmt: skip
    # Backward: every step 2.5 + 0.01 + 0.17 = 2.68 ms.
    #   step 0: K/V 1.02:         2.68 + 0.51 = 3.19
    #   step 1: K/V 1.02:         3.19
    #   step 2: K/V + dK/dV 3.02: the hop is longer: 3.02 + 0.5 x 2.68 = 4.36
    #   step 3: dK/dV 2.02:       2.68 + 1.01 = 3.69
    #   home 2.02
    # total 16.45; compute 4 x 2.68 = 10.72; exposed 5.73; hidden 1.02 + 1.02 + 2.68 + 2.02.
    check_phase(
        p.backward, total=16.45, compute=10.72, imbalance=0.0, exposed=5.73, comm=9.1,
        ulysses=0.0, ring=9.1, memory=0.68, overlappable=6.74,
        flops=4 * 32768 * 512 * 2.5, steps=4,
    )  # fmt: skip
    assert hops(p, "backward") == hops(ring("contiguous"), "backward")


def test_ulysses_forward_and_backward_by_hand() -> None:
    # U = 4, R = 1, L = 1024, 4 heads (MHA): S = 256 tokens per rank, one head per rank after
    # the exchange; the kernel runs on the whole sequence (1024 tokens: 2^25 FLOP/ms).
    p = predict(
        MeshCandidate(seq_len=1024, heads=4, kv_heads=4, head_dim=128, ulysses=4, ring=1),
        HAND, memory=False,
    )  # fmt: skip
    # All-to-alls, each hands in B S h d_h (Q, O: 131072 elements) or 2 B S h_kv d_h (K/V:
    # 262144) and sends 3/4 of it: Q 196608 B = 0.03 + 3 ms, K/V 393216 B = 0.03 + 6 ms, O
    # 0.03 + 3 ms: 12.09 ms, never overlapped. Backward dO, dQ, dK/dV the same: 12.09 ms.
    # Compute: L^2/2 pairs x 4 x (4/4) x 128 = 2^28 FLOPs at 2^25 FLOP/ms = 8 ms, + 0.01.
    check_phase(
        p.forward, total=8.01 + 12.09, compute=8.01, imbalance=0.0, exposed=12.09, comm=12.09,
        ulysses=12.09, ring=0.0, memory=0.0, overlappable=0.0, flops=2**28, steps=1,
    )  # fmt: skip
    check_phase(
        p.backward, total=20.01 + 12.09, compute=20.01, imbalance=0.0, exposed=12.09,
        comm=12.09, ulysses=12.09, ring=0.0, memory=0.0, overlappable=0.0, flops=2.5 * 2**28,
        steps=1,
    )  # fmt: skip
    q, kv = ("all_to_all", 196608.0), ("all_to_all", 393216.0)
    assert hops(p, "forward") == [q, kv, q]
    assert hops(p, "backward") == [q, q, kv]


def test_usp_forward_and_backward_by_hand() -> None:
    # U = 2, R = 2, L = 512, 2 heads (MHA), zigzag: ring shard n = 256 (2^24 FLOP/ms), S = 128
    # tokens per rank, one query and one KV head per rank after the exchange.
    p = predict(
        MeshCandidate(seq_len=512, heads=2, kv_heads=2, head_dim=128, ulysses=2, ring=2),
        HAND, memory=False,
    )  # fmt: skip
    # All-to-alls over 2 ranks send half of what is handed in: Q and O 128 x 2 x 128 / 2 x 2 B
    # = 32768 B (0.03 + 0.5 ms), K/V 65536 B (0.03 + 1 ms): 2.09 ms per pass.
    # Ring (k = 2): K/V chunk 2 x 256 x (2/2) x 128 x 2 B = 131072 B (1.02 ms); dK/dV 2.02 ms.
    # Forward steps: 1 + 0.01 = 1.01 ms; 1 + 0.01 + merge (7 x 256 x 1 x 128 x 4 B: 0.07) = 1.08.
    #   step 0: max(1.01, 1.02) + 0.505 = 1.525; step 1: 1.08. Ring 2.605, exposed 0.515.
    # Mean rank: (L^2/2) x 4 x 2 x 128 / 4 ranks = 2^25 FLOPs = 2 ms + 0.02 + 0.07 = 2.09.
    check_phase(
        p.forward, total=2.09 + 2.605, compute=2.09, imbalance=0.0, exposed=2.09 + 0.515,
        comm=2.09 + 1.02, ulysses=2.09, ring=1.02, memory=0.07, overlappable=1.01,
        flops=2 * 32768 * 512, steps=2,
    )  # fmt: skip
    # Backward steps 2.5 + 0.01 + 0.17 = 2.68 ms each:
    #   step 0: K/V 1.02: 2.68 + 0.51 = 3.19; step 1: nothing in flight (the only dK/dV
    #   accumulator is posted after step 1): 2.68; home 2.02. Ring 7.89, exposed 2.53.
    check_phase(
        p.backward, total=2.09 + 7.89, compute=5.36, imbalance=0.0, exposed=2.09 + 2.53,
        comm=2.09 + 3.04, ulysses=2.09, ring=3.04, memory=0.34, overlappable=1.02,
        flops=2 * 32768 * 512 * 2.5, steps=2,
    )  # fmt: skip
    assert hops(p, "backward") == [
        ("all_to_all", 32768.0), ("all_to_all", 32768.0), ("all_to_all", 65536.0),
        ("send_recv", KV_HOP), ("send_recv", DKV_HOP),
    ]  # fmt: skip


def test_all_gather_one_stride_by_hand() -> None:
    p = ring("zigzag", cp_comm="all_gather")
    # R = 4 as above, K/V all-gathered in one stride: the rank's own total work, 4 x 32768
    # pairs x 512 = 2^26 FLOPs = 4 ms, + 4 step overheads + 3 forward merges = 4.25 ms; the own
    # chunk is 1/4 of it (1.0625 ms). The gather receives 3 chunks, 393216 B, priced on the
    # all-to-all cost: 0.03 + 6 = 6.03 ms.
    #   gather behind the own chunk: max(1.0625, 6.03) + 0.5 x 1.0625 = 6.56125
    #   the rest of the stride, nothing in flight: 4.25 - 1.0625 = 3.1875
    # total 9.74875, exposed 9.74875 - 4.25 = 5.49875.
    check_phase(
        p.forward, total=9.74875, compute=4.25, imbalance=0.0, exposed=5.49875, comm=6.03,
        ulysses=0.0, ring=6.03, memory=0.21, overlappable=1.0625, flops=2**26, steps=4,
    )  # fmt: skip
    # Backward: 10 + 0.04 + 4 x 0.17 = 10.72 ms, own 2.68; the gather again (6.03) and the
    # reduce-scatter of 3 fp32 chunks, 786432 B: 0.03 + 12 = 12.03 ms, exposed.
    #   max(2.68, 6.03) + 0.5 x 2.68 = 7.37; rest 8.04; reduce-scatter 12.03: total 27.44.
    check_phase(
        p.backward, total=27.44, compute=10.72, imbalance=0.0, exposed=16.72, comm=18.06,
        ulysses=0.0, ring=18.06, memory=0.68, overlappable=2.68, flops=2.5 * 2**26, steps=4,
    )  # fmt: skip
    assert hops(p, "backward") == [("all_to_all", 393216.0), ("all_to_all", 786432.0)]


def test_all_gather_two_strides_by_hand() -> None:
    # 2 query and 2 KV heads, one KV head per gather: G = 2 strides. Work doubles (1024 FLOPs
    # a pair): 2^27 FLOPs = 8 ms, + 2 strides x 4 steps of overhead (0.08) + 3 forward merges
    # of 7 x 256 x 2 x 128 x 4 B = 14 x 2^17 B (0.14 each): 8.5 ms, 4.25 per stride, own 1.0625.
    # A gather of one stride: 3 chunks of 2 x 256 x 1 x 128 x 2 B = 393216 B: 6.03 ms.
    p = ring("zigzag", cp_comm="all_gather", heads=2, kv_heads=2, heads_k_stride=1)
    # cpbench's forward (attention/allgather.py) computes each stride's own chunk while that
    # stride's gather travels, and posts stride g + 1's gather after stride g's own chunk: it
    # travels during the rest of stride g and the own chunk of stride g + 1, one stride long.
    #   first gather behind stride 0's own chunk: 6.03 + 0.5 x 1.0625 = 6.56125
    #   the rest of stride 0 and stride 1's own chunk (4.25) with stride 1's gather in flight:
    #   6.03 + 0.5 x 4.25 = 8.155
    #   the rest of stride 1, nothing in flight: 3.1875
    # total 17.90375, exposed 9.40375; hidden 1.0625 + 4.25.
    check_phase(
        p.forward, total=17.90375, compute=8.5, imbalance=0.0, exposed=9.40375, comm=12.06,
        ulysses=0.0, ring=12.06, memory=0.42, overlappable=5.3125, flops=2**27, steps=8,
    )  # fmt: skip
    # Backward: 20 + 0.08 + 4 x (3 x 65536 + 7 x 131072) x 4 B = 4 x 34 x 2^17 B = 4 x 0.34 ms:
    # 21.44 ms, 10.72 per stride, own 2.68; a reduce-scatter of one stride 786432 B: 12.03 ms.
    #   first gather: 6.03 + 0.5 x 2.68 = 7.37
    #   rest of stride 0 (8.04) with stride 1's gather (6.03): 8.04 + 3.015 = 11.055
    #   stride 1 (10.72) with stride 0's reduce-scatter (12.03): 12.03 + 5.36 = 17.39
    #   stride 1's reduce-scatter, exposed: 12.03
    # total 47.845, exposed 26.405; comm 2 x 6.03 + 2 x 12.03 = 36.12; hidden 2.68 + 6.03 + 10.72.
    check_phase(
        p.backward, total=47.845, compute=21.44, imbalance=0.0, exposed=26.405, comm=36.12,
        ulysses=0.0, ring=36.12, memory=1.36, overlappable=19.43, flops=2.5 * 2**27, steps=8,
    )  # fmt: skip
    gather, scatter = ("all_to_all", 393216.0), ("all_to_all", 786432.0)
    assert hops(p, "backward") == [gather, gather, scatter, scatter]


# ------------------------------------------------------------------------------ inference

# The request: 4 query heads, 1 KV head (FLOPs 4 B H D = 2048 a pair), d 128, bf16; a prefill
# of T = 256 new tokens on P = 768 cached, W = 4 ranks (one node: the intra-node links).
# Zigzag sharding: T in 8 chunks of 32, rank r holds chunks r and 7 - r (64 tokens), and 192
# cached tokens: a K/V chunk of 256 tokens (kernel at 256: 2^24 FLOP/ms). A run of n = 32 new
# queries from offset s sees n P + n s + n (n + 1)/2 pairs: per rank 2 x 24576 + 32 x (32 r +
# 32 (7 - r)) + 2 x 528 = 57376 pairs, the same on every rank.
REQUEST = CpProblem(seq_len=1024, heads=4, kv_heads=1, head_dim=128)
P, T, W = 768, 256, 4


def test_prefill_pass_kv_by_hand() -> None:
    price = price_prefill("pass_kv", P, T, REQUEST, W, HAND)
    # A step: 57376 x 2048 / 4 steps / 2^24 = 1.7509765625 ms. A K/V hop: 256 x 2 x 1 x 128
    # x 2 B = 131072 B: 0.02 + 1 = 1.02 ms.
    #   3 steps with a hop: max(1.7509765625, 1.02) + 0.5 x 1.02 = 2.2609765625 each
    #   the last step: 1.7509765625
    # ring 8.53390625, + 4 step overheads (0.04); compute 4 x 1.7509765625 = 7.00390625
    assert price.step_s == ms(1.7509765625)
    assert price.hop_s == ms(1.02)
    assert price.compute_s == ms(7.00390625)
    assert price.exposed_comm_s == ms(1.53)
    assert price.overhead_s == ms(0.04)
    assert price.tail_s == 0.0
    assert price.total_s == ms(8.57390625)
    assert price.bytes_sent == {"p2p_kv": 3 * 131072}


def test_prefill_pass_q_by_hand() -> None:
    price = price_prefill("pass_q", P, T, REQUEST, W, HAND)
    # The query block: 64 x 4 x 128 x 2 B = 65536 B: a hop 0.02 + 0.5 = 0.52 ms.
    #   3 steps: 1.7509765625 + 0.5 x 0.52 = 2.0109765625 each; the last 1.7509765625
    # ring 7.78390625. Then the 3 foreign partial outputs (3 x 65536 B) and LSEs (3 x 4 x 64 x
    # 4 B = 3072 B) go home in two all-to-alls: 0.06 + 199680 / 65536 = 3.106875 ms, exposed.
    assert price.step_s == ms(1.7509765625)
    assert price.hop_s == ms(0.52)
    assert price.tail_s == ms(3.106875)
    assert price.exposed_comm_s == ms(0.78 + 3.106875)
    assert price.total_s == ms(7.78390625 + 3.106875 + 0.04)
    assert price.bytes_sent == {"p2p_q": 196608, "a2a_out": 196608, "a2a_lse": 3072}


def test_prefill_all_gather_by_hand() -> None:
    price = price_prefill("all_gather", P, T, REQUEST, W, HAND)
    # One kernel over all 1024 keys (2^25 FLOP/ms): 57376 x 2048 / 2^25 = 3.501953125 ms; the
    # own chunk is 256 / 1024 of it, 0.87548828125. The gather of 3 chunks, 393216 B on the
    # all-to-all cost: 0.03 + 6 = 6.03 ms, behind the own chunk:
    #   max(0.87548828125, 6.03) + 0.5 x 0.87548828125 = 6.467744140625
    # then the rest, 2.62646484375, and two kernel overheads: total 9.114208984375.
    assert price.compute_s == ms(3.501953125)
    assert price.exposed_comm_s == ms(5.592255859375)
    assert price.overhead_s == ms(0.02)
    assert price.total_s == ms(9.114208984375)
    assert price.bytes_sent == {"allgather_kv": 393216}


def test_prefill_ulysses_by_hand() -> None:
    price = price_prefill("ulysses", P, T, REQUEST, W, HAND)
    # The whole causal prefill on 1 head per rank: (T P + T (T + 1)/2) = 229504 pairs x 2048 / 4
    # ranks at 2^25 FLOP/ms = 3.501953125 ms. The exchange hands in the padded shards and sends
    # 3/4: Q 64 x 4 x 128 x 2 B = 65536 -> 49152 B; K/V with the KV head copied onto 4 ranks,
    # 256 x 2 x 4 x 128 x 2 B = 524288 -> 393216 B; O 49152 B. Q and K/V: two calls, 0.06 +
    # 442368 / 65536 = 6.81 ms; O: 0.03 + 0.75 = 0.78 ms. Total 3.501953125 + 7.59 + 0.01.
    assert price.compute_s == ms(3.501953125)
    assert price.exposed_comm_s == ms(7.59)
    assert price.total_s == ms(11.101953125)
    assert price.bytes_sent == {"a2a_q": 49152, "a2a_kv": 393216, "a2a_out": 49152}
    # Were the cache head-sharded, only the new tokens' K/V would travel: 64 x 2 x 4 x 128 x
    # 2 B = 131072 -> 98304 B: 0.06 + 147456 / 65536 = 2.31 ms, + 0.78: 3.09 ms.
    assert price.head_sharded_cache_s == ms(3.501953125 + 3.09 + 0.01)


@pytest.mark.parametrize(
    ("kv_heads", "merge", "total"),
    [
        # compute-bound (1 KV head): 0.03125 ms kernel > 0.01 ms read
        (1, "all_gather", 0.03125 + 0.107607421875 + 0.01),
        (1, "all_to_all", 0.03125 + 0.07190185546875 + 0.01),
        # memory-bound (4 KV heads): 0.04 ms read > 0.03125 ms kernel
        (4, "all_gather", 0.04 + 0.107607421875 + 0.01),
        (4, "all_to_all", 0.04 + 0.07190185546875 + 0.01),
    ],
)
def test_decode_by_hand(kv_heads: int, merge: str, total: float) -> None:
    problem = CpProblem(seq_len=1024, heads=4, kv_heads=kv_heads, head_dim=128)
    price = price_decode(1024, problem, W, HAND, merge=merge)  # type: ignore[arg-type]
    # A rank holds 256 of the 1024 cached tokens: 256 x 2 x h_kv x 128 x 2 B = 131072 h_kv B,
    # read at 2^17 B per 0.01 ms: 0.01 h_kv ms. Its kernel: 256 keys x 2048 FLOPs at 2^24
    # FLOP/ms = 0.03125 ms. The step takes the longer, then the merge, then one overhead.
    assert price.shard_bytes == 131072 * kv_heads
    assert price.memory_s == ms(0.01 * kv_heads)
    assert price.compute_s == ms(0.03125)
    # The merge, two calls on the all-to-all cost: all_gather receives the 3 other partial
    # outputs (4 x 128 x 2 B = 1024 B each) and LSEs (4 x 4 B): 3120 B, 0.06 + 3120 / 65536 =
    # 0.107607421875 ms; all_to_all sends 3/4 of its own: 768 + 12 = 780 B, 0.07190185546875.
    sent = {"all_gather": {"allgather_out": 3072, "allgather_lse": 48},
            "all_to_all": {"a2a_out": 768, "a2a_lse": 12}}[merge]  # fmt: skip
    assert price.bytes_sent == sent
    comm = 0.107607421875 if merge == "all_gather" else 0.07190185546875
    assert price.comm_s == ms(comm)
    assert price.overhead_s == ms(0.01)
    assert price.total_s == ms(total)


def test_the_all_gather_prefill_runs_the_overlap_it_is_priced_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The all-gather prefill is priced with its gather behind the own chunk's work (above):
    cpbench's scheme computes the own chunk after posting the gather and before waiting for
    it, then the other chunks."""
    import torch  # noqa: PLC0415

    from cpbench.attention import inference as scheme  # noqa: PLC0415

    events: list[str] = []

    class Pending:
        def wait(self) -> list[torch.Tensor]:
            events.append("wait")
            return [torch.zeros(1, 4, 2, 1, 8)] * 2

    def post(*args: object, **kwargs: object) -> Pending:
        events.append("post")
        return Pending()

    def attend(
        kernel: object, q: object, runs: object, chunk: object, owner: int, *rest: object
    ) -> None:
        events.append(f"chunk {owner}")

    monkeypatch.setattr(scheme, "all_gather_chunks", post)
    monkeypatch.setattr(scheme, "_attend_chunk", attend)
    mesh = type("Mesh", (), {"world": 2, "rank": 1, "ring_group": None})()
    shards = scheme._Shards(4, 4, 2, "zigzag")  # rank 1: 2 cached + 2 new tokens
    q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 4, 2, 1, 8)
    scheme._pass_kv(q, kv, mesh, shards, None, 1.0, gather=True)  # type: ignore[arg-type]
    assert events == ["post", "chunk 1", "wait", "chunk 0"]
