"""The kernel calls a packed document mask adds (`work.extra_calls`), what the cost model
charges for them (the profile's call overhead), how calibration fits it, and how a dynamic-CP
pack is priced with it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cpbench.config.geometry import ring_schedule
from cpbench.config.problem import MeshCandidate
from cpbench.model.calibrate import fit_profile
from cpbench.model.cost.prediction import predict
from cpbench.model.cost.work import extra_calls
from cpbench.model.dynamic import DynamicProblem
from cpbench.model.dynamic.schedule import SequenceCosts, priced_group
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import EfficiencyCurve, HardwareProfile
from cpbench.model.hardware.transforms import with_curve, with_table
from tests.synthetic import synthetic_record

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)


def _packed(documents: tuple[int, ...], ulysses: int, ring: int) -> MeshCandidate:
    layout = "doc_zigzag" if ring > 1 else "contiguous"
    return MeshCandidate(
        seq_len=sum(documents), heads=8, kv_heads=8, head_dim=64, dtype="float32",
        ulysses=ulysses, ring=ring, layout=layout, documents=documents,
    )  # fmt: skip


@pytest.mark.parametrize("ulysses,ring", [(1, 4), (2, 2), (4, 1), (1, 2)])
def test_extra_calls_are_the_schedules_calls_beyond_one_documents(ulysses: int, ring: int) -> None:
    # one document adds nothing; every further equal document adds the same calls per step
    # (each is cut over every ring rank alike), counted independently from the pieces
    unit = 16 * ring * ulysses
    assert not any(b or m for b, m in extra_calls(_packed((unit,), ulysses, ring)))
    increments = []
    for n in range(2, 6):
        pack = _packed((unit,) * n, ulysses, ring)
        pieces = ring_schedule(pack.packing).pieces
        one = ring_schedule(_packed((unit,), ulysses, ring).packing).pieces
        expected = tuple(
            (max(len(row[t]) for row in pieces) - max(len(row[t]) for row in one),
             (sum(len(row[t]) for row in pieces) - sum(len(row[t]) for row in one)) / ring)
            for t in range(len(pieces[0]))
        )  # fmt: skip
        calls = extra_calls(pack)
        assert calls == expected[: len(calls)]
        increments.append(sum(b for b, _ in calls))
    steps = [b - a for a, b in zip(increments, increments[1:], strict=False)]
    assert len(set(steps)) == 1 and steps[0] > 0


def test_the_call_overhead_adds_its_calls_to_a_step() -> None:
    # Ulysses (no ring to hide anything behind) on a GPU profile (no shared compute slots):
    # the step grows by exactly calls x overhead, the calls those of both passes
    h100 = load_profile("h100-sxm")
    pack = _packed((2048, 1024, 512, 512), 4, 1)
    base = predict(pack, h100, memory=False)
    priced = predict(pack, with_table(h100, "overheads", call_overhead_s=20e-6), memory=False)
    calls = sum(b for b, _ in extra_calls(pack))
    assert calls == 3  # one call per document, one of them in the baseline
    assert base.phase_time.calls == 2 * calls  # forward and backward
    assert priced.step_s - base.step_s == pytest.approx(2 * calls * 20e-6, rel=1e-9)
    plain = replace(pack, documents=None, layout="contiguous")
    assert predict(plain, h100).step_s == predict(
        plain, with_table(h100, "overheads", call_overhead_s=20e-6)).step_s


def _truth_with_calls() -> HardwareProfile:
    cpu = load_profile("cpu-local")
    truth = with_table(cpu, "overheads", step_overhead_s=2e-3, call_overhead_s=150e-6)
    curve = EfficiencyCurve((128, 256, 512, 1024, 2048), (0.1, 0.2, 0.3, 0.35, 0.4))
    return with_curve(truth, truth.default_kernel, curve)


def test_calibration_recovers_a_planted_call_overhead_without_bending_the_curve() -> None:
    truth = _truth_with_calls()
    rng = random.Random(3)
    plain = [
        synthetic_record(MeshCandidate(seq_len=L, heads=8, kv_heads=8, head_dim=64,
                                       dtype="float32", ulysses=u, ring=r), truth, 4, rng=rng)
        for L in (512, 1024, 2048) for u, r in ((1, 4), (2, 2), (4, 1))
    ]  # fmt: skip
    packed = [
        synthetic_record(_packed(docs, u, r), truth, 4, rng=rng)
        for docs in ((256, 128, 64, 64), (512, 256, 128, 64, 64, 32, 32, 32, 96, 64, 736))
        for u, r in ((1, 4), (2, 2), (4, 1))
    ]
    alone = fit_profile(plain, "cpu-local").profile
    both = fit_profile(plain + packed, "cpu-local").profile
    # tolerance: 10% (the ridge towards the prior's 500 us biases the step overhead 2-3% low,
    # and the packs' steps carry that bias into their calls: 158 us here)
    assert both.call_overhead_s == pytest.approx(150e-6, rel=0.10)
    assert alone.call_overhead_s == load_profile("cpu-local").call_overhead_s  # the prior's
    for n in (128, 256, 512, 1024, 2048):  # the packs do not shape the kernel curve
        assert both.curve().at(n) * both.peak_flops("float32") == pytest.approx(
            alone.curve().at(n) * alone.peak_flops("float32"), rel=1e-6)


def test_a_packs_price_has_each_further_sequences_calls() -> None:
    # n equal sequences in one group: n - 1 further sequences, each call_s
    cpu = with_table(load_profile("cpu-local"), "overheads", call_overhead_s=100e-6)
    problem = DynamicProblem((256,) * 6, 4, 512, 4, 4, 32, "float32", static_cp=4)
    with_calls, without = SequenceCosts(problem, cpu), SequenceCosts(
        problem, with_table(cpu, "overheads", call_overhead_s=0.0))
    for degree, scheme in ((4, "ring"), (4, "ulysses"), (2, "ring"), (1, "ring")):
        call_s = with_calls.call_s(degree, scheme)
        assert call_s > 0
        for n in (1, 3, 6):
            ids = list(range(n))
            gained = (priced_group(with_calls, degree, scheme, ids).predicted_s
                      - priced_group(without, degree, scheme, ids).predicted_s)  # fmt: skip
            assert gained == pytest.approx((n - 1) * call_s, rel=1e-9, abs=1e-12)
    # a whole pack of six on the ring of 4 against `predict` of it: within 10%
    pack = _packed((256,) * 6, 1, 4)
    whole = predict(replace(pack, heads=4, kv_heads=4, head_dim=32), cpu, memory=False).step_s
    priced = priced_group(with_calls, 4, "ring", list(range(6))).predicted_s
    assert priced == pytest.approx(whole, rel=0.10)
