"""The reference check on the ranks, against the float64 single-process reference under the same
mask (output and dQ/dK/dV). Masks, padding and impls: docs/design.md section 7."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from cpbench.config.bench import BenchConfig, VerifyCase
from cpbench.config.impls import DEFAULT_IMPL, check_impl
from cpbench.config.masks import MaskSpec
from cpbench.config.tolerances import (
    ABSOLUTE_FLOOR,
    CHECKED_TENSORS,
    allowed_error,
    rounded_terms,
)
from cpbench.config.vocabulary import DTYPES, GLOBAL_LAYOUTS
from cpbench.errors import CpbenchError, KernelRefused

C = TypeVar("C")

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
"""torch dtype of each `Dtype` literal (each is the name of a torch dtype)."""


def error_bound(
    dtype: str, reference: torch.Tensor, terms: int, length: int, absolute: float | None = None
) -> float:
    """Allowed max abs error for one tensor (`cpbench.config.tolerances.allowed_error`) of the
    reference's largest magnitude."""
    return allowed_error(dtype, float(reference.abs().max()), terms, length, absolute)


def impl_mask_unsupported(impl: str, mask: MaskSpec, layout: str) -> str | None:
    """Why an external impl cannot run a mask or layout (None for cpbench's own, or a plain
    mask on a global layout): the adapters pass no mask, so the check would be of another
    attention."""
    if impl == DEFAULT_IMPL:
        return None
    if not mask.plain:
        return f"impl {impl!r} takes no {mask.kind} mask ({mask.label}): only causal or full"
    if layout not in GLOBAL_LAYOUTS:
        return f"impl {impl!r} has no {layout} layout (only {', '.join(GLOBAL_LAYOUTS)})"
    return None


def _input_key(case: VerifyCase) -> tuple[int, ...]:
    """Everything `_global_inputs` reads: cases with equal keys get equal inputs (seed, batch,
    run length, heads, KV heads, head dim)."""
    n = case.packing.seq_len if case.impl == DEFAULT_IMPL else case.seq_len
    return (case.seed, case.batch, n, case.heads, case.kv_heads, case.head_dim)


def _global_inputs(case: VerifyCase, device: torch.device) -> tuple[torch.Tensor, ...]:
    seed, b, n, heads, kv_heads, d = _input_key(case)
    g = torch.Generator().manual_seed(seed)  # q, k, v, dout drawn in that order
    shapes = [(b, n, h, d) for h in (heads, kv_heads, kv_heads, heads)]
    return tuple(torch.randn(shape, generator=g).to(device) for shape in shapes)


def _grads(leaves: list[torch.Tensor], who: str) -> list[torch.Tensor]:
    """The gradients of q, k, v after the backward (an error when one is missing)."""
    grads = [x.grad for x in leaves]
    present = [g for g in grads if g is not None]
    if len(present) != len(grads):
        raise CpbenchError(f"{who}: the backward produced no gradient for q, k or v")
    return present


def _run_cpbench(case: VerifyCase, inputs: tuple, mesh: Any = None) -> list[torch.Tensor]:
    from cpbench.attention import build_mesh, cp_attention, shard, unshard  # noqa: PLC0415

    mesh = mesh if mesh is not None else build_mesh(case.ulysses, case.ring)
    dtype = TORCH_DTYPES[case.dtype]
    mask, layout = case.mask, case.layout
    q, k, v, dout = inputs
    local = [shard(t, mesh, layout, mask=mask).to(dtype).requires_grad_(True) for t in (q, k, v)]
    lq, lk, lv = local
    out = cp_attention(
        lq, lk, lv, mesh, layout=layout, kernel=case.kernel, mask=mask, cp_comm=case.cp_comm,
        heads_k_stride=case.heads_k_stride,
    )  # fmt: skip
    out.backward(shard(dout, mesh, layout, mask=mask).to(dtype))
    grads = _grads(local, case.impl)
    return [unshard(t, mesh, layout, mask=mask) for t in (out.detach(), *grads)]


def _run_impl(case: VerifyCase, runner: Any, inputs: tuple) -> list[torch.Tensor]:
    """The case through an impl adapter's runner: its layout, its step context."""
    dtype = TORCH_DTYPES[case.dtype]
    q, k, v, dout = inputs
    local = [runner.shard(t).to(dtype).requires_grad_(True) for t in (q, k, v)]
    with runner.context():
        out = runner.forward(*local)
        out.backward(runner.shard(dout).to(dtype))
    grads = _grads(local, case.impl)
    return [runner.unshard(t) for t in (out.detach(), *grads)]


CHECKED = CHECKED_TENSORS
"""The tensors every check compares, in the order the runs return them."""


REFERENCE_MEMO_BYTES = 64 * 2**20
"""The most bytes of float64 references a `ReferenceMemo` keeps; a larger one is not kept."""


