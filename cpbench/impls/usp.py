"""yunchang (feifeibear/long-context-attention: USP, PyPI `yunchang`) as an implementation.

Its layouts, groups, kernel and upstream precision issues: docs/internals.md, "yunchang"."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import torch.distributed as dist

from cpbench.attention.layouts import positions
from cpbench.attention.mesh import group_cache
from cpbench.config.bench import BenchConfig
from cpbench.config.tolerances import TOLERANCE
from cpbench.config.vocabulary import YUNCHANG_RING_IMPL_TYPES
from cpbench.impls.base import (
    AdapterDefaults,
    FlashApiRunner,
    KnownIssue,
    PositionSharding,
    bf16_dq_when_fp16_contiguous,
    first_reason,
    half_precision_reason,
    import_library,
    mask_reason,
    missing_module,
    module_available,
    no_kv_replication_reason,
    own_kernel_reason,
    self_send_reason,
)

RING_IMPL_TYPES = YUNCHANG_RING_IMPL_TYPES
YUNCHANG_BF16_DQ = KnownIssue(
    ("dq",),
    TOLERANCE["bfloat16"],
    "yunchang's basic ring backward (contiguous layout) returns dq.to(torch.bfloat16) "
    "whatever the input dtype (yunchang/ring/ring_flash_attn.py, 0.6.4): dQ of float16 inputs "
    "is rounded to bf16",
)


def _yunchang_not_installed(exc: BaseException) -> str:
    return f"yunchang is not installed: pip install 'cpbench[usp]' ({exc})"


@group_cache
def _process_groups(ulysses: int, ring: int) -> tuple[Any, Any]:
    """yunchang's (Ulysses group, ring group) of this rank for a U x R mesh, made once per
    mesh by its own `set_seq_parallel_pg` (collective: every rank calls it in the same order)."""
    from yunchang.globals import PROCESS_GROUP, set_seq_parallel_pg  # noqa: PLC0415

    set_seq_parallel_pg(ulysses, ring, dist.get_rank(), dist.get_world_size())
    return PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG


@dataclass(frozen=True)
class UspAdapter(AdapterDefaults):
    name: str = "yunchang"
    kernel: str = "flash_attn"
    distribution: ClassVar[str] = "yunchang"

    def capability(self, config: BenchConfig) -> str | None:
        return first_reason(
            mask_reason(config, "yunchang"),
            own_kernel_reason(config, "yunchang"),
            half_precision_reason(config, "yunchang"),
            no_kv_replication_reason(config, "yunchang"),
            self._layout_reason(config),
            self_send_reason(config, "yunchang"),
        )

    @staticmethod
    def _layout_reason(config: BenchConfig) -> str | None:
        if config.layout != "contiguous" and not config.causal:
            return (
                f"yunchang's ring_impl_type {RING_IMPL_TYPES[config.layout]!r} is causal only "
                f"(it asserts causal=True); a full mask needs layout contiguous ('basic')"
            )
        return None

    def installed(self) -> str | None:
        """Looked up, not imported (see `cpbench.impls.base`; yunchang's import may create a
        CUDA context): yunchang, and flash-attn for its ring backward. Where yunchang is
        already imported (a rank, a test), its own verdict `yunchang.globals.HAS_FLASH_ATTN`
        decides."""
        missing = missing_module("yunchang")
        if missing is not None:
            return _yunchang_not_installed(missing)
        loaded = sys.modules.get("yunchang.globals")
        has_flash_attn = (
            bool(getattr(loaded, "HAS_FLASH_ATTN", False))
            if loaded is not None
            else module_available("flash_attn")
        )
        if not has_flash_attn:
            return (
                "yunchang's ring attention with a backward runs on flash-attn (CUDA only), "
                "which is not importable: pip install flash-attn"
            )
        return None

    def known_issues(self, config: BenchConfig) -> tuple[KnownIssue, ...]:
        return bf16_dq_when_fp16_contiguous(config, YUNCHANG_BF16_DQ)

    def prepare(self, config: BenchConfig) -> FlashApiRunner:
        import_library("yunchang", _yunchang_not_installed)  # imported here, in the rank only
        from yunchang import LongContextAttention  # noqa: PLC0415
        from yunchang.globals import PROCESS_GROUP  # noqa: PLC0415
        from yunchang.kernels import AttnType  # noqa: PLC0415

        # LongContextAttention reads yunchang's global groups when it is built.
        PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = _process_groups(
            config.ulysses, config.ring
        )
        attention = LongContextAttention(
            ring_impl_type=RING_IMPL_TYPES[config.layout], attn_type=AttnType.FA
        )
        u, r = config.ulysses, config.ring
        sharding = PositionSharding(
            lambda p: positions(config.seq_len, u, r, config.layout, p),
            config.world_size,
            dist.get_rank(),
        )
        return FlashApiRunner(config, attention, sharding)
