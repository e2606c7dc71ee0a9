"""The plan's time model against a measured CPU training step of a tiny model.

A 2-layer, hidden-256 Llama-like model (RMSNorm, Q/K/V/O linears, causal SDPA with GQA,
SwiGLU MLP, untied output projection, cross-entropy) is built with torch, one forward + backward
step is timed on one thread (best of a few), and compared with `cpbench.model.plan.step` on the
`cpu-local` profile (one rank = one core). The matmul part is measured as the step with the
attention kernel replaced by a pass-through (every linear, norm and the loss still run); the
attention part as the SDPA forward + backward alone on the same shapes, once per layer.

What each check checks, and its tolerance (no fixed factor: each is 3 standard deviations in
log space of the model's stated error and the measurement's spread, half the log range of the
repeats):

- **matmul part** against the uncalibrated `cpu-local` prior, whose stated accuracy is
  `cpbench.model.ties.PRIOR_RELATIVE_ERROR` (one standard deviation);
- **whole step**, the prior's GEMMs with the attention rate below, to the same accuracy;
- **attention part** with the kernel rate measured independently, on the same SDPA with half the
  heads (the profile's curve replaced by that measured efficiency): what it checks is the plan's
  attention accounting (FLOPs linear in the heads, forward + backward, times the layers, the
  cost model's step overhead), the model's stated error `ATTENTION_ACCOUNTING_ERROR`. The
  prior's own CPU attention curve is not checked here (`cpbench calibrate` fits it).

The numbers are printed (`pytest -s`) so they can be quoted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate
from cpbench.model.cost.prediction import predict
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import EfficiencyCurve
from cpbench.model.plan.memory import Parallelism
from cpbench.model.plan.step import step_time_of_layer
from cpbench.model.plan.transformer import ModelSpec
from cpbench.model.ties import PRIOR_RELATIVE_ERROR

TINY = ModelSpec("tiny", 256, 2, 4, 2, 64, 688, "swiglu", 2048, source="test preset")
SEQ_LEN = 2048
REPEATS = 5
SIGMAS = 3.0
"""Tolerance in standard deviations (log space)."""
ATTENTION_ACCOUNTING_ERROR = 0.10
"""Stated error (one standard deviation, relative) of the attention accounting once the kernel
rate is measured: the CPU kernel's rate at 4 heads vs the 2 it is measured on (estimate)."""