class ReferenceMemo:
    """The float64 references of one batch of verify cases, computed once per problem: a
    verify matrix runs each problem on every mesh and layout (up to 20 cases of one problem at
    8 ranks), and all share one reference. Made per batch and dropped with it (nothing stays
    on a device afterwards), least recently used first out past `REFERENCE_MEMO_BYTES`."""

    def __init__(self) -> None:
        self.references: OrderedDict[tuple[object, ...], list[torch.Tensor]] = OrderedDict()
        """The kept references by key (see `reference_results`), least recently used first."""

    def get(self, key: tuple[object, ...]) -> list[torch.Tensor] | None:
        refs = self.references.get(key)
        if refs is not None:
            self.references.move_to_end(key)
        return refs

    def keep(self, key: tuple[object, ...], refs: list[torch.Tensor]) -> None:
        if _memo_bytes(refs) > REFERENCE_MEMO_BYTES:
            return
        self.references[key] = refs
        while sum(map(_memo_bytes, self.references.values())) > REFERENCE_MEMO_BYTES:
            self.references.popitem(last=False)


def _memo_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors)


def reference_results(
    case: VerifyCase, inputs: tuple[torch.Tensor, ...], memo: ReferenceMemo | None = None
) -> list[torch.Tensor]:
    """The float64 reference's out, dQ, dK, dV (`CHECKED` order) of the case's global inputs
    rounded to its dtype, under the mask it runs (doc_zigzag's padding documents included; an
    impl's own mask otherwise). With a `memo`, computed once per problem (the key below);
    `inputs` must then be the case's own global inputs."""
    from cpbench.attention import reference_attention  # noqa: PLC0415

    mask = case.packing.mask if case.impl == DEFAULT_IMPL else case.mask
    q, k, v, dout = inputs
    key = (*_input_key(case), case.dtype, case.causal, mask, str(q.device))
    kept = memo.get(key) if memo is not None else None
    if kept is not None:
        return kept
    dtype = TORCH_DTYPES[case.dtype]
    ref_inputs = [t.to(dtype).double().requires_grad_(True) for t in (q, k, v)]
    ref_q, ref_k, ref_v = ref_inputs
    ref_out = reference_attention(ref_q, ref_k, ref_v, causal=case.causal, mask=mask)
    ref_out.backward(dout.to(dtype).double())
    refs = [ref_out.detach(), *_grads(ref_inputs, "reference")]
    if memo is not None:
        memo.keep(key, refs)
    return refs


def judge(
    case: VerifyCase,
    results: list[torch.Tensor],
    references: list[torch.Tensor],
    absolute: dict[str, float],
) -> dict[str, Any]:
    """The verdict on one case: each of out, dQ, dK, dV (`results`, gathered, in `CHECKED`
    order) against its float64 reference, under the error model's bound for the case's dtype,
    length, ring degree and GQA group (`cpbench.config.tolerances`); `absolute` per tensor (the
    floor, or an impl's known-issue allowance). Pure: no communication.

    Returns errors (max abs error per tensor), bounds (`error_bound` per tensor), max_error,
    tolerance (the largest bound) and passed (every tensor within its own bound)."""
    if len(results) != len(CHECKED) or len(references) != len(CHECKED):
        raise CpbenchError(
            f"the judge compares {len(CHECKED)} tensors ({', '.join(CHECKED)}): got "
            f"{len(results)} results and {len(references)} references"
        )
    errors = {
        name: float((got.double() - ref).abs().max())
        for name, got, ref in zip(CHECKED, results, references, strict=True)
    }
    group = case.heads // case.kv_heads
    length = references[0].shape[1]  # the run length (doc_zigzag's padding included)
    bounds = {
        name: error_bound(
            case.dtype, ref, rounded_terms(name, case.ring, group), length, absolute[name]
        )
        for name, ref in zip(CHECKED, references, strict=True)
    }
    return {
        "errors": errors,
        "max_error": max(errors.values()),
        "bounds": bounds,
        "tolerance": max(bounds.values()),
        "passed": all(errors[n] <= bounds[n] for n in CHECKED),
    }


def run_case_on_rank(
    case: VerifyCase, device: torch.device, memo: ReferenceMemo | None = None, mesh: Any = None
) -> dict | None:
    """Collective: run one case on every rank; rank 0 returns the errors, others None. `memo`:
    the batch's references (`reference_results`). `mesh` (cpbench's own schemes): a CP mesh of
    a subgroup of the world to run it on instead (collective over that group; its rank 0
    returns the errors)."""
    unsupported = impl_mask_unsupported(case.impl, case.mask, case.layout)
    if unsupported:
        raise CpbenchError(unsupported)
    if mesh is not None and case.impl != DEFAULT_IMPL:
        raise CpbenchError(f"impl {case.impl!r} runs on the whole world, not a CP subgroup")
    inputs = _global_inputs(case, device)
    tolerances = dict.fromkeys(CHECKED, ABSOLUTE_FLOOR)
    known: list[str] = []
    if case.impl == DEFAULT_IMPL:
        gathered = _run_cpbench(case, inputs, mesh)
    else:
        from cpbench.impls import get_adapter  # noqa: PLC0415

        adapter = get_adapter(check_impl(case.impl))
        config = case.bench_config("cuda" if device.type == "cuda" else "cpu")
        gathered = _run_impl(case, adapter.prepare(config), inputs)
        for issue in adapter.known_issues(config):
            known.append(issue.description)
            for name in issue.tensors:
                tolerances[name] = max(tolerances[name], issue.tolerance)
    if (mesh.rank if mesh is not None else dist.get_rank()) != 0:
        return None
    refs = reference_results(case, inputs, memo)
    verdict = judge(case, gathered, refs, tolerances)
    result = {**_case_fields(case), **verdict}
    if known:
        result["tolerances"] = tolerances
        result["known_issues"] = known
    return result


