"""`InferenceStep`: what an inference benchmark point runs, beside its problem (`BenchConfig`
holds one; None = a training step). Not a shape: the heads, head dim, batch, dtype and mesh
stay the `CpProblem`'s, and its `seq_len` is cached_len + new_tokens.

Pure Python (no torch); the model's case (`cpbench.model.inference.PrefillCase` /
`DecodeCase`) is built from a point by `inference_case`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpbench.config.problem import CpProblem, check_choice, is_int
from cpbench.config.vocabulary import (
    CACHE_LAYOUTS,
    INFERENCE_PHASES,
    PREFILL_SCHEMES,
    CacheLayout,
    InferencePhase,
    PrefillScheme,
)
from cpbench.errors import CpbenchError

if TYPE_CHECKING:
    from cpbench.model.inference import DecodeCase, PrefillCase

def is_inference_record(record: Mapping[str, Any]) -> bool:
    """Whether a result record is of an inference point (its config names an inference step):
    the training tables, the cost model's fits and the report's training sections leave these
    out."""
    config = record.get("config")
    return isinstance(config, Mapping) and bool(config.get("inference"))


MAX_DECODE_TOKENS = 8
"""Most new tokens a decode step takes (speculative decoding drafts a few; more is prefill);
the value of `cpbench.attention.inference_decode.MAX_DECODE_TOKENS` and `DecodeCase`."""


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
        return {
            "phase": self.phase,
            "cached_len": self.cached_len,
            "new_tokens": self.new_tokens,
            "scheme": self.scheme,
            "cache_layout": self.cache_layout,
        }

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


def inference_case(problem: CpProblem, step: InferenceStep, seed: int = 0) -> PrefillCase | DecodeCase:
    """The model's case of a step on a problem (its heads, head dim, batch, dtype and mesh;
    its seq_len must be P + T): `PrefillCase` or `DecodeCase`, whose checks apply (the mesh
    the scheme runs on, Ulysses' head split)."""
    from cpbench.model.inference import DecodeCase, PrefillCase  # noqa: PLC0415 (scipy: lazy)

    base = CpProblem(**problem.problem_fields())  # the cases hold the bare problem
    if step.phase == "prefill" and step.scheme is not None:
        return PrefillCase(base, step.cached_len, step.new_tokens, step.scheme, seed)
    if step.phase == "decode" and step.cache_layout is not None:
        return DecodeCase(base, step.cached_len, step.new_tokens, step.cache_layout, seed)
    raise CpbenchError(f"inference step {step} names no scheme or cache layout")  # unreachable