class Layer(nn.Module):
    def __init__(self, m: ModelSpec, attention: bool) -> None:
        super().__init__()
        self.m, self.attention = m, attention
        self.norm1, self.norm2 = nn.RMSNorm(m.hidden), nn.RMSNorm(m.hidden)
        self.qkv = nn.Linear(m.hidden, m.q_width + 2 * m.kv_width, bias=False)
        self.out = nn.Linear(m.q_width, m.hidden, bias=False)
        self.gate_up = nn.Linear(m.hidden, 2 * m.ffn_hidden, bias=False)
        self.down = nn.Linear(m.ffn_hidden, m.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([m.q_width, m.kv_width, m.kv_width], dim=-1)
        q = q.view(b, s, m.heads, m.head_dim).transpose(1, 2)
        if self.attention:
            k = k.view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
            v = v.view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
            group = m.heads // m.kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = q + 0.0 * (k.sum() + v.sum())  # keeps K/V in the graph, no attention kernel
        x = x + self.out(o.transpose(1, 2).reshape(b, s, m.q_width))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Tiny(nn.Module):
    def __init__(self, m: ModelSpec, attention: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleList(Layer(m, attention) for _ in range(m.layers))
        self.norm = nn.RMSNorm(m.hidden)
        self.head = nn.Linear(m.hidden, m.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


def _timed(*fns: Callable[[], None]) -> list[tuple[float, float]]:
    """Per function, (best time, spread: half the log range of the repeats, a standard
    deviation proxy). The functions run interleaved, one repeat of each per round, so a slow
    spell of a shared machine slows every one of them alike instead of one alone (the test
    compares their ratios)."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(REPEATS):
        for fn, spent in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [(min(t), math.log(max(t) / min(t)) / 2) for t in times]


def _step(model: nn.Module, tokens: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        model(tokens).backward()

    return run


def _attention_only(m: ModelSpec, heads: int | None = None) -> Callable[[], None]:
    shape = (1, heads or m.heads, SEQ_LEN, m.head_dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))

    def run() -> None:
        for _ in range(m.layers):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(torch.ones_like(out))

    return run


def _bound(model_error: float, spread: float) -> float:
    """SIGMAS standard deviations of log(predicted / measured)."""
    return SIGMAS * math.hypot(math.log1p(model_error), spread)


def test_time_model_against_a_measured_cpu_step() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # cpu-local: one rank computes on one core
    try:
        torch.manual_seed(0)
        tokens = torch.randint(0, TINY.vocab, (1, SEQ_LEN))
        full, matmul, attention, half = _timed(
            _step(Tiny(TINY), tokens),
            _step(Tiny(TINY, attention=False), tokens),
            _attention_only(TINY),
            _attention_only(TINY, TINY.heads // 2),
        )
    finally:
        torch.set_num_threads(threads)

    profile = load_profile("cpu-local")

    def candidate(heads: int) -> MeshCandidate:
        return MeshCandidate.for_shape(
            shape=AttentionShape(SEQ_LEN, heads, TINY.kv_heads, TINY.head_dim, 1), ulysses=1,
            ring=1, layout="contiguous", dtype="float32", causal=True, kv_replication=None,
            phase="fwd+bwd", kernel="auto",
        )

    prediction = predict(candidate(TINY.heads), profile, 1)
    par = Parallelism(tp=1, ulysses=1, ring=1, pp=1, dp=1)
    predicted = step_time_of_layer(TINY, par, SEQ_LEN, prediction.forward.total_s,
                                   prediction.backward.total_s, profile, 1, "float32")
    # the kernel rate measured on half the heads: the efficiency that reproduces that time
    halved = predict(candidate(TINY.heads // 2), profile, 1)
    per_layer = half[0] / TINY.layers
    efficiency = profile.curve().at(SEQ_LEN) * halved.step_s / per_layer
    measured_curve = EfficiencyCurve((SEQ_LEN,), (efficiency,), "measured on 2 heads")
    others = [f for f in profile.kernels.given if f != profile.default_kernel]
    only: dict[str, Any] = {f: None for f in others}  # the measured curve only
    kernels = replace(profile.kernels, **only, **{profile.default_kernel: measured_curve})
    calibrated = replace(profile, kernels=kernels)
    rated = predict(candidate(TINY.heads), calibrated, 1)
    accounted = step_time_of_layer(TINY, par, SEQ_LEN, rated.forward.total_s,
                                   rated.backward.total_s, calibrated, 1, "float32")
    rows = {
        "matmul part (step without attention), prior": (predicted.gemm_s, matmul,
                                                        PRIOR_RELATIVE_ERROR),
        "whole step (prior GEMMs, attention rate measured on 2 heads)": (
            accounted.total_s, full, PRIOR_RELATIVE_ERROR),
        "attention part (SDPA fwd+bwd x layers), rate measured on 2 heads": (
            accounted.attention_s, attention, ATTENTION_ACCOUNTING_ERROR),
    }
    print()
    print(f"(prior's own attention part: predicted {predicted.attention_s * 1e3:.1f} ms, "
          f"measured {attention[0] * 1e3:.1f} ms: not checked, calibrate fits it)")
    for name, (model_s, (measured_s, spread), error) in rows.items():
        print(
            f"{name}: predicted {model_s * 1e3:.1f} ms, measured {measured_s * 1e3:.1f} ms "
            f"(spread {spread:.2f}), error {model_s / measured_s - 1:+.0%}, allowed "
            f"x/{math.exp(_bound(error, spread)):.2f}"
        )
    for name, (model_s, (measured_s, spread), error) in rows.items():
        assert abs(math.log(model_s / measured_s)) <= _bound(error, spread), (
            name, model_s, measured_s, spread)