def _case_fields(case: VerifyCase) -> dict[str, Any]:
    """What every record of a verify case starts with: the case, its scheme, label and mask."""
    return {**asdict(case), "scheme": case.scheme, "label": case.label, "mask": case.mask.label}


def run_batch(
    cases: Sequence[C], run: Callable[[C], dict | None], fields: Callable[[C], dict[str, Any]]
) -> list[dict | None]:
    """Every case runner's batch (a pool task's body): `run` each case in order; a CpbenchError
    in one case is recorded, its `fields` then passed False and the error, not raised; a
    kernel's refusal (`KernelRefused`: it cannot run the case, said before it ran) is recorded
    skipped, passed None and the reason."""
    out: list[dict | None] = []
    for case in cases:
        try:
            out.append(run(case))
        except KernelRefused as exc:
            out.append({**fields(case), "passed": None, "skipped": str(exc)})
        except CpbenchError as exc:  # deterministic on every rank: no collective is left open
            out.append({**fields(case), "passed": False, "error": str(exc)})
    return out


def run_cases_on_rank(cases: list[VerifyCase], device: str = "cpu") -> list[dict | None]:
    """Pool task: run a batch of cases; an exception in one case is recorded, not raised."""
    dev = torch.device(device)
    memo = ReferenceMemo()  # rank 0's references, one per problem of the batch
    return run_batch(cases, lambda case: run_case_on_rank(case, dev, memo), _case_fields)


def torch_device(config: BenchConfig) -> torch.device:
    if config.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agreed(fn: Callable[[], Any], device: torch.device) -> Any:
    """Run `fn` on every rank; when it raises on any rank, raise on every rank.

    The reference check ends with work only rank 0 does (the float64 reference, the likeliest
    place to run out of memory); without this agreement the other ranks would walk into the
    timing collectives alone and hang there until a timeout kills them all."""
    error: Exception | None = None
    value = None
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
        error = exc
    flag = torch.tensor([0.0 if error is None else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if flag.item() > 0:
        raise CpbenchError("another rank failed during the reference check")
    return value


def random_shards(config: BenchConfig, device: torch.device) -> tuple[torch.Tensor, ...]:
    """This rank's q, k, v (requiring grad when the phase has a backward) and dout: random
    local shards of the configuration's shape (values do not matter for timing), of the run
    length (doc_zigzag's padding included)."""
    dtype = TORCH_DTYPES[config.dtype]
    local_len = config.run_len // config.world_size
    g = torch.Generator(device=device).manual_seed(1000 + dist.get_rank())
    backward = config.phase == "fwd+bwd"

    def rand(heads: int) -> torch.Tensor:
        shape = (config.batch, local_len, heads, config.head_dim)
        return torch.randn(shape, generator=g, device=device, dtype=dtype)

    q, k, v = (
        rand(h).requires_grad_(backward) for h in (config.heads, config.kv_heads, config.kv_heads)
    )
    return q, k, v, rand(config.heads)


VERIFIED_FIELDS = (
    "ulysses", "ring", "layout", "causal", "heads", "kv_heads", "head_dim", "batch", "dtype",
    "kernel", "impl", "window", "cp_comm", "heads_k_stride",
)  # fmt: skip
"""The fields a benchmark point's reference check takes from the point as they are."""


def reference_check(
    config: BenchConfig, check_len: int, device: torch.device
) -> dict[str, Any] | None:
    """The record's `accuracy` (rank 0; None elsewhere): the configuration, at `check_len`
    tokens, through the same path as `cpbench verify` — cpbench's or the impl's adapter —
    under the point's mask on those tokens (`MaskSpec.truncated`: the documents that start
    before `check_len`, the last one cut; the window unchanged)."""
    shared = {name: getattr(config, name) for name in VERIFIED_FIELDS}
    documents = None if config.documents is None else config.mask.truncated(check_len).documents
    case = VerifyCase(**shared, seq_len=check_len, documents=documents)
    result = run_case_on_rank(case, device)
    if result is None:
        return None
    kept = ("tolerance", "bounds", "passed", "tolerances", "known_issues")
    return {
        "max_abs_error": result["max_error"],
        "errors": result["errors"],
        "check_seq_len": case.seq_len,
        **{key: result[key] for key in kept if key in result},
    }
