"""The user's choices of a plan search (`cpbench plan`'s options): `PlanOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from cpbench.config.problem import check_choice, check_positive_int
from cpbench.config.vocabulary import canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.plan.framework import (
    Framework,
    LinearPrecision,
    check_attention_factor,
    framework_attention,
    linear_speedup,
)
from cpbench.model.plan.memory import (
    MEMORY_MARGINS,
    MemoryMargin,
    Recompute,
    check_recompute,
    check_zero,
)

RankBy = Literal["step", "max_seq_len"]
"""How plans are ranked: step (fastest first) or max_seq_len (longest sequence under the safe
margin first, then fastest)."""
RANK_BYS: tuple[RankBy, ...] = get_args(RankBy)


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """The choices a plan search is given beside the model, the GPUs and L (`cpbench plan`'s
    options): the request (`cpbench.app.plan.PlanRequest`) and the resolved search
    (`SearchSpace`) both carry them, validated here once."""

    micro_batch: int = 1
    """Sequences per micro-batch."""
    dtype: str = "bfloat16"
    """Weights and activations dtype (peak FLOP/s, activation bytes)."""
    kernel: str = "auto"
    """Attention kernel (cpbench's kernel names)."""
    zero: int = 1
    """ZeRO stage over DP x CP (1 = Megatron's distributed optimizer)."""
    recompute: Recompute | None = None
    """One recompute level (None: none and full, and selective when the kernel stores the
    scores)."""
    tp: int | None = None
    """Only this TP (None = search)."""
    cp: int | None = None
    """Only this CP."""
    pp: int | None = None
    """Only this PP."""
    keep: int = 10
    """Plans ranked and memory rejections kept (0 = every one: no pruning)."""
    exhaustive: bool = False
    """Price every plan that fits (the ranking without bounds) even when `keep` > 0."""
    framework: Framework = "cpbench"
    """The attention priced (`cpbench.model.plan.framework`)."""
    attention_factor: float | None = None
    """Measured attention time / the cost model's (None: the framework's prior)."""
    linears: LinearPrecision = "bf16"
    """Precision of the linear layers."""
    memory_margin: MemoryMargin = "capacity"
    """What a plan must fit: capacity, or safe (Fujii et al.'s 80%)."""
    rank_by: RankBy = "step"
    """How plans are ranked (`RankBy`)."""
    uneven_pp: bool = False
    """Allow PP that does not divide the layers (the busiest stage holds ceil(layers / PP))."""

    def __post_init__(self) -> None:
        check_positive_int("micro batch", self.micro_batch)
        for name in ("tp", "cp", "pp"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.recompute is not None:
            check_recompute(self.recompute)
        check_zero(self.zero)
        canonical_dtype(self.dtype)
        framework_attention(self.framework)
        linear_speedup(self.linears)
        check_choice("memory margin", self.memory_margin, MEMORY_MARGINS)
        check_choice("rank by", self.rank_by, RANK_BYS)
        check_attention_factor(self.attention_factor)
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 0:
            raise CpbenchError(f"plans kept must be an integer >= 0 (0 keeps all), got "
                               f"{self.keep!r}")
