"""The attention a plan is priced for (the framework the user trains with) and the precision of
its linear layers: docs/plan.md, "The framework's attention and FP8 linears". Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from cpbench.config.problem import check_choice
from cpbench.config.vocabulary import CpComm
from cpbench.errors import CpbenchError

Framework = Literal["cpbench", "torchtitan", "megatron", "deepspeed"]
"""What the plan's attention is priced as."""
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)
LinearPrecision = Literal["bf16", "fp8"]
"""Precision of the linear layers' GEMMs."""
LINEAR_PRECISIONS: tuple[LinearPrecision, ...] = get_args(LinearPrecision)


@dataclass(frozen=True)
class FrameworkAttention:
    """How one framework runs CP attention, in the cost model's terms."""

    framework: Framework
    ulysses: bool
    """Whether it runs Ulysses (all-to-all) groups."""
    ring: bool
    """Whether it runs a ring (or all-gather) axis."""
    cp_comm: CpComm
    """How its ring axis exchanges K/V (p2p or all_gather)."""
    layouts: tuple[str, ...]
    """Token layouts it runs, preferred first."""
    kernel: str
    """The attention kernel (cpbench's kernel names; auto = the profile's default)."""
    factor: float
    """Prior: its attention time / the cost model's for the same scheme and kernel."""
    source: str
    """Where the mapping and the factor come from."""


_PRIOR = ("prior factor 1.0: no measured ratio shipped; pass the one `cpbench sweep` measures "
          "on the impl axis with --attention-factor")

FRAMEWORK_ATTENTION: dict[str, FrameworkAttention] = {
    "cpbench": FrameworkAttention(
        "cpbench", True, True, "p2p", ("zigzag", "striped", "contiguous"), "auto", 1.0,
        "cpbench's own schemes: the cost model prices them",
    ),
    "torchtitan": FrameworkAttention(
        "torchtitan", False, True, "all_gather", ("zigzag",), "cuda_sdpa", 1.0,
        "PyTorch context_parallel as torchtitan runs it: ring only, head-tail load balancing "
        "(zigzag), K/V all-gathered (the default rotate method; cpbench/impls/torch_cp.py), "
        f"SDPA kernels; {_PRIOR}",
    ),
    "megatron": FrameworkAttention(
        "megatron", True, True, "p2p", ("zigzag",), "cudnn", 1.0,
        "Megatron-Core + TransformerEngine: cp_comm_type p2p / a2a / a2a+p2p, zigzag (2 x CP "
        f"chunks), cuDNN fused attention; {_PRIOR}",
    ),
    "deepspeed": FrameworkAttention(
        "deepspeed", True, False, "p2p", ("zigzag",), "flash_attn", 1.0,
        f"DeepSpeed-Ulysses: all-to-all over the sequence-parallel group only; {_PRIOR}",
    ),
}
"""Each framework's CP attention."""

FP8_LINEAR_SPEEDUP = 1.5
"""GEMM rate of FP8 linears / bf16 linears (estimate: H100's dense FP8 peak is 2x its bf16 peak
(NVIDIA H100 datasheet: 1,979 vs 989 TFLOP/s SXM, dense); per-tensor scaling, the casts and the
amax reductions take part of it; checked against torchtitan's Table 1 Float8 row in
cpbench/data/published/end_to_end.toml)."""


def framework_attention(framework: str) -> FrameworkAttention:
    """A framework's attention; CpbenchError naming the frameworks otherwise."""
    return FRAMEWORK_ATTENTION[check_choice("framework", framework, FRAMEWORKS)]


def linear_speedup(precision: str) -> float:
    """GEMM rate of the linears over bf16 ones; CpbenchError on an unknown precision."""
    fp8 = check_choice("linear precision", precision, LINEAR_PRECISIONS) == "fp8"
    return FP8_LINEAR_SPEEDUP if fp8 else 1.0


def check_attention_factor(value: float | None) -> float | None:
    """A measured attention factor: > 0 (None: the framework's prior)."""
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise CpbenchError(f"attention factor must be > 0, got {value!r}")
    return value
