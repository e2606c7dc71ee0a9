"""Counting the bytes handed to torch.distributed: cpbench's own schemes and external libraries
alike, at the same boundary (why it is wrapped as it is: docs/internals.md).

What is recorded, per call and rank (the convention of `cpbench.model.formulas`: what this rank's
data must deliver to other ranks), measured from the tensors and the group the call receives, not
from what the caller says it sends:

| entry point | bytes recorded |
|---|---|
| isend / send (also inside batch_isend_irecv) | the sent tensor (0 when sent to itself) |
| all_to_all_single | the input minus this rank's own part (split sizes honoured) |
| all_to_all | the input list minus this rank's own entry |
| all_gather(_into_tensor), functional all_gather_single (older torch: _tensor) | input x (group size - 1) |
| reduce_scatter(_tensor), functional reduce_scatter_single (older: _tensor) | input x (n - 1) / n |
| all_reduce (dist and functional) | 2 x tensor x (n - 1) / n (ring) |
| broadcast | tensor x (n - 1) on the source, 0 elsewhere |

Receives are not counted (every byte is counted once, by its sender). Tags: the kind of call
(`p2p`, `all_to_all`, ...), or, while cpbench's own scheme announces the collective with
`labelled(tag)` (`cpbench.attention.comm` does around each call), that tag: the name the analytic
model gives the collective (`a2a_qkv`, `p2p_kv`, ...), so the two compare per collective."""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as ft_c
import torch.distributed.distributed_c10d as c10d

from cpbench.compat import functional_collectives

Recorder = Callable[[str, int], None]
Counter = Callable[[tuple, dict], None]
_P2P = ("isend", "send")


