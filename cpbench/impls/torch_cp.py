"""PyTorch's context parallelism (`context_parallel`, what torchtitan uses) as an implementation.

How a step runs, and its CPU ring handlers: docs/internals.md, "PyTorch context parallelism"."""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cpbench.attention.kernels import default_scale
from cpbench.attention.mesh import group_cache
from cpbench.config.bench import BenchConfig
from cpbench.config.impls import variant
from cpbench.errors import CpbenchError
from cpbench.impls.base import (
    AdapterDefaults,
    cp_group,
    first_reason,
    mask_reason,
    own_kernel_reason,
)

SEQ_DIM = 2
"""The sequence dimension of SDPA's [B, H, S, D] inputs (what torch's CP shards)."""
SHARD_DIM = 1
"""The sequence dimension of cpbench's [B, S, H, D] tensors."""
ROTATE_METHODS = {None: "allgather", "alltoall": "alltoall"}

_ATTENTION = "torch.distributed.tensor.experimental._context_parallel._attention"
_INTERNALS = {
    _ATTENTION: (
        "_templated_ring_attention",
        "_templated_ring_attention_backward",
        "_enable_context_parallel_dispatcher_impl",
        "_disable_context_parallel_dispatcher_impl",
        "_context_parallel_buffers",
        "context_parallel_unshard",
        "set_rotate_method",
        "_cp_options",
        "_DispatchMode",
    ),
    "torch.distributed.tensor.experimental._context_parallel._load_balancer": (
        "_HeadTailLoadBalancer",
    ),
    "torch.distributed.tensor.experimental._context_parallel._sharding_rules": (
        "_op_strategy_context",
    ),
    "torch.distributed.tensor._ops.utils": ("expand_to_full_mesh_op_strategy",),
}


@functools.cache
def _torch_cp() -> types.SimpleNamespace:
    """The pieces of torch's context parallelism this adapter uses (ImportError naming the
    first one missing)."""
    found: dict[str, Any] = {}
    for module_name, names in _INTERNALS.items():
        module = importlib.import_module(module_name)
        for name in names:
            if not hasattr(module, name):
                raise ImportError(f"{module_name}.{name} is missing")
            found[name] = getattr(module, name)
    found["attention"] = importlib.import_module(_ATTENTION)
    return types.SimpleNamespace(**found)


# ------------------------------------------------------------------- the CPU ops on DTensors


def _cpu_ops() -> tuple[Any, Any]:
    aten = torch.ops.aten
    return (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    )


