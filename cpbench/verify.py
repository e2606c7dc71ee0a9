"""`cpbench verify`: every scheme x layout x causal x GQA case that a world size allows, checked
against the single-process reference (forward output and dQ/dK/dV).

All ranks build the same global tensors from a seed, shard them, run `cp_attention` forward
and backward, and gather output and gradients back; rank 0 compares them with the float64
reference. The cases run in batches on a persistent `WorkerPool`.

With `impl` set to an external implementation (`cpbench.impls`), the same cases run through
its adapter: sharded and gathered with the library's own layout, forward and backward inside
the adapter's step context, compared with the same reference and tolerance. A documented
upstream precision issue (`KnownIssue`) loosens the tolerance of the gradient it affects and is
named in the result; cases the library cannot run are reported as skipped with its rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from cpbench.errors import CpbenchError
from cpbench.impls.names import DEFAULT_IMPL, check_impl
from cpbench.model.constraints import LAYOUTS, AttentionShape, check_mesh

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {"float32": 2e-4, "float16": 1e-2, "bfloat16": 5e-2}
"""Absolute part of the allowed error against the float64 reference, per input dtype. The
reference runs on the inputs rounded to that dtype, so only the computation's error counts."""
RELATIVE_TOLERANCE = {"float32": 1e-5, "float16": 2.0**-9, "bfloat16": 2.0**-6}
"""Relative part, times the largest magnitude of the tensor checked: gradients such as dV sum
over the sequence and grow with it, so a fixed absolute bound would fail correct bf16 results
(one bf16 rounding step at magnitude 8 is 0.03). 2^-6 / 2^-9 are a few units of the last place
of bf16 (8-bit mantissa) / fp16 (11-bit); fp32 kernels agree to ~1e-6 at these sizes."""


def error_bound(dtype: str, reference: torch.Tensor, absolute: float | None = None) -> float:
    """Allowed max abs error for one tensor: absolute + relative x max |reference|."""
    atol = TOLERANCE[dtype] if absolute is None else absolute
    return atol + RELATIVE_TOLERANCE[dtype] * float(reference.abs().max())


@dataclass(frozen=True)
class VerifyCase:
    ulysses: int
    ring: int
    layout: str
    causal: bool
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int = 16
    batch: int = 2
    dtype: str = "float32"
    kernel: str = "auto"
    seed: int = 0
    impl: str = DEFAULT_IMPL

    @property
    def scheme(self) -> str:
        if self.ulysses == 1:
            return "ring"
        return "ulysses" if self.ring == 1 else "usp"

    @property
    def label(self) -> str:
        label = (
            f"{self.scheme} U{self.ulysses}xR{self.ring} {self.layout} "
            f"{'causal' if self.causal else 'full'} h{self.heads}/kv{self.kv_heads}"
        )
        return label if self.impl == DEFAULT_IMPL else f"{self.impl} {label}"

    def bench_config(self, device: str) -> Any:
        """The case as a BenchConfig (fwd+bwd), for the impl adapters' capability checks."""
        from cpbench.io.scenarios import BenchConfig  # noqa: PLC0415

        return BenchConfig(
            seq_len=self.seq_len,
            batch=self.batch,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,  # type: ignore[arg-type]
            causal=self.causal,
            ulysses=self.ulysses,
            ring=self.ring,
            layout=self.layout,  # type: ignore[arg-type]
            kv_replication=None,
            backend=self.kernel,  # type: ignore[arg-type]
            phase="fwd+bwd",
            device=device,  # type: ignore[arg-type]
            world_size=self.ulysses * self.ring,
            impl=self.impl,
        )