@dataclass
class ByteCounter:
    """Bytes sent by this rank (the module docstring's table), keyed by (phase, collective
    tag); the caller sets the phase (`with counter.phase("bwd"): loss.backward()`)."""

    current_phase: str = "fwd"
    bytes: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self.current_phase = self.current_phase, name
        try:
            yield
        finally:
            self.current_phase = previous

    def record(self, tag: str, nbytes: int) -> None:
        self.bytes[(self.current_phase, tag)] += nbytes
        self.calls[(self.current_phase, tag)] += 1

    def total(self, phase: str | None = None) -> int:
        return sum(b for (p, _), b in self.bytes.items() if phase is None or p == phase)

    def as_dict(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (p, tag), b in sorted(self.bytes.items()):
            out[p][tag] = b
        return dict(out)


_LABELS: list[str] = []
"""The collective cpbench's scheme is calling now (innermost last); empty outside its calls."""


@contextlib.contextmanager
def labelled(tag: str) -> Iterator[None]:
    """Record what torch.distributed receives inside the block under `tag` (the analytic
    model's name of the collective) instead of the kind of call."""
    _LABELS.append(tag)
    try:
        yield
    finally:
        _LABELS.pop()


def _labelling(record: Recorder) -> Recorder:
    def labelled_record(kind: str, nbytes: int) -> None:
        record(_LABELS[-1] if _LABELS else kind, nbytes)

    return labelled_record


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _world() -> dist.ProcessGroup:
    world = dist.group.WORLD
    if world is None:
        raise RuntimeError("byte counting needs an initialised torch.distributed process group")
    return world


def _group_size(group: Any) -> int:
    if group is None or isinstance(group, dist.ProcessGroup):
        return dist.get_world_size(group)
    if isinstance(group, (list, tuple)):
        return len(group)
    size = getattr(group, "size", None)  # a DeviceMesh
    if callable(size):
        return int(size())
    return dist.get_world_size(c10d._resolve_process_group(ft_c._resolve_group_name(group)))


def _group_rank(group: Any) -> int:
    if group is None or isinstance(group, dist.ProcessGroup):
        return dist.get_rank(group)
    if isinstance(group, (list, tuple)):
        return list(group).index(dist.get_rank())
    get_rank = getattr(group, "get_local_rank", None)  # a DeviceMesh
    if callable(get_rank):
        return int(get_rank())
    return dist.get_rank(c10d._resolve_process_group(ft_c._resolve_group_name(group)))


def _all_to_all_bytes(tensor: torch.Tensor, splits: Any, group: Any) -> int:
    n, me = _group_size(group), _group_rank(group)
    total = _nbytes(tensor)
    if not splits:
        return total * (n - 1) // n
    row = total // max(1, tensor.shape[0])
    return sum(int(s) * row for i, s in enumerate(splits) if i != me)


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def _counters(record: Recorder) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """(torch.distributed's entry points, the functional collectives'): name -> what to record
    for a call (args, kwargs), each count reading its tensor and group at the call's positions."""

    def sent(a: tuple, k: dict) -> None:
        dst, group = _arg(a, k, 1, "dst"), _arg(a, k, 2, "group")
        if dst is None:
            dst = dist.get_global_rank(group or _world(), _arg(a, k, 4, "group_dst"))
        if dst != dist.get_rank():  # a send to itself (NCCL allows it) crosses no link
            record("p2p", _nbytes(_arg(a, k, 0, "tensor")))

    def a2a_single(index: int, name: str, splits_index: int, group_index: int) -> Counter:
        def count(a: tuple, k: dict) -> None:
            splits = _arg(a, k, splits_index, "input_split_sizes")
            group = _arg(a, k, group_index, "group")
            record("all_to_all", _all_to_all_bytes(_arg(a, k, index, name), splits, group))

        return count

    def a2a_list(a: tuple, k: dict) -> None:
        inputs = _arg(a, k, 1, "input_tensor_list")
        me = _group_rank(_arg(a, k, 2, "group"))
        record("all_to_all", sum(_nbytes(t) for i, t in enumerate(inputs) if i != me))

    def gather(index: int, name: str, group_index: int) -> Counter:
        def count(a: tuple, k: dict) -> None:
            n = _group_size(_arg(a, k, group_index, "group"))
            record("all_gather", _nbytes(_arg(a, k, index, name)) * (n - 1))

        return count

    def scatter(index: int, name: str, group_index: int) -> Counter:
        def count(a: tuple, k: dict) -> None:
            n = _group_size(_arg(a, k, group_index, "group"))
            x = _arg(a, k, index, name)
            size = sum(_nbytes(t) for t in x) if isinstance(x, (list, tuple)) else _nbytes(x)
            record("reduce_scatter", size * (n - 1) // n)

        return count

    def reduce(index: int, name: str, group_index: int) -> Counter:
        def count(a: tuple, k: dict) -> None:
            n = _group_size(_arg(a, k, group_index, "group"))
            record("all_reduce", 2 * _nbytes(_arg(a, k, index, name)) * (n - 1) // n)

        return count

    def bcast(a: tuple, k: dict) -> None:
        group = _arg(a, k, 2, "group")
        src, group_src = _arg(a, k, 1, "src"), _arg(a, k, 4, "group_src")
        source = dist.get_rank() == src if src is not None else _group_rank(group) == group_src
        if source:
            record("broadcast", _nbytes(_arg(a, k, 0, "tensor")) * (_group_size(group) - 1))

    distributed = {
        "isend": sent,
        "send": sent,
        "all_to_all_single": a2a_single(1, "input", 3, 4),
        "all_to_all": a2a_list,
        "all_gather": gather(1, "tensor", 2),
        "all_gather_into_tensor": gather(1, "input_tensor", 2),
        "all_gather_single": gather(1, "input_tensor", 2),
        "reduce_scatter": scatter(1, "input_list", 3),
        "reduce_scatter_tensor": scatter(1, "input", 3),
        "reduce_scatter_single": scatter(1, "input", 3),
        "all_reduce": reduce(0, "tensor", 2),
        "broadcast": bcast,
    }
    functional = {
        "all_to_all_single": a2a_single(0, "self", 2, 3),
        "all_gather_single": gather(0, "self", 2),
        "reduce_scatter_single": scatter(0, "self", 3),
        "all_reduce": reduce(0, "self", 2),
    }
    return distributed, functional


def _wrap(original: Callable, count: Counter) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count(args, kwargs)
        return original(*args, **kwargs)

    return wrapper


def _batch_wrapper(original: Callable, isend: Callable, counted_isend: Callable) -> Callable:
    """`batch_isend_irecv` that runs every send op through `counted_isend` (see the module
    docstring: a P2POp built before counting holds the original `isend`)."""

    @functools.wraps(original)
    def wrapper(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        sends = [op for op in p2p_op_list if op.op is isend or op.op is counted_isend]
        for op in sends:
            op.op = counted_isend
        try:
            return original(p2p_op_list, *args, **kwargs)
        finally:
            for op in sends:
                op.op = isend

    return wrapper


@contextlib.contextmanager
def boundary_counting(counter: ByteCounter) -> Iterator[ByteCounter]:
    """Record into `counter` what this process hands to torch.distributed while the block
    runs (tags: p2p, all_to_all, all_gather, reduce_scatter, all_reduce, broadcast, or the
    `labelled` collective; phases as set with `counter.phase`). Restores every wrapped
    function on exit."""
    patched: list[tuple[Any, str, Any]] = []
    counters, functional = _counters(_labelling(counter.record))
    try:
        for name, count in counters.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            wrapper = _wrap(original, count)
            # Point-to-point sends in both namespaces (see docs/internals.md); collectives
            # only in torch.distributed, because some of them call each other inside c10d
            # (all_gather_into_tensor -> all_gather_single) and must be counted once.
            modules = (dist, c10d) if name in _P2P else (dist,)
            for module in modules:
                if getattr(module, name, None) is original:
                    patched.append((module, name, original))
                    setattr(module, name, wrapper)
        isend = next((o for m, n, o in patched if n == "isend"), None)
        if isend is not None:
            batch = _batch_wrapper(dist.batch_isend_irecv, isend, dist.isend)
            for namespace in (dist, c10d):
                patched.append((namespace, "batch_isend_irecv", namespace.batch_isend_irecv))
                namespace.batch_isend_irecv = batch  # type: ignore[attr-defined]
        # The functional names differ across torch versions (all_gather_tensor before
        # all_gather_single...): `cpbench.compat` names the one this torch calls.
        for entry, attribute in functional_collectives().items():
            original = getattr(ft_c, attribute)
            patched.append((ft_c, attribute, original))
            setattr(ft_c, attribute, _wrap(original, functional[entry]))
        yield counter
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)
