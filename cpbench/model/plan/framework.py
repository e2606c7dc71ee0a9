"""The attention a plan is priced for (the framework the user trains with) and the precision of
its linear layers: docs/plan.md, "The framework's attention and FP8 linears". Pure Python."""

from __future__ import annotations

import sys
from importlib import resources
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from cpbench.config.file_schema import FileModel
from cpbench.config.vocabulary import CpComm
from cpbench.errors import CpbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Framework = Literal["cpbench", "torchtitan", "megatron", "deepspeed"]
"""What the plan's attention is priced as."""
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)
LinearPrecision = Literal["bf16", "fp8"]
"""Precision of the linear layers' GEMMs."""
LINEAR_PRECISIONS: tuple[LinearPrecision, ...] = get_args(LinearPrecision)


class FrameworkAttention(FileModel):
    """How one framework runs CP attention, in the cost model's terms."""

    framework: Framework
    """The framework."""
    ulysses: bool
    """Whether it runs Ulysses (all-to-all) groups."""
    ring: bool
    """Whether it runs a ring (or all-gather) axis."""
    cp_comm: CpComm
    """How its ring axis exchanges K/V (p2p or all_gather)."""
    layouts: Annotated[tuple[str, ...], Field(strict=False)]
    """Token layouts it runs, preferred first."""
    kernel: str
    """The attention kernel (cpbench's kernel names; auto = the profile's default)."""
    factor: Annotated[float, Field(gt=0)]
    """Prior: its attention time / the cost model's for the same scheme and kernel."""
    source: str
    """Where the mapping and the factor come from."""


class Fp8Linears(FileModel):
    """`[fp8_linears]`: the GEMM rate of FP8 linears / bf16 linears."""

    speedup: Annotated[float, Field(gt=0)]
    """The ratio."""
    source: str
    """Where it comes from."""


class AttentionFile(FileModel):
    """`cpbench/data/plan/attention.toml`: each framework's CP attention, and FP8 linears."""

    prior: str
    """What "{prior}" in a source stands for."""
    fp8_linears: Fp8Linears
    """The GEMM rate of FP8 linears."""
    frameworks: dict[str, dict[str, Any]]
    """Each framework's `FrameworkAttention` table (without `framework`: the key)."""


def _load_attention() -> tuple[dict[str, FrameworkAttention], Fp8Linears]:
    path = resources.files("cpbench") / "data" / "plan" / "attention.toml"
    spec = AttentionFile.model_validate(tomllib.loads(path.read_text("utf-8")))
    frameworks = {
        name: FrameworkAttention.model_validate(
            {**t, "framework": name, "source": str(t.get("source", "")).format(prior=spec.prior)}
        )
        for name, t in spec.frameworks.items()
    }
    return frameworks, spec.fp8_linears


FRAMEWORK_ATTENTION, FP8_LINEARS = _load_attention()
"""Each framework's CP attention; the GEMM rate of FP8 linears."""
FP8_LINEAR_SPEEDUP = FP8_LINEARS.speedup
"""GEMM rate of FP8 linears / bf16 linears (`FP8_LINEARS.source` says where it comes from)."""


def framework_attention(framework: str) -> FrameworkAttention:
    """A framework's attention; CpbenchError naming the frameworks otherwise."""
    if framework not in FRAMEWORK_ATTENTION:
        raise CpbenchError(f"framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORK_ATTENTION[framework]


def linear_speedup(precision: str) -> float:
    """GEMM rate of the linears over bf16 ones; CpbenchError on an unknown precision."""
    if precision == "bf16":
        return 1.0
    if precision == "fp8":
        return FP8_LINEAR_SPEEDUP
    raise CpbenchError(f"linear precision {precision!r} is not one of "
                       f"{', '.join(LINEAR_PRECISIONS)}")


def check_attention_factor(value: float | None) -> float | None:
    """A measured attention factor: > 0 (None: the framework's prior)."""
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise CpbenchError(f"attention factor must be > 0, got {value!r}")
    return value
