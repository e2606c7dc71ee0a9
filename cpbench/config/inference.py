"""`InferenceStep`: what an inference benchmark point runs, beside its problem (`BenchConfig`
holds one; None = a training step). Pure Python; docs/design.md section 3."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from cpbench.config.constraints import is_int
from cpbench.config.problem import CpProblem, check_choice
from cpbench.config.vocabulary import (
    CACHE_LAYOUTS,
    INFERENCE_PHASES,
    PREFILL_SCHEMES,
    CacheLayout,
    InferencePhase,
    PrefillScheme,
)
from cpbench.errors import CpbenchError


def is_inference_record(record: Mapping[str, Any]) -> bool:
    """Whether a result record is of an inference point (its config names an inference step):
    the training tables, the cost model's fits and the report's training sections leave these
    out."""
    config = record.get("config")
    return isinstance(config, Mapping) and bool(config.get("inference"))


MAX_DECODE_TOKENS = 8
"""Most new tokens a decode step takes (speculative decoding drafts a few; more is prefill);
used by the scenario file, `decode_rule` (the model's `DecodeCase`) and the attention."""

Workload = Literal["training", "inference"]
"""What a step serves: a training step (fwd+bwd or fwd) or an inference one (prefill, decode)."""
STEP_OPTIONS: dict[Workload, tuple[str, ...]] = {
    "training": (
        "seq_len", "mesh", "layout", "kv_replication", "impl", "documents", "window", "causal",
        "cp_comm", "heads_k_stride", "results", "write_scenario", "tp", "pp", "cp", "grad_accum",
    ),
    "inference": (
        "cached_len", "new_tokens", "scheme", "cache_layout", "prompt_len", "decode_batch",
        "layers", "kv_memory_gib",
    ),
}  # fmt: skip
"""Which options (command-line options and scenario axes, by field name) belong to one kind of
step only: a training step (fwd, fwd+bwd: a sequence of seq_len tokens on a U x R mesh under a
mask) or an inference step (prefill, decode: new tokens on a KV cache, its mesh and shards its
scheme's or cache layout's). A command refuses an option of the other kind given a value of
its own; an option in neither (heads, dtype, kernel, ...) belongs to both."""


@dataclass(frozen=True, kw_only=True)
class InferenceStep:
    """One inference step: prefill of `new_tokens` on `cached_len` cached tokens by a scheme, or
    a decode step of `new_tokens` queries over a cache of cached_len + new_tokens keys."""

    phase: InferencePhase
    """prefill (timed: time to first token) or decode (timed: one step of new_tokens queries)."""
    cached_len: int
    """P: tokens already in the KV cache (key positions 0..P-1), >= 0."""
    new_tokens: int
    """T: new tokens (query positions P..P+T-1); prefill >= 1, decode 1 to 8."""
    scheme: PrefillScheme | None = None
    """prefill only: how the ranks exchange data (`PREFILL_SCHEMES`); None for decode."""
    cache_layout: CacheLayout | None = None
    """decode only: how the cache is sharded by sequence (`CACHE_LAYOUTS`); None for prefill."""

    def __post_init__(self) -> None:
        check_choice("phase", self.phase, INFERENCE_PHASES)
        for name, least in (("cached_len", 0), ("new_tokens", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < least:
                raise CpbenchError(f"{name} must be an integer >= {least}, got {value!r}")
        if self.phase == "prefill":
            check_choice("scheme", self.scheme, PREFILL_SCHEMES)
            if self.cache_layout is not None:
                raise CpbenchError(
                    f"cache_layout {self.cache_layout!r} is a decode setting; a prefill takes "
                    "a scheme"
                )
            return
        check_choice("cache_layout", self.cache_layout, CACHE_LAYOUTS)
        if self.scheme is not None:
            raise CpbenchError(
                f"scheme {self.scheme!r} is a prefill setting; a decode takes a cache_layout"
            )
        if self.new_tokens > MAX_DECODE_TOKENS:
            raise CpbenchError(
                f"a decode step takes 1 to {MAX_DECODE_TOKENS} new tokens, got new_tokens "
                f"{self.new_tokens} (more is a prefill)"
            )

    @property
    def total(self) -> int:
        """P + T: the keys the new queries attend to (the problem's seq_len)."""
        return self.cached_len + self.new_tokens

    @property
    def how(self) -> str:
        """The scheme (prefill) or the cache layout (decode)."""
        return str(self.scheme if self.phase == "prefill" else self.cache_layout)

    def mesh(self, world: int) -> tuple[int, int]:
        """The U x R mesh the step runs on: W x 1 for Ulysses prefill, 1 x W otherwise."""
        return (world, 1) if self.scheme == "ulysses" else (1, world)

    def short_key(self) -> str:
        """The part of a point's id that names the step: prefill-pass_q-P1024-T64."""
        return f"{self.phase}-{self.how}-P{self.cached_len}-T{self.new_tokens}"

    def to_dict(self) -> dict[str, Any]:
        """The record's `config.inference` (`cpbench.results.schema.InferenceConfigSection`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InferenceStep:
        """From a record's `config.inference`."""
        return cls(
            phase=d["phase"],
            cached_len=d["cached_len"],
            new_tokens=d["new_tokens"],
            scheme=d.get("scheme"),
            cache_layout=d.get("cache_layout"),
        )


def ulysses_kv_heads(kv_heads: int, world: int) -> int:
    """KV heads after replication for a head split over `world` ranks: kv_heads when at least
    `world`, else each head copied world / kv_heads times (kv_heads must divide world)."""
    if kv_heads >= world:
        return kv_heads
    if world % kv_heads:
        raise CpbenchError(
            f"{kv_heads} KV heads cannot be replicated onto {world} ranks ({world} % "
            f"{kv_heads} = {world % kv_heads})"
        )
    return world


def prefill_rule(problem: CpProblem, cached_len: int, new_tokens: int, scheme: str) -> str | None:
    """What a prefill of `new_tokens` on `cached_len` by `scheme` breaks on `problem` (its
    seq_len must be P + T, its mesh the scheme's: W x 1 for ulysses, 1 x W otherwise; Ulysses
    splits the heads and the replicated KV heads over W), or None. The model's `PrefillCase`
    and `BenchConfig.feasibility` both apply it."""
    if new_tokens < 1 or cached_len < 0:
        return (
            f"prefill needs new_tokens >= 1 and cached_len >= 0, got new_tokens {new_tokens}, "
            f"cached_len {cached_len}"
        )
    total = cached_len + new_tokens
    if problem.seq_len != total:
        return (
            f"the problem's seq_len ({problem.seq_len}) must be cached_len + new_tokens = "
            f"{cached_len} + {new_tokens} = {total}"
        )
    world = problem.ulysses * problem.ring
    want = (world, 1) if scheme == "ulysses" else (1, world)
    if (problem.ulysses, problem.ring) != want:
        return (
            f"prefill scheme {scheme} runs on a U x R = {want[0]} x {want[1]} mesh of {world} "
            f"ranks, got {problem.ulysses} x {problem.ring}"
        )
    return ulysses_rule(problem.heads, problem.kv_heads, world) if scheme == "ulysses" else None


def ulysses_rule(heads: int, kv_heads: int, world: int) -> str | None:
    """Why Ulysses cannot split `heads` query and `kv_heads` KV heads over `world` ranks (the
    KV heads replicated up to W when fewer), or None when it can."""
    try:
        kv = ulysses_kv_heads(kv_heads, world)
    except CpbenchError as exc:
        return str(exc)
    if heads % world or kv % world:
        return (
            f"ulysses splits heads over {world} ranks: {heads} heads and {kv_heads} KV heads "
            f"(replicated to {kv}) must be multiples of it"
        )
    return None


def decode_rule(problem: CpProblem, cached_len: int, new_tokens: int) -> str | None:
    """What a decode step of `new_tokens` over cached_len + new_tokens keys breaks on `problem`
    (1 to MAX_DECODE_TOKENS new tokens, seq_len P + T, U = 1), or None."""
    if not 1 <= new_tokens <= MAX_DECODE_TOKENS or cached_len < 0:
        return (
            f"decode needs 1 <= new_tokens <= {MAX_DECODE_TOKENS} and cached_len >= 0, got "
            f"new_tokens {new_tokens}, cached_len {cached_len}"
        )
    total = cached_len + new_tokens
    if problem.seq_len != total or problem.ulysses != 1:
        return (
            f"a decode case's problem has seq_len cached_len + new_tokens = {total} (got "
            f"{problem.seq_len}) and U = 1 (got {problem.ulysses})"
        )
    return None


def step_rule(problem: CpProblem, step: InferenceStep) -> str | None:
    """`prefill_rule` or `decode_rule` of a step on a problem."""
    if step.phase == "prefill":
        return prefill_rule(problem, step.cached_len, step.new_tokens, step.scheme or "")
    return decode_rule(problem, step.cached_len, step.new_tokens)
