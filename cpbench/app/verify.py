"""`cpbench verify`: every scheme x layout x mask x GQA case a world size allows, checked
against the single-process reference. The cases: docs/design.md section 7."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from cpbench.attention.kernels import kernel_unavailable
from cpbench.bench.reference import TORCH_DTYPES, impl_mask_unsupported, run_cases_on_rank
from cpbench.config.bench import VerifyCase, check_choice, factorizations
from cpbench.config.constraints import required_kv_replication
from cpbench.config.impls import DEFAULT_IMPL, check_impl
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import CP_COMMS, DTYPES, LAYOUTS, Backend, CpComm, Device, Dtype
from cpbench.errors import CpbenchError

MASK_KV_HEADS = (8, 2, 1)
"""GQA shapes of the mask cases (8 query heads): MHA, ratio 4, one KV head (fewer than the
ranks: KV replication wherever U > 1)."""


@dataclass(frozen=True)
class VerifyRow:
    """One case's record of `cpbench verify`, typed (`from_record`): what the verdict, the
    table and the exit code read. The runners produce the record (the case's fields, then its
    verdict: `bench.reference.run_case_on_rank`, `run_batch`, `skipped_case`, the inference
    runners); it is kept whole, in its keys' order, for `to_dict` (`--json` prints that)."""

    label: str
    """The case in words (`VerifyCase.label`, or the inference case's)."""
    passed: bool | None
    """Every tensor within its bound; False for a failed or a raising case; None when the
    case was skipped."""
    scheme: str | None = None
    """ring | ulysses | usp | all_gather (training), or the prefill or decode scheme."""
    ulysses: int | None = None
    """Ulysses degree U of a training case's U x R mesh."""
    ring: int | None = None
    """Ring degree R of a training case's mesh."""
    layout: str | None = None
    """How a training case's sequence is cut over the ring."""
    mask: str | None = None
    """The mask in words (`MaskSpec.label`); None in a record that only says `causal`."""
    causal: bool | None = None
    """Causal (else full) attention."""
    heads: int | None = None
    """Query heads."""
    kv_heads: int | None = None
    """Key/value heads."""
    errors: Mapping[str, float] = field(default_factory=dict)
    """Max absolute error per tensor (out, dq, dk, dv); empty when the case did not run."""
    max_error: float | None = None
    """The largest of `errors` (or an inference case's output error)."""
    tolerance: float | None = None
    """The largest per-tensor bound; None when the case did not run."""
    skipped: str | None = None
    """Why the case was not run (the impl's or the kernel's rule); None when it ran."""
    error: str | None = None
    """What went wrong when the case raised; None otherwise."""
    known_issues: tuple[str, ...] = ()
    """Documented upstream issues that loosened a gradient's bound."""
    inference: str | None = None
    """prefill | decode for an inference case (`--inference`); None for a training case."""
    new_token_layout: str | None = None
    """A prefill case's layout of the new tokens."""
    merge: str | None = None
    """A decode case's merge of the partial results."""
    bytes_match: bool | None = None
    """An inference case's bytes sent equal the analytic bytes."""
    record: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The record as its runner produced it: every key, in order (`to_dict`)."""

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> VerifyRow:
        """The row of one case's record; a field of the wrong type raises ValueError naming
        the case and the field."""
        label = record.get("label")
        if not isinstance(label, str):
            raise ValueError(f"verify record without a label: {dict(record)!r:.200}")

        def get(key: str, *types: type) -> Any:
            """The record's value of `key` (None when absent), if of one of `types`; a bool
            is not an int here."""
            value = record.get(key)
            is_bool = isinstance(value, bool)
            if value is None or (isinstance(value, types) and (bool in types or not is_bool)):
                return value
            names = " or ".join(t.__name__ for t in types)
            raise ValueError(f"verify case {label!r}: {key} is {value!r}, not {names}")

        errors = get("errors", Mapping) or {}
        if not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in errors.items()):
            raise ValueError(f"verify case {label!r}: errors must map tensors to numbers")
        issues = get("known_issues", list, tuple) or ()
        if not all(isinstance(i, str) for i in issues):
            raise ValueError(f"verify case {label!r}: known_issues must be strings")
        return cls(
            label=label,
            passed=get("passed", bool),
            scheme=get("scheme", str),
            ulysses=get("ulysses", int),
            ring=get("ring", int),
            layout=get("layout", str),
            mask=get("mask", str),
            causal=get("causal", bool),
            heads=get("heads", int),
            kv_heads=get("kv_heads", int),
            errors=dict(errors),
            max_error=get("max_error", int, float),
            tolerance=get("tolerance", int, float),
            skipped=get("skipped", str),
            error=get("error", str),
            known_issues=tuple(issues),
            inference=get("inference", str),
            new_token_layout=get("new_token_layout", str),
            merge=get("merge", str),
            bytes_match=get("bytes_match", bool),
            record=dict(record),
        )

    def to_dict(self) -> dict[str, Any]:
        """The case's record as its runner produced it (`cpbench verify --json`)."""
        return dict(self.record)


