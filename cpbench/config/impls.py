"""The names of the attention implementations cpbench can measure (the `impl` axis): `NAME`, or
`NAME:VARIANT` for a documented variant (torch_cp's rotation, TransformerEngine's all-gather CP).
Pure Python (no torch), so scenarios and the CLI validate names without importing the libraries."""

from __future__ import annotations

from typing import Literal, get_args

from cpbench.errors import CpbenchError

Impl = Literal[
    "cpbench",
    "torch_cp",
    "torch_cp:alltoall",
    "ring_flash_attn",
    "yunchang",
    "transformer_engine",
    "transformer_engine:all_gather",
]
IMPLS: tuple[Impl, ...] = get_args(Impl)
DEFAULT_IMPL: Impl = "cpbench"

IMPL_HELP: dict[str, str] = {
    "cpbench": "cpbench's own Ulysses / ring / USP (cpbench.attention)",
    "torch_cp": "PyTorch context_parallel (torchtitan): ring, all-gather K/V rotation",
    "torch_cp:alltoall": "PyTorch context_parallel with set_rotate_method('alltoall')",
    "ring_flash_attn": "zhuzilin/ring-flash-attention: ring (basic / zigzag / stripe)",
    "yunchang": "feifeibear/long-context-attention (USP): Ulysses x ring",
    "transformer_engine": "NVIDIA TransformerEngine DotProductAttention: p2p / a2a / a2a+p2p",
    "transformer_engine:all_gather": "TransformerEngine with cp_comm_type='all_gather'",
}


def check_impl(name: object) -> str:
    """`name` if it is a known implementation, else a CpbenchError listing them."""
    if not isinstance(name, str) or name not in IMPLS:
        raise CpbenchError(f"impl {name!r} is not one of {', '.join(IMPLS)}")
    return name


def base_name(name: str) -> str:
    """The implementation without its variant: 'torch_cp:alltoall' -> 'torch_cp'."""
    return name.split(":", 1)[0]


def variant(name: str) -> str | None:
    """The variant after the colon, None for the default options."""
    return name.split(":", 1)[1] if ":" in name else None
