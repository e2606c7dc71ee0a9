"""The plan's time model against a measured CPU training step of a tiny model.

A 2-layer, hidden-256 Llama-like model (RMSNorm, Q/K/V/O linears, causal SDPA with GQA,
SwiGLU MLP, untied output projection, cross-entropy) is built with torch, one forward + backward
step is timed on one thread (best of a few), and compared with `cpbench.model.plan.step` on the
`cpu-local` profile (one rank = one core). The matmul part is measured as the step with the
attention kernel replaced by a pass-through (every linear, norm and the loss still run); the
attention part as the SDPA forward + backward alone on the same shapes, once per layer.

The `cpu-local` profile is an uncalibrated prior (estimates), so the bound is loose: each part
within 5x of its measurement. The numbers are printed (`pytest -s`) so they can be quoted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate
from cpbench.model.cost.prediction import predict
from cpbench.model.hardware.loading import load_profile
from cpbench.model.plan.memory import Parallelism
from cpbench.model.plan.step import step_time
from cpbench.model.plan.transformer import ModelSpec

TINY = ModelSpec("tiny", 256, 2, 4, 2, 64, 688, "swiglu", 2048, source="test preset")
SEQ_LEN = 2048
BOUND = 5.0
"""Each part within this factor of its measurement (the cpu-local profile is a prior)."""
REPEATS = 3


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


def _best(fn: Callable[[], None]) -> float:
    fn()  # warm-up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _step(model: nn.Module, tokens: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        model(tokens).backward()

    return run


def _attention_only(m: ModelSpec) -> Callable[[], None]:
    shape = (1, m.heads, SEQ_LEN, m.head_dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))

    def run() -> None:
        for _ in range(m.layers):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(torch.ones_like(out))

    return run


def test_time_model_against_a_measured_cpu_step() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # cpu-local: one rank computes on one core
    try:
        torch.manual_seed(0)
        tokens = torch.randint(0, TINY.vocab, (1, SEQ_LEN))
        full = _best(_step(Tiny(TINY), tokens))
        matmul = _best(_step(Tiny(TINY, attention=False), tokens))
        attention = _best(_attention_only(TINY))
    finally:
        torch.set_num_threads(threads)

    profile = load_profile("cpu-local")
    shape = AttentionShape(SEQ_LEN, TINY.heads, TINY.kv_heads, TINY.head_dim, 1)
    prediction = predict(
        MeshCandidate.for_shape(shape=shape, ulysses=1, ring=1, layout="contiguous", dtype="float32", causal=True, kv_replication=None, phase="fwd+bwd", kernel="auto"),
        profile, 1,
    )
    par = Parallelism(tp=1, ulysses=1, ring=1, pp=1, dp=1)
    predicted = step_time(TINY, par, SEQ_LEN, prediction, profile, 1, "float32")
    rows = {
        "matmul part (step without attention)": (predicted.gemm_s, matmul),
        "attention part (SDPA fwd+bwd x layers)": (predicted.attention_s, attention),
        "whole step": (predicted.total_s, full),
    }
    print()
    for name, (model_s, measured_s) in rows.items():
        print(
            f"{name}: predicted {model_s * 1e3:.1f} ms, measured {measured_s * 1e3:.1f} ms, "
            f"error {model_s / measured_s - 1:+.0%}"
        )
    for name, (model_s, measured_s) in rows.items():
        ratio = model_s / measured_s
        assert 1 / BOUND <= ratio <= BOUND, (name, model_s, measured_s)