def mask_cases(seq_len: int) -> list[MaskSpec]:
    """The document and window masks `cpbench verify` checks on `seq_len` tokens (which it
    makes a multiple of 8 x world size): the edge cases the ring schedule has to get right.

    * documents (1, 3, 1, L - 28 - ..., 1, 7, 14, 1): single-token documents, documents shorter
      than a zigzag chunk (L / 2R), and one long document that starts on ring rank 0 and ends
      on the last, spanning every rank of a contiguous ring;
    * three documents of uneven lengths (doc_zigzag pads them), alone and with a window of 9;
    * windows 1 (a query sees only itself), 5 (shorter than a chunk), L/4 + 8 (longer than a
      contiguous shard at 4 ranks: it reaches two ranks back) and 8 L (longer than the
      sequence: plain causal, but through the window path).
    """
    short = (1, 3, 1)
    tail = (1, 7, 14, 1)
    long_doc = seq_len - sum(short) - sum(tail)
    third = seq_len // 3
    uneven = (third - 3, third + 5, seq_len - 2 * third - 2)
    if long_doc < 1 or min(uneven) < 1:
        raise CpbenchError(f"mask cases need a longer sequence than {seq_len} tokens")
    return [
        MaskSpec(documents=(*short, long_doc, *tail)),
        MaskSpec(documents=uneven),
        MaskSpec(window=1),
        MaskSpec(window=5),
        MaskSpec(window=seq_len // 4 + 8),
        MaskSpec(window=8 * seq_len),
        MaskSpec(documents=uneven, window=9),
    ]


def default_cases(
    world_size: int,
    dtype: Dtype = "float32",
    kernel: Backend = "auto",
    impl: str = DEFAULT_IMPL,
    masks: bool = True,
    cp_comms: tuple[CpComm, ...] = CP_COMMS,
) -> list[VerifyCase]:
    """The verify matrix: meshes x layouts x causal/full x GQA ratios 1, 2, 4 and KV
    replication, then (`masks`) meshes x layouts x `mask_cases` x `MASK_KV_HEADS`; with
    "all_gather" in `cp_comms` (cpbench's own impl) every ring-axis case once more all-gathered
    (`with_all_gather`).

    With 8 query heads, kv_heads 8, 4, 2 give GQA ratios 1, 2, 4; kv_heads 1 needs KV
    replication whenever U > 1. Infeasible combinations are left out (none with these sizes);
    what an external impl cannot run is kept (reported as skipped by `run_verify`).
    """
    seq_len = 16 * world_size * 2
    plain = [{"causal": causal, "kv_heads": k} for causal in (True, False) for k in (8, 4, 2, 1)]
    cases = _verify_matrix(world_size, plain, seq_len, dtype, kernel, impl)
    if masks:
        cases.extend(_mask_matrix(world_size, seq_len, dtype, kernel, impl))
    if "all_gather" in cp_comms and impl == DEFAULT_IMPL:
        cases.extend(with_all_gather(cases))
    if "p2p" not in cp_comms:
        cases = [c for c in cases if c.cp_comm != "p2p" or c.ring == 1]
    return cases


def with_all_gather(cases: list[VerifyCase]) -> list[VerifyCase]:
    """The all-gather twins of the ring-axis cases (R > 1): every case with
    `cp_comm="all_gather"`, and the causal/full GQA ones whose ranks gather more than one KV
    head also with `heads_k_stride=1` (one head per gather, the next in flight)."""
    twins = []
    for case in cases:
        if case.ring == 1 or case.cp_comm != "p2p":
            continue
        twin = replace(case, cp_comm="all_gather")
        twins.append(twin)
        copies = required_kv_replication(case.kv_heads, case.ulysses) or 1
        per_rank = copies * case.kv_heads // case.ulysses
        if case.mask.plain and per_rank > 1 and case.kv_heads < case.heads:
            twins.append(replace(twin, heads_k_stride=1))
    return twins


def _verify_matrix(
    world_size: int,
    variants: list[dict[str, Any]],
    seq_len: int,
    dtype: Dtype,
    kernel: Backend,
    impl: str,
) -> list[VerifyCase]:
    """The feasible cases of every mesh x layout x variant (the fields a variant sets)."""
    cases = (
        VerifyCase(
            ulysses=ulysses, ring=ring, layout=layout, heads=8, seq_len=seq_len, dtype=dtype,
            kernel=kernel, impl=impl, **variant,
        )
        for ulysses, ring in factorizations(world_size)
        for layout in LAYOUTS
        for variant in variants
    )  # fmt: skip
    return [case for case in cases if case.feasibility.ok]


def _mask_matrix(
    world_size: int, seq_len: int, dtype: Dtype, kernel: Backend, impl: str
) -> list[VerifyCase]:
    variants = [
        {"causal": mask.causal, "kv_heads": k, "documents": mask.documents, "window": mask.window}
        for mask in mask_cases(seq_len)
        for k in MASK_KV_HEADS
    ]
    return _verify_matrix(world_size, variants, seq_len, dtype, kernel, impl)


def skipped_case(case: VerifyCase, reason: str) -> dict:
    """The record of a case an impl cannot run (`passed` None: neither passed nor failed)."""
    return {
        **asdict(case),
        "scheme": case.scheme,
        "label": case.label,
        "mask": case.mask.label,
        "passed": None,
        "skipped": reason,
    }


def split_cases(
    cases: list[VerifyCase], device: Device
) -> tuple[list[VerifyCase], list[dict]]:
    """(cases to run, skipped records): an impl's capability rules and installation.
    Raises CpbenchError when an external impl is not installed at all."""
    from cpbench.impls import get_adapter  # noqa: PLC0415

    runnable: list[VerifyCase] = []
    skipped: list[dict] = []
    for impl in dict.fromkeys(c.impl for c in cases if c.impl != DEFAULT_IMPL):
        hint = get_adapter(check_impl(impl)).installed()
        if hint:
            raise CpbenchError(f"impl {impl!r} cannot run: {hint}")
    for case in cases:
        reason = impl_mask_unsupported(case.impl, case.mask, case.layout) or get_adapter(
            case.impl
        ).capability(case.bench_config(device))
        if reason:
            skipped.append(skipped_case(case, reason))
        else:
            runnable.append(case)
    return runnable, skipped


def run_verify(
    world_size: int,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    kernel: Backend = "auto",
    cases: list[VerifyCase] | None = None,
    timeout: float = 600.0,
    impl: str = DEFAULT_IMPL,
    masks: bool = True,
    cp_comms: tuple[CpComm, ...] = CP_COMMS,
    inference: bool = False,
) -> list[VerifyRow]:
    """Spawn `world_size` ranks once and run every case; returns rank 0's records as rows
    (cases the impl cannot run have `skipped` set and `passed` None). With `inference`, the
    prefill-with-a-cached-prefix cases (`inference_verify.default_prefill_cases`) run after
    them on the same ranks, then the decode steps (`default_decode_cases`); their rows carry
    `inference` "prefill" or "decode".

    Under torchrun or srun the launched processes are the world: every rank calls this and
    runs the cases in place (`world_size` must be the launched world's); every rank returns
    the same records."""
    from cpbench.bench.inference_verify import run_inference_cases_on_rank  # noqa: PLC0415
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415
    from cpbench.bench.world import launched_by_torchrun, launched_world  # noqa: PLC0415

    if world_size < 1:
        raise CpbenchError(f"world size must be at least 1, got {world_size}")
    check_choice("dtype", dtype, DTYPES)
    launched = launched_by_torchrun()
    if device == "cuda" and not launched and torch.cuda.device_count() < world_size:
        raise CpbenchError(
            f"world size ({world_size}) needs {world_size} GPUs, found {torch.cuda.device_count()}"
        )
    check_impl(impl)
    if kernel != "auto":  # a kernel that runs nothing here is bad input, not 0 cases passed
        reason = kernel_unavailable(kernel, device, TORCH_DTYPES[dtype])
        if reason is not None:
            raise CpbenchError(f"kernel {kernel!r} {reason}")
    for comm in cp_comms:
        check_choice("cp_comm", comm, CP_COMMS)
    if cases is None:
        cases = default_cases(world_size, dtype, kernel, impl, masks, cp_comms)
    runnable, skipped = split_cases(cases, device)
    prefill = _prefill_cases(world_size, dtype, impl) if inference else []
    ran: list[dict] = []
    inferred: list[dict] = []
    if launched or runnable or prefill:
        if launched:  # the launched processes are the world
            opened: Any = launched_world(device, timeout)
        else:
            opened = WorkerPool(WorldSpec(world_size, device))
        with opened as world:
            if launched and world.world_size != world_size:
                raise CpbenchError(
                    f"world size ({world_size}) != launched world size ({world.world_size})"
                )
            if runnable:
                per_rank = world.run(run_cases_on_rank, runnable, device, timeout=timeout)
                ran = [r for r in per_rank[0] if r is not None]
            if prefill:
                per_rank = world.run(
                    run_inference_cases_on_rank, prefill, device, kernel, timeout=timeout
                )
                inferred = [r for r in per_rank[0] if r is not None]
    order = {case.label: i for i, case in enumerate(cases)}
    trained = sorted(ran + skipped, key=lambda r: order.get(r["label"], len(order)))
    return [VerifyRow.from_record(r) for r in trained + inferred]


def _prefill_cases(world_size: int, dtype: Dtype, impl: str) -> list:
    """The prefill and decode cases of `--inference` (cpbench's own schemes only)."""
    from cpbench.bench.inference_verify import (  # noqa: PLC0415
        default_decode_cases,
        default_prefill_cases,
    )

    if impl != DEFAULT_IMPL:
        raise CpbenchError(
            f"inference cases run cpbench's own prefill schemes only, not impl {impl!r}"
        )
    return [*default_prefill_cases(world_size, dtype), *default_decode_cases(world_size, dtype)]

