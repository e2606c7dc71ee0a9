"""world = TP x CP x PP x DP: the parallel sizes a recommendation is made for."""

from __future__ import annotations

from dataclasses import dataclass

from cpbench.config.bench import check_positive_int
from cpbench.errors import CpbenchError


@dataclass(frozen=True)
class ParallelSizes:
    """Megatron's device dimensions: world = TP x CP x PP x DP, and the global batch."""

    world: int
    tp: int
    cp: int
    """Context-parallel size (U x R)."""
    pp: int
    dp: int
    """Data-parallel size: world / (TP x CP x PP)."""
    micro_batch: int
    """Sequences per micro-batch and data-parallel rank."""
    grad_accum: int
    """Micro-batches accumulated per optimizer step."""

    @property
    def global_batch(self) -> int:
        """micro_batch x grad_accum x DP sequences per optimizer step."""
        return self.micro_batch * self.grad_accum * self.dp

    def world_formula(self) -> str:
        """`world = TP x CP x PP x DP` with the numbers."""
        return f"world {self.world} = TP {self.tp} x CP {self.cp} x PP {self.pp} x DP {self.dp}"

    def batch_formula(self) -> str:
        """`global batch = micro_batch x grad_accum x DP` with the numbers."""
        return (
            f"global batch = micro_batch {self.micro_batch} x grad_accum {self.grad_accum} "
            f"x DP {self.dp} = {self.global_batch} sequence(s) per optimizer step"
        )


def solve_parallel_sizes(
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    cp: int | None = None,
    micro_batch: int = 1,
    grad_accum: int = 1,
) -> ParallelSizes:
    """Solve world = TP x CP x PP x DP; CP defaults to gpus / (TP x PP) (DP = 1)."""
    for name, value in (("gpus", gpus), ("tp", tp), ("pp", pp), ("micro batch", micro_batch),
                        ("grad accum", grad_accum)):  # fmt: skip
        check_positive_int(name, value)
    if gpus % (tp * pp):
        raise CpbenchError(
            f"gpus ({gpus}) must be divisible by TP x PP = {tp} x {pp} = {tp * pp} "
            f"(world = TP x CP x PP x DP)"
        )
    if cp is None:
        cp = gpus // (tp * pp)
    check_positive_int("cp", cp)
    model = tp * cp * pp
    if gpus % model:
        raise CpbenchError(
            f"gpus ({gpus}) must be divisible by TP x CP x PP = {tp} x {cp} x {pp} = {model} "
            f"(world = TP x CP x PP x DP)"
        )
    return ParallelSizes(gpus, tp, cp, pp, gpus // model, micro_batch, grad_accum)
