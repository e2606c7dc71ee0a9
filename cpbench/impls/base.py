"""What an implementation adapter is: the small protocol every library sits behind.

The protocol (`Adapter`, `Runner`) and why `installed()` must not import: docs/internals.md."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Protocol

import torch
import torch.distributed as dist

from cpbench.attention.kernels import default_scale
from cpbench.attention.layouts import reassemble
from cpbench.config.bench import BenchConfig
from cpbench.config.vocabulary import GLOBAL_LAYOUTS, HALF_DTYPES


@dataclass(frozen=True)
class KnownIssue:
    """A documented upstream precision issue: the gradients it affects are checked against
    `tolerance` instead of the dtype's default, and the record names the issue."""

    tensors: tuple[str, ...]
    """Which of out, dq, dk, dv it affects."""
    tolerance: float
    """Max abs error accepted for those tensors (against the float64 reference)."""
    description: str
    """What the library does, where (file and line of the installed version)."""


class Runner(Protocol):
    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's piece of a global `[B, L, H, D]` tensor, in the library's layout."""
        ...

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        """The global tensor from every rank's piece (collective)."""
        ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention of local shards `q [B, S, h, D]`, `k`/`v [B, S, h_kv, D]`; autograd."""
        ...

    def context(self) -> contextlib.AbstractContextManager[None]:
        """Entered around a whole step (forward and backward)."""
        ...


class Adapter(Protocol):
    name: str
    """The impl name (`cpbench.config.impls.IMPLS`)."""
    kernel: str
    """The local attention kernel the library runs (recorded as config.kernel)."""

    def capability(self, config: BenchConfig) -> str | None: ...

    def installed(self) -> str | None: ...

    def version(self) -> str | None: ...

    def known_issues(self, config: BenchConfig) -> tuple[KnownIssue, ...]: ...

    def prepare(self, config: BenchConfig) -> Runner: ...


# ----------------------------------------------------------------------------- shared pieces


@dataclass(frozen=True)
class AdapterDefaults:
    """The `Adapter` of a library with no rule, nothing to install and no known issue; each
    adapter overrides what its library has, and `version` reads `distribution`'s."""

    name: str
    kernel: str = "auto"
    distribution: ClassVar[str] = ""
    """The pip distribution whose version is recorded."""

    def capability(self, config: BenchConfig) -> str | None:
        return None

    def installed(self) -> str | None:
        return None

    def version(self) -> str | None:
        return distribution_version(self.distribution)

    def known_issues(self, config: BenchConfig) -> tuple[KnownIssue, ...]:
        return ()


def cp_group() -> dist.ProcessGroup:
    """The CP group of a measurement: the whole world (a pool or a torchrun world)."""
    world = dist.group.WORLD
    if world is None:
        raise RuntimeError("cp_group() needs an initialised torch.distributed process group")
    return world


@dataclass(frozen=True)
class PositionSharding:
    """Shard / unshard by an explicit map of global token positions per CP rank."""

    positions: Callable[[int], torch.Tensor]
    world: int
    rank: int

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        index = self.positions(self.rank).to(x.device)
        return x.index_select(1, index).contiguous()

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        pieces = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(pieces, local.contiguous(), group=cp_group())
        return reassemble(pieces, torch.cat([self.positions(r) for r in range(self.world)]))


class ShardsByPositions:
    """Mixin of the runners that shard with a `sharding: PositionSharding` field."""

    sharding: PositionSharding

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        return self.sharding.shard(x)

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        return self.sharding.unshard(local)