def _ring_forward(
    mesh: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, ...]:
    """torch's ring attention with the CPU flash op as the local kernel (the CPU twin of
    torch's `_scaled_dot_product_ring_flash_attention`)."""
    if attn_mask is not None:
        raise NotImplementedError("context parallel SDPA does not support attn_mask")
    forward_op, _ = _cpu_ops()
    return _torch_cp().attention._templated_ring_attention(
        mesh.get_group(),
        SEQ_DIM,
        forward_op,
        query=query,
        key=key,
        value=value,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def _ring_backward(
    mesh: Any,
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, ...]:
    """torch's ring attention backward with the CPU flash backward op as the local kernel."""
    if attn_mask is not None:
        raise NotImplementedError("context parallel SDPA does not support attn_mask")
    _, backward_op = _cpu_ops()
    return _torch_cp().attention._templated_ring_attention_backward(
        mesh.get_group(),
        SEQ_DIM,
        backward_op,
        grad_out=grad_out,
        grad_out_name="grad_out",
        query=query,
        key=key,
        value=value,
        out=out,
        logsumexp=logsumexp,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def _cpu_sdpa_handler(op_call: Any, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
    """DTensor custom-op handler of the CPU ops: the same steps as torch's `_sdpa_handler`
    (unwrap, propagate the sharding, run the ring on the local shards, wrap)."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    dispatcher = DTensor._op_dispatcher
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if sharding is None or sharding.needs_redistribute:
        raise RuntimeError(f"{op_call}: inputs must be sharded on the sequence dimension")
    forward_op, _ = _cpu_ops()
    # The op's arguments, unwrapped from DTensors: torch types them as plain objects.
    ring: Callable[..., tuple[torch.Tensor, ...]] = (
        _ring_forward if op_call is forward_op else _ring_backward
    )
    local = ring(op_info.compute_mesh, *op_info.local_args, **op_info.local_kwargs)
    return dispatcher.wrap(local, sharding.output_spec)


def _sequence_strategy(op_schema: Any, outputs: int, inputs: int, validate: bool) -> Any:
    """The op's `outputs` outputs and `inputs` inputs all sharded on the sequence dimension."""
    from torch.distributed.tensor import Shard  # noqa: PLC0415

    mesh = op_schema.get_mesh_from_args(validate=validate)
    return _torch_cp().expand_to_full_mesh_op_strategy(
        mesh, op_schema, [[Shard(SEQ_DIM)] * (outputs + inputs)], input_index=outputs
    )


def _forward_strategy(op_schema: Any) -> Any:
    """(out, logsumexp) and (q, k, v)."""
    return _sequence_strategy(op_schema, 2, 3, validate=True)


def _backward_strategy(op_schema: Any) -> Any:
    """(dq, dk, dv) and (dout, q, k, v, out, logsumexp)."""
    return _sequence_strategy(op_schema, 3, 6, validate=False)


@contextlib.contextmanager
def cpu_ops_registered() -> Iterator[None]:
    """Handlers and sharding strategies for the CPU flash ops while the block runs."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    cp = _torch_cp()
    forward_op, backward_op = _cpu_ops()
    dispatcher = DTensor._op_dispatcher
    previous = dispatcher._custom_op_handlers
    with (
        cp._op_strategy_context(forward_op, _forward_strategy),
        cp._op_strategy_context(backward_op, _backward_strategy),
    ):
        dispatcher._custom_op_handlers = {
            **previous,
            forward_op: _cpu_sdpa_handler,
            backward_op: _cpu_sdpa_handler,
        }
        try:
            yield
        finally:
            dispatcher._custom_op_handlers = previous


_ACTIVE: list[object] = []


@contextlib.contextmanager
def context_parallel_enabled(mesh: Any, load_balance: bool, rotate: str) -> Iterator[None]:
    """What `context_parallel(mesh, ...)` does around its body, minus sharding buffers: the
    options (load balancing, rotation), the SDPA patch and the DTensor dispatcher; plus the
    CPU op handlers. Restores torch's global state on exit."""
    cp = _torch_cp()
    options = cp._cp_options
    saved = (options.enable_load_balance, options.rotate_method, cp.attention._dispatch_mode)
    options.enable_load_balance = load_balance
    cp.set_rotate_method(rotate)
    cp.attention._dispatch_mode = cp._DispatchMode.MONKEY_PATCH  # as context_parallel sets it
    cp._enable_context_parallel_dispatcher_impl(seq_dim=SEQ_DIM, mesh=mesh)
    token = object()
    _ACTIVE.append(token)
    try:
        with cpu_ops_registered():
            yield
    finally:
        _ACTIVE.remove(token)
        cp._disable_context_parallel_dispatcher_impl()
        options.enable_load_balance, options.rotate_method, cp.attention._dispatch_mode = saved


@group_cache
def _device_mesh(device_type: str) -> Any:
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    return DeviceMesh.from_group(cp_group(), device_type)


# ------------------------------------------------------------------------------- the adapter


@dataclass(frozen=True)
class TorchCpRunner:
    mesh: Any
    config: BenchConfig
    load_balancer: Any
    rotate: str

    @property
    def load_balance(self) -> bool:
        return self.load_balancer is not None

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        (local,) = _torch_cp()._context_parallel_buffers(
            self.mesh, [x], [SHARD_DIM], self.load_balancer
        )
        return local.contiguous()

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        # context_parallel_unshard creates the default (head-tail) balancer when given None
        # and the global option is on: pin the option to this runner's choice.
        options = _torch_cp()._cp_options
        saved, options.enable_load_balance = options.enable_load_balance, self.load_balance
        try:
            (full,) = _torch_cp().context_parallel_unshard(
                self.mesh, [local.contiguous()], [SHARD_DIM], self.load_balancer
            )
        finally:
            options.enable_load_balance = saved
        return full

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not _ACTIVE:
            raise CpbenchError("torch_cp: forward must run inside runner.context()")
        c = self.config
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=c.causal,
            scale=default_scale(c.head_dim),
            enable_gqa=c.kv_heads != c.heads,
        )
        return out.transpose(1, 2)

    def context(self) -> contextlib.AbstractContextManager[None]:
        return context_parallel_enabled(self.mesh, self.load_balance, self.rotate)


@dataclass(frozen=True)
class TorchCpAdapter(AdapterDefaults):
    kernel: str = "sdpa"

    @property
    def rotate(self) -> str:
        return ROTATE_METHODS[variant(self.name)]

    def capability(self, config: BenchConfig) -> str | None:
        return first_reason(
            mask_reason(config, "torch_cp"),
            own_kernel_reason(config, "torch_cp"),
            self._layout_reason(config),
            self._math_fallback_reason(config),
        )

    @staticmethod
    def _math_fallback_reason(config: BenchConfig) -> str | None:
        """float32 GQA on CUDA: SDPA picks no fused kernel (`select_sdp_backend` in aten's
        cuda/sdp_utils.cpp; GQA is flash-only, pytorch#139586, mem-efficient GQA is
        pytorch#191085, after 2.12), and context_parallel rings the fused ops only
        (`_sdpa_handler`): the math kernel runs on the sharded DTensors, not the ring."""
        if config.device != "cuda" or config.dtype != "float32" or config.kv_heads == config.heads:
            return None
        return (
            f"torch_cp in float32 with GQA (heads {config.heads}, kv_heads {config.kv_heads}) "
            f"on CUDA is not ring attention: no fused CUDA SDPA kernel takes float32 GQA "
            f"(flash and cuDNN need fp16/bf16, the memory-efficient kernel needs equal head "
            f"counts), so SDPA falls to its math kernel, which context_parallel does not ring; "
            f"use bfloat16/float16 or kv_heads = heads"
        )

    @staticmethod
    def _layout_reason(config: BenchConfig) -> str | None:
        if config.ulysses != 1:
            return (
                f"torch_cp is ring attention only (torch's context_parallel has no Ulysses "
                f"all-to-all): needs ulysses = 1, got {config.ulysses}"
            )
        if config.causal and config.layout == "striped":
            return (
                "torch_cp balances a causal mask with its head-tail load balancer (layout "
                "zigzag) or not at all (contiguous); striped has no SDPA load balancer"
            )
        if not config.causal and config.layout != "contiguous":
            return (
                f"torch_cp shards a full mask without load balancing (torch raises "
                f"'Load balancing requires `is_causal=True`'): layout must be contiguous, "
                f"got {config.layout}"
            )
        return None

    def installed(self) -> str | None:
        try:
            _torch_cp()
        except (ImportError, AttributeError) as exc:
            return (
                f"torch {torch.__version__} lacks what the torch_cp adapter uses of "
                f"torch.distributed.tensor.experimental._context_parallel ({exc}); it follows "
                f"torch 2.13"
            )
        return None

    def version(self) -> str | None:
        return torch.__version__

    def prepare(self, config: BenchConfig) -> TorchCpRunner:
        mesh = _device_mesh(config.device)
        balancer = None
        if config.causal and config.layout == "zigzag":
            balancer = _torch_cp()._HeadTailLoadBalancer(
                config.seq_len, config.world_size, config.device
            )
        return TorchCpRunner(mesh, config, balancer, self.rotate)
