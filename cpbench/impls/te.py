"""NVIDIA TransformerEngine (`DotProductAttention`, what Megatron-LM runs) as an implementation.

The mesh -> `cp_comm_type` table, its layout and limits: docs/internals.md, "TransformerEngine"."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from cpbench.attention import build_mesh
from cpbench.attention.kernels import default_scale
from cpbench.attention.layouts import positions
from cpbench.config.bench import BenchConfig
from cpbench.config.impls import variant
from cpbench.config.vocabulary import HALF_DTYPES
from cpbench.impls.base import (
    AdapterDefaults,
    NoStepContext,
    PositionSharding,
    ShardsByPositions,
    cp_group,
    first_reason,
    mask_reason,
    missing_module,
    no_kv_replication_reason,
    own_kernel_reason,
)


def te_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """Global token positions of CP rank `rank` in TE's (Megatron's) split: chunks `rank` and
    `2P-1-rank` of 2P equal chunks, cpbench's zigzag over a ring of all P ranks."""
    return positions(seq_len, 1, world, "zigzag", rank)


def comm_type(config: BenchConfig, name: str) -> str:
    if variant(name) == "all_gather":
        return "all_gather"
    if config.ulysses == 1:
        return "p2p"
    return "a2a" if config.ring == 1 else "a2a+p2p"


def _te_not_installed(exc: BaseException) -> str:
    return (
        f"TransformerEngine is not installed or cannot load (CUDA only): "
        f"pip install 'cpbench[te]' ({type(exc).__name__}: {exc})"
    )


@functools.cache
def _side_stream() -> Any:
    return torch.cuda.Stream()


@dataclass(frozen=True)
class TeRunner(ShardsByPositions, NoStepContext):
    config: BenchConfig
    attention: Any
    sharding: PositionSharding

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s, h, d = q.shape
        out = self.attention(q.contiguous(), k.contiguous(), v.contiguous())
        return out.view(b, s, h, d)  # TE returns [B, S, h * d] for bshd


@dataclass(frozen=True)
class TeAdapter(AdapterDefaults):
    kernel: str = "te_fused"
    distribution: ClassVar[str] = "transformer-engine"

    def capability(self, config: BenchConfig) -> str | None:
        return first_reason(
            mask_reason(config, "TransformerEngine"),
            self._device_reason(config),
            own_kernel_reason(config, "TransformerEngine"),
            no_kv_replication_reason(config, "TransformerEngine"),
            self._mesh_reason(config),
        )

    @staticmethod
    def _device_reason(config: BenchConfig) -> str | None:
        if config.device != "cuda":
            return (
                f"TransformerEngine's context parallelism runs only on CUDA (its fused / "
                f"flash attention backends); device {config.device}"
            )
        if config.dtype not in HALF_DTYPES:
            return (
                f"TransformerEngine's context parallelism needs fp16/bf16 (float32 falls back "
                f"to the unfused backend, which has no CP); dtype {config.dtype}"
            )
        return None

    def _mesh_reason(self, config: BenchConfig) -> str | None:
        if config.layout != "zigzag":
            return (
                f"TransformerEngine splits the sequence its own way (rank p holds chunks p and "
                f"2P-1-p of 2P, Megatron's get_batch_on_this_cp_rank): use layout zigzag, "
                f"got {config.layout}"
            )
        if config.seq_len % (2 * config.world_size):
            return (
                f"TransformerEngine splits the sequence into 2P = {2 * config.world_size} "
                f"chunks: seq_len ({config.seq_len}) must be divisible by it"
            )
        if variant(self.name) == "all_gather" and config.ulysses != 1:
            return (
                f"cp_comm_type 'all_gather' is a ring-level scheme: needs ulysses = 1, got "
                f"{config.ulysses}"
            )
        return None

    def installed(self) -> str | None:
        """Looked up, not imported (see `cpbench.impls.base`): TE's import loads its CUDA
        libraries and queries the GPU. An installed TE that cannot load fails in the rank's
        `prepare`, with the same hint."""
        missing = missing_module("transformer_engine")
        return _te_not_installed(missing) if missing is not None else None

    def prepare(self, config: BenchConfig) -> TeRunner:
        try:  # imported here, in the rank only
            te = importlib.import_module("transformer_engine.pytorch")
        except Exception as exc:  # noqa: BLE001 - TE raises more than ImportError without CUDA
            raise ImportError(_te_not_installed(exc)) from exc
        kind = comm_type(config, self.name)
        mesh = build_mesh(config.ulysses, config.ring)
        group: Any = cp_group()
        if kind == "a2a+p2p":
            group = [mesh.ulysses_group, mesh.ring_group]
        attention = te.DotProductAttention(
            num_attention_heads=config.heads,
            kv_channels=config.head_dim,
            num_gqa_groups=config.kv_heads,
            attention_dropout=0.0,
            qkv_format="bshd",
            attn_mask_type="causal" if config.causal else "no_mask",
            softmax_scale=default_scale(config.head_dim),
        )
        attention.set_context_parallel_group(group, list(mesh.cp_ranks), _side_stream(), kind)
        world = config.world_size
        sharding = PositionSharding(
            lambda p: te_positions(config.seq_len, world, p), world, dist.get_rank()
        )
        return TeRunner(config, attention, sharding)
