"""A scenario's dynamic-CP study (`[dynamic]`): the batch drawn from its lengths source, the
problem the policies plan, and the ids of its records (`--resume` skips a policy whose id is in
the file). docs/dynamic-cp.md, "Measured by sweep". Pure Python (no torch)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from cpbench.config.documents import global_batch
from cpbench.config.vocabulary import DEFAULT_DTYPE, Dtype
from cpbench.errors import CpbenchError
from cpbench.model.dynamic import STEP_MICRO_BATCHES, DynamicProblem, Policy
from cpbench.model.hardware.loading import CPU_PROFILE, FALLBACK_GPU_PROFILE
from cpbench.results.scenarios.file_schema import ScenarioDynamic


@dataclass(frozen=True)
class DynamicStudy:
    """One dynamic-CP study as the sweep runs it: the batch, the problem, what to measure."""

    problem: DynamicProblem
    source: str
    """The lengths source as the scenario gave it."""
    step_tokens: int
    """The token budget the batch was drawn to."""
    policies: tuple[Policy, ...]
    hardware: str
    """The hardware profile's name or path."""
    rounds: int
    backend: str
    device: str
    seed: int

    @property
    def key(self) -> str:
        """The study's id stem: the batch's shape in words and a digest of everything that
        makes the step (lengths, budgets, shape, device, profile, kernel)."""
        p = self.problem
        signature = json.dumps(
            [p.lengths, p.world, p.tokens_per_rank, p.heads, p.kv_heads, p.head_dim, p.dtype,
             p.static_degree, self.hardware, self.backend, self.device],
        )  # fmt: skip
        digest = hashlib.sha256(signature.encode()).hexdigest()[:10]
        return (
            f"dynamic-n{len(p.lengths)}-T{sum(p.lengths)}-C{p.tokens_per_rank}-h{p.heads}"
            f"-kv{p.kv_heads}-d{p.head_dim}-{p.dtype}-{self.device}-w{p.world}-{digest}"
        )

    def record_id(self, policy: Policy) -> str:
        """The id of one policy's record."""
        return f"{self.key}-{policy}"


def dynamic_study(
    table: ScenarioDynamic, source: str, device: str, world: int, seed: int,
    lengths_source: str | None = None,
) -> DynamicStudy:  # fmt: skip
    """The study of a `[dynamic]` table on `world` ranks of `device`: the batch drawn with
    `seed` (`lengths_source`: the table's source with a file named from here), checked as
    the planner needs it (CpbenchError naming the file and the key otherwise)."""
    dtype: Dtype = table.dtype or DEFAULT_DTYPE[device]
    budget = table.step_tokens or STEP_MICRO_BATCHES * world * table.tokens_per_rank
    try:
        lengths = global_batch(lengths_source or table.lengths, budget, seed)
    except CpbenchError as exc:
        raise CpbenchError(f"{source}: key 'lengths' in [dynamic]: {exc}") from None
    try:
        problem = DynamicProblem(
            lengths, world, table.tokens_per_rank, table.heads, table.kv_heads or table.heads,
            table.head_dim, dtype, table.static_cp,
        )  # fmt: skip
    except CpbenchError as exc:
        key = "static_cp" if table.static_cp is not None and "static CP" in str(exc) else (
            "tokens_per_rank")
        raise CpbenchError(
            f"{source}: key '{key}' in [dynamic]: {exc} (world_size {world})"
        ) from None
    hardware = table.hardware or (FALLBACK_GPU_PROFILE if device == "cuda" else CPU_PROFILE)
    return DynamicStudy(problem, table.lengths, budget, tuple(table.policies), hardware,
                        table.rounds, table.backend, device, seed)  # fmt: skip
