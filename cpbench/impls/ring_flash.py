"""ring-flash-attention (zhuzilin/ring-flash-attention, PyPI `ring-flash-attn`) as an impl.

Its functions per layout, kernel and precision issues: docs/internals.md, "ring-flash-attention"."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from cpbench.attention.layouts import positions
from cpbench.config.bench import BenchConfig
from cpbench.config.tolerances import TOLERANCE
from cpbench.impls.base import (
    AdapterDefaults,
    FlashApiRunner,
    KnownIssue,
    PositionSharding,
    bf16_dq_when_fp16_contiguous,
    cp_group,
    distribution_version,
    first_reason,
    half_precision_reason,
    import_library,
    mask_reason,
    missing_module,
    own_kernel_reason,
    self_send_reason,
)

FUNCTIONS = {
    "contiguous": "ring_flash_attn_func",
    "zigzag": "zigzag_ring_flash_attn_func",
    "striped": "stripe_flash_attn_func",
}
RING_FLASH_BF16_DQ = KnownIssue(
    ("dq",),
    TOLERANCE["bfloat16"],
    "ring-flash-attn's ring_flash_attn_backward (contiguous layout) returns "
    "dq.to(torch.bfloat16) whatever the input dtype (ring_flash_attn/ring_flash_attn.py, "
    "0.1.8): dQ of float16 inputs is rounded to bf16",
)


def install_hint(exc: BaseException) -> str:
    """What to install when `import ring_flash_attn` fails."""
    text = str(exc)
    missing = getattr(exc, "name", None) or ""
    if missing.split(".")[0] == "flash_attn" or "'flash_attn" in text:
        return f"ring-flash-attn needs flash-attn (CUDA only): pip install flash-attn ({text})"
    if missing.split(".")[0] == "transformers" or "transformers" in text:
        return (
            f"ring-flash-attn 0.1.8 imports its HuggingFace adapter at import time, which needs "
            f"transformers < 5: pip install 'transformers<5' ({text})"
        )
    return f"ring-flash-attn is not installed: pip install 'cpbench[ring]' ({text})"


def _major(version: str | None) -> int:
    """The leading number of a version string (0 when unknown)."""
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() else 0


def _hf_adapter_needs_old_transformers() -> bool:
    """ring-flash-attn up to 0.1.8 imports `is_flash_attn_greater_or_equal_2_10` from
    transformers at import time (ring_flash_attn/adapters/hf_adapter.py), which transformers
    5 no longer has; a later release is given the benefit of the doubt (its rank's import
    would fail with the hint)."""
    version = distribution_version("ring-flash-attn")
    if version is None:
        return True
    parts = [int(p) for p in version.split("+")[0].split(".")[:3] if p.isdigit()]
    return tuple(parts) <= (0, 1, 8)


@dataclass(frozen=True)
class RingFlashAdapter(AdapterDefaults):
    name: str = "ring_flash_attn"
    kernel: str = "flash_attn"
    distribution: ClassVar[str] = "ring-flash-attn"

    def capability(self, config: BenchConfig) -> str | None:
        return first_reason(
            mask_reason(config, "ring-flash-attn"),
            own_kernel_reason(config, "ring-flash-attn"),
            half_precision_reason(config, "ring-flash-attn"),
            self._mesh_reason(config),
            self_send_reason(config, "ring-flash-attn"),
        )

    @staticmethod
    def _mesh_reason(config: BenchConfig) -> str | None:
        if config.ulysses != 1:
            return (
                f"ring-flash-attn is ring attention only: needs ulysses = 1, got "
                f"{config.ulysses} (yunchang composes it with Ulysses)"
            )
        if config.layout != "contiguous" and not config.causal:
            return (
                f"ring-flash-attn's {FUNCTIONS[config.layout]} is causal only (it asserts "
                f"causal=True); a full mask needs layout contiguous (ring_flash_attn_func)"
            )
        return None

    def installed(self) -> str | None:
        """Looked up, not imported (see `cpbench.impls.base`): the library, then what its
        import needs (flash-attn; transformers, for the HuggingFace adapter that 0.1.8
        imports at import time, older than 5)."""
        missing = missing_module("ring_flash_attn", "flash_attn", "transformers")
        if missing is not None:
            return install_hint(missing)
        transformers = distribution_version("transformers")
        if _hf_adapter_needs_old_transformers() and _major(transformers) >= 5:
            return install_hint(ImportError(f"transformers {transformers} is installed"))
        return None

    def known_issues(self, config: BenchConfig) -> tuple[KnownIssue, ...]:
        return bf16_dq_when_fp16_contiguous(config, RING_FLASH_BF16_DQ)

    def prepare(self, config: BenchConfig) -> FlashApiRunner:
        module = import_library("ring_flash_attn", install_hint)
        world, rank = config.world_size, torch.distributed.get_rank()
        sharding = PositionSharding(
            lambda r: positions(config.seq_len, 1, world, config.layout, r), world, rank
        )
        function = functools.partial(getattr(module, FUNCTIONS[config.layout]), group=cp_group())
        return FlashApiRunner(config, function, sharding)