def factorizations(world_size: int) -> list[tuple[int, int]]:
    """Every (U, R) with U * R == world_size, pure ring first."""
    return [(u, world_size // u) for u in range(1, world_size + 1) if world_size % u == 0]


def default_cases(
    world_size: int, dtype: str = "float32", kernel: str = "auto", impl: str = DEFAULT_IMPL
) -> list[VerifyCase]:
    """The verify matrix: meshes x layouts x causal x GQA ratios 1, 2, 4 and KV replication.

    With 8 query heads, kv_heads 8, 4, 2 give GQA ratios 1, 2, 4; kv_heads 1 needs KV
    replication whenever U > 1. Infeasible combinations are left out (none with these sizes);
    what an external impl cannot run is kept (reported as skipped by `run_verify`).
    """
    seq_len = 16 * world_size * 2
    cases = []
    for ulysses, ring in factorizations(world_size):
        for layout in LAYOUTS:
            for causal in (True, False):
                for kv_heads in (8, 4, 2, 1):
                    case = VerifyCase(
                        ulysses,
                        ring,
                        layout,
                        causal,
                        8,
                        kv_heads,
                        seq_len,
                        dtype=dtype,
                        kernel=kernel,
                        impl=impl,
                    )
                    shape = AttentionShape(seq_len, 8, kv_heads, case.head_dim, case.batch)
                    if check_mesh(shape, ulysses, ring, layout).ok:
                        cases.append(case)
    return cases


def _global_inputs(case: VerifyCase, device: torch.device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(case.seed)
    b, n, d = case.batch, case.seq_len, case.head_dim
    q = torch.randn(b, n, case.heads, d, generator=g)
    k = torch.randn(b, n, case.kv_heads, d, generator=g)
    v = torch.randn(b, n, case.kv_heads, d, generator=g)
    dout = torch.randn(b, n, case.heads, d, generator=g)
    return tuple(t.to(device) for t in (q, k, v, dout))


def _run_cpbench(case: VerifyCase, inputs: tuple) -> list[torch.Tensor]:
    from cpbench.attention import build_mesh, cp_attention, shard, unshard  # noqa: PLC0415

    mesh = build_mesh(case.ulysses, case.ring)
    dtype = DTYPES[case.dtype]
    q, k, v, dout = inputs
    local = [shard(t, mesh, case.layout).to(dtype).requires_grad_(True) for t in (q, k, v)]
    out = cp_attention(*local, mesh, causal=case.causal, layout=case.layout, kernel=case.kernel)
    out.backward(shard(dout, mesh, case.layout).to(dtype))
    return [unshard(t, mesh, case.layout) for t in (out.detach(), *(x.grad for x in local))]


def _run_impl(case: VerifyCase, runner: Any, inputs: tuple) -> list[torch.Tensor]:
    """The case through an impl adapter's runner: its layout, its step context."""
    dtype = DTYPES[case.dtype]
    q, k, v, dout = inputs
    local = [runner.shard(t).to(dtype).requires_grad_(True) for t in (q, k, v)]
    with runner.context():
        out = runner.forward(*local)
        out.backward(runner.shard(dout).to(dtype))
    grads = [x.grad for x in local]
    if any(g is None for g in grads):
        raise CpbenchError(f"{case.impl}: the backward produced no gradient for q, k or v")
    return [runner.unshard(t) for t in (out.detach(), *grads)]


def run_case_on_rank(case: VerifyCase, device: torch.device) -> dict | None:
    """Collective: run one case on every rank; rank 0 returns the errors, others None."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.attention import reference_attention  # noqa: PLC0415

    inputs = _global_inputs(case, device)
    tolerances = dict.fromkeys(("out", "dq", "dk", "dv"), TOLERANCE[case.dtype])
    known: list[str] = []
    if case.impl == DEFAULT_IMPL:
        gathered = _run_cpbench(case, inputs)
    else:
        from cpbench.impls import get_adapter  # noqa: PLC0415

        adapter = get_adapter(check_impl(case.impl))
        config = case.bench_config(device.type)
        gathered = _run_impl(case, adapter.prepare(config), inputs)
        for issue in adapter.known_issues(config):
            known.append(issue.description)
            for name in issue.tensors:
                tolerances[name] = max(tolerances[name], issue.tolerance)
    if dist.get_rank() != 0:
        return None
    q, k, v, dout = inputs
    dtype = DTYPES[case.dtype]
    ref_inputs = [t.to(dtype).double().requires_grad_(True) for t in (q, k, v)]
    ref_out = reference_attention(*ref_inputs, causal=case.causal)
    ref_out.backward(dout.to(dtype).double())
    refs = [ref_out.detach(), *(x.grad for x in ref_inputs)]
    errors = {
        name: float((got.double() - ref).abs().max())
        for name, got, ref in zip(("out", "dq", "dk", "dv"), gathered, refs, strict=True)
    }
    bounds = {
        name: error_bound(case.dtype, ref, tolerances[name])
        for name, ref in zip(("out", "dq", "dk", "dv"), refs, strict=True)
    }
    result = {
        **asdict(case),
        "scheme": case.scheme,
        "label": case.label,
        "errors": errors,
        "max_error": max(errors.values()),
        "bounds": bounds,
        "tolerance": max(bounds.values()),
        "passed": all(errors[n] <= bounds[n] for n in errors),
    }
    if known:
        result["tolerances"] = tolerances
        result["known_issues"] = known
    return result


def run_cases_on_rank(cases: list[VerifyCase], device: str = "cpu") -> list[dict | None]:
    """Pool task: run a batch of cases; an exception in one case is recorded, not raised."""
    dev = torch.device(device)
    out: list[dict | None] = []
    for case in cases:
        try:
            out.append(run_case_on_rank(case, dev))
        except CpbenchError as exc:  # deterministic on every rank: no collective is left open
            out.append({**asdict(case), "label": case.label, "passed": False, "error": str(exc)})
    return out


def skipped_case(case: VerifyCase, reason: str) -> dict:
    """The record of a case an impl cannot run (`passed` None: neither passed nor failed)."""
    return {
        **asdict(case),
        "scheme": case.scheme,
        "label": case.label,
        "passed": None,
        "skipped": reason,
    }


def split_cases(cases: list[VerifyCase], device: str) -> tuple[list[VerifyCase], list[dict]]:
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
        reason = get_adapter(case.impl).capability(case.bench_config(device))
        if reason:
            skipped.append(skipped_case(case, reason))
        else:
            runnable.append(case)
    return runnable, skipped


def run_verify(
    world_size: int,
    device: str = "cpu",
    dtype: str = "float32",
    kernel: str = "auto",
    cases: list[VerifyCase] | None = None,
    timeout: float = 600.0,
    impl: str = DEFAULT_IMPL,
) -> list[dict]:
    """Spawn `world_size` ranks once and run every case; returns rank 0's records (cases the
    impl cannot run are records with `skipped` set and `passed` None)."""
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415

    if world_size < 1:
        raise CpbenchError(f"world size must be at least 1, got {world_size}")
    if dtype not in DTYPES:
        raise CpbenchError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise CpbenchError(
            f"world size ({world_size}) needs {world_size} GPUs, found {torch.cuda.device_count()}"
        )
    check_impl(impl)
    cases = cases if cases is not None else default_cases(world_size, dtype, kernel, impl)
    runnable, skipped = split_cases(cases, device)
    ran: list[dict] = []
    if runnable:
        with WorkerPool(WorldSpec(world_size, device)) as pool:
            per_rank = pool.run(run_cases_on_rank, runnable, device, timeout=timeout)
        ran = [r for r in per_rank[0] if r is not None]
    order = {case.label: i for i, case in enumerate(cases)}
    return sorted(ran + skipped, key=lambda r: order.get(r["label"], len(order)))