class NoStepContext:
    """Mixin of the runners that enter nothing around a step."""

    def context(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@dataclass(frozen=True)
class FlashApiRunner(ShardsByPositions, NoStepContext):
    """A runner of a library function with flash-attn's arguments, `attention(q, k, v,
    dropout_p, softmax_scale, causal)` (ring-flash-attn's functions, yunchang's attention)."""

    config: BenchConfig
    attention: Any
    sharding: PositionSharding

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        softmax_scale = default_scale(self.config.head_dim)
        return self.attention(
            q, k, v, dropout_p=0.0, softmax_scale=softmax_scale, causal=self.config.causal
        )


def half_precision_reason(config: BenchConfig, library: str) -> str | None:
    """flash-attn takes fp16/bf16 only, and the ring code built on it relies on that: its
    backward accumulates with `block_dq_buffer.to(torch.float32)`, a copy for fp16/bf16 but
    the buffer itself for float32, which the next block's backward then overwrites."""
    if config.dtype not in HALF_DTYPES:
        return (
            f"{library} runs on flash-attn, which takes fp16/bf16 only (dtype {config.dtype}); "
            f"its ring backward relies on it (`block_dq_buffer.to(torch.float32)` aliases the "
            f"buffer for float32 inputs, which gives wrong gradients)"
        )
    return None


def own_kernel_reason(config: BenchConfig, library: str) -> str | None:
    """External libraries bring their own local kernel: only kernel 'auto' applies."""
    if config.kernel != "auto":
        return (
            f"{library} uses its own attention kernel: kernel must be 'auto' "
            f"(got {config.kernel!r}; kernels select cpbench's own)"
        )
    return None


def no_kv_replication_reason(config: BenchConfig, library: str) -> str | None:
    """Libraries whose all-to-all splits the KV heads over the Ulysses group as they are."""
    if config.ulysses > 1 and config.kv_heads % config.ulysses:
        return (
            f"{library} splits the kv_heads ({config.kv_heads}) over ulysses ({config.ulysses}) "
            f"without KV-head replication: needs kv_heads % ulysses == 0"
        )
    if config.kv_replication not in (None, 1):
        return (
            f"{library} has no KV-head replication: kv_replication must be auto or off "
            f"(got {config.kv_replication})"
        )
    return None


def self_send_reason(config: BenchConfig, library: str) -> str | None:
    """ring-flash-attention's ring code (also in yunchang) posts the last dK/dV hop even on a
    ring of one rank, i.e. a send to itself: NCCL allows it, gloo does not."""
    if config.ring == 1 and config.device == "cpu":
        return (
            f"{library}'s ring backward sends dK/dV to itself on a ring of one rank (R = 1), "
            f"which gloo cannot do (NCCL can): needs ring >= 2 on CPU"
        )
    return None


def mask_reason(
    config: BenchConfig, library: str, layouts: tuple[str, ...] = GLOBAL_LAYOUTS
) -> str | None:
    """External adapters run causal or full attention on the layouts they map: any other mask
    (documents, a sliding window) or a document-aware layout is refused by name, never run with
    the mask dropped (a silently wrong result)."""
    mask = config.mask
    if not mask.plain:
        return (
            f"{library} is not run with the {mask.kind} mask ({mask.label}): its cpbench adapter "
            f"passes only causal or full attention to the library, and a mask is never dropped"
        )
    if config.layout not in layouts:
        return (
            f"{library} has no {config.layout} layout in its cpbench adapter (it maps "
            f"{', '.join(layouts)}): layout must be one of those, got {config.layout}"
        )
    return None


def first_reason(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r), None)


def module_available(name: str) -> bool:
    """Whether the top-level module `name` can be imported, without importing it: already
    imported, or found on sys.path by `importlib.util.find_spec` (for a top-level name it only
    searches the path; a dotted name would import its parents, so only top-level names)."""
    if "." in name:
        raise ValueError(f"module_available takes a top-level module name, got {name!r}")
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # in sys.modules without a __spec__ (a module made at run time)
        return sys.modules.get(name) is not None


def missing_module(*names: str) -> ModuleNotFoundError | None:
    """The error `import` would raise for the first of `names` not available, or None."""
    for name in names:
        if not module_available(name):
            return ModuleNotFoundError(f"No module named {name!r}", name=name)
    return None


def import_library(module: str, hint: Callable[[BaseException], str]) -> ModuleType:
    """Import an optional library in a rank (`prepare`); an ImportError carries the install
    hint `hint` makes of it (what `installed()` would have said had it seen the failure)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(hint(exc)) from exc


def distribution_version(distribution: str) -> str | None:
    """The installed version of a pip distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def bf16_dq_when_fp16_contiguous(config: Any, issue: KnownIssue) -> tuple[KnownIssue, ...]:
    """The issue shared by ring-flash-attn and yunchang's ring: their contiguous-layout
    backward returns dQ cast to bf16, which only shows for fp16 inputs."""
    backward = config.phase == "fwd+bwd"
    if backward and config.layout == "contiguous" and config.dtype == "float16":
        return (issue,)
    return ()
