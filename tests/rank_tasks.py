"""Functions that the multi-rank tests send to the pool's ranks (importable by spawned ranks)."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Any

import torch

from cpbench.attention import build_mesh, cp_attention, run_length, shard
from cpbench.attention.comm import ByteCounter, counting
from cpbench.bench.harness import RankMeasurement
from cpbench.config.masks import MaskSpec


def count_bytes(
    seq_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    batch: int,
    ulysses: int,
    ring: int,
    layout: str,
    dtype: str,
    variant: str = "full",
    documents: tuple[int, ...] | None = None,
    window: int | None = None,
) -> dict[str, dict[str, int]]:
    """Run one forward+backward under a ByteCounter (causal, with the given documents and
    window); return {phase: {collective: bytes}}."""
    mesh = build_mesh(ulysses, ring)
    dt = getattr(torch, dtype)
    mask = MaskSpec(documents=documents, window=window)
    n = run_length(mask, seq_len, ulysses, ring, layout)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, n, heads, head_dim, generator=g)
    k = torch.randn(batch, n, kv_heads, head_dim, generator=g)
    v = torch.randn(batch, n, kv_heads, head_dim, generator=g)
    local = [shard(t, mesh, layout, mask=mask).to(dt).requires_grad_(True) for t in (q, k, v)]
    counter = ByteCounter()
    with counting(counter):
        out = cp_attention(
            *local,
            mesh,
            layout=layout,
            variant=variant,
            kernel="naive" if dt != torch.float32 else "auto",
            mask=mask,
        )
        with counter.phase("bwd"):
            out.sum().backward()
    return counter.as_dict()


def raise_on_rank(rank_to_fail: int) -> int:
    import torch.distributed as dist  # noqa: PLC0415

    if dist.get_rank() == rank_to_fail:
        raise RuntimeError("injected failure")
    dist.barrier()  # the healthy ranks wait for the failed one, as a real collective would
    return dist.get_rank()


def sleep_then_rank(seconds: float) -> int:
    import torch.distributed as dist  # noqa: PLC0415

    time.sleep(seconds)
    return dist.get_rank()


def imported(module: str) -> bool:
    """Whether this rank has imported `module`."""
    return module in sys.modules


def collector_counts() -> tuple[int, int]:
    """This rank's objects kept out of the cycle collector (frozen), and those it still walks."""
    import gc  # noqa: PLC0415

    return gc.get_freeze_count(), len(gc.get_objects())


def process_and_environment(name: str) -> dict[str, Any]:
    """This rank's process id, its parent's, and its value of the environment variable `name`."""
    return {"pid": os.getpid(), "ppid": os.getppid(), "value": os.environ.get(name)}


def measure_or_misbehave(config: dict, settings: dict) -> RankMeasurement:
    """`measure_config`, except that head_dim 24 raises on rank 1 and head_dim 40 hangs: the
    faults a sweep must survive (a rank that raises, a configuration that never returns)."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.bench.measure import measure_config  # noqa: PLC0415

    if config["head_dim"] == 24 and dist.get_rank() == 1:
        raise RuntimeError("CUDA out of memory (injected)")
    if config["head_dim"] == 40:
        threading.Event().wait()  # a real hang: nothing ever sets it
    return measure_config(config, settings)


def measure_then_corrupt(config: dict, settings: dict) -> RankMeasurement:
    """`measure_config`, then one wrong result injected on rank 0 by head_dim: 24 counts one
    byte more than the forward sent (a byte mismatch), 40 fails the reference check. The
    record assembly and the CLI's exit code must both notice."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.bench.measure import measure_config  # noqa: PLC0415

    result = measure_config(config, settings)
    if dist.get_rank() == 0 and config["head_dim"] == 24:
        collective = sorted(result.bytes["fwd"])[0]
        result.bytes["fwd"][collective] += 1
    if dist.get_rank() == 0 and config["head_dim"] == 40:
        result = dataclasses.replace(result, accuracy={**(result.accuracy or {}), "passed": False})
    return result


def impl_layouts(seq_len: int, ulysses: int, ring: int) -> dict[str, bool]:
    """Each library's own shard of an arange sequence vs cpbench's `positions` (on every rank):
    yunchang's extract_local per ring_impl_type, torch's head-tail / plain sharding."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.attention.layouts import positions  # noqa: PLC0415
    from cpbench.config.bench import BenchConfig  # noqa: PLC0415
    from cpbench.impls import get_adapter, usp  # noqa: PLC0415

    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = torch.arange(seq_len).view(1, seq_len, 1)
    out: dict[str, bool] = {}
    from yunchang import EXTRACT_FUNC_DICT  # noqa: PLC0415
    from yunchang.globals import PROCESS_GROUP  # noqa: PLC0415

    PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = usp._process_groups(ulysses, ring)
    for layout, kind in usp.RING_IMPL_TYPES.items():
        local = EXTRACT_FUNC_DICT[kind](tokens, rank, world_size=world, rd=ring, ud=ulysses)
        expected = positions(seq_len, ulysses, ring, layout, rank)
        out[f"yunchang {kind}"] = torch.equal(local.flatten(), expected)
    # torch_cp follows torch 2.13's private CP modules; older torch reports it not installed.
    if ulysses == 1 and get_adapter("torch_cp").installed() is None:
        for layout in ("zigzag", "contiguous"):
            config = BenchConfig(
                seq_len=seq_len, batch=1, heads=1, kv_heads=1, head_dim=1, dtype="float32",
                causal=True, ulysses=1, ring=ring, layout=layout, kv_replication=None,
                kernel="auto", phase="fwd+bwd", device="cpu", world_size=world,
                impl="torch_cp",
            )
            local = get_adapter("torch_cp").prepare(config).shard(tokens)
            out[f"torch_cp {layout}"] = torch.equal(
                local.flatten(), positions(seq_len, 1, ring, layout, rank)
            )
    return out


def library_counting_cases() -> dict[str, int]:
    """What `library_counting` records for known calls (world size 2, every rank):
    all_to_all_single with and without splits, all_gather_into_tensor (counted once, although
    it calls all_gather_single inside c10d), P2POp + batch_isend_irecv, and the functional
    all_to_all_single that torch's permute_tensor uses."""
    import torch.distributed as dist  # noqa: PLC0415
    import torch.distributed._functional_collectives as ft_c  # noqa: PLC0415

    from cpbench.impls.counting import library_counting  # noqa: PLC0415

    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    originals = (dist.isend, dist.batch_isend_irecv, dist.all_to_all_single, ft_c.all_to_all_single)
    from cpbench.attention.boundary import labelled  # noqa: PLC0415

    counter = ByteCounter()
    x = torch.ones(4, 8)  # 128 bytes
    small = torch.ones(2, 8)  # 64 bytes
    early_received = torch.empty_like(small)
    early = [dist.P2POp(dist.isend, small, peer), dist.P2POp(dist.irecv, early_received, peer)]
    with library_counting(counter):
        for work in dist.batch_isend_irecv(early):  # 64 bytes, op built before counting
            work.wait()
        with labelled("a2a_named"):
            dist.all_to_all_single(torch.empty_like(x), x)  # 64 bytes under the label
        dist.all_to_all_single(torch.empty_like(x), x)  # 64 bytes leave this rank
        # Uneven splits: 1 row to rank 0, 3 rows to rank 1 (the own part is not counted).
        dist.all_to_all_single(torch.empty(2 * (1 + 2 * rank), 8), x, [1 + 2 * rank] * 2, [1, 3])
        dist.all_gather_into_tensor(torch.empty(4 * world, 8), x)  # 128 x (world - 1)
        received = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, received, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        ft_c.permute_tensor(x.flatten(), [1, 0], dist.group.WORLD).wait()  # 1-D, as torch uses it
    restored = (
        dist.isend,
        dist.batch_isend_irecv,
        dist.all_to_all_single,
        ft_c.all_to_all_single,
    ) == originals
    for work in dist.batch_isend_irecv(early):  # after counting: the op is valid, not counted
        work.wait()
    return {
        **{f"{p}:{tag}": n for (p, tag), n in counter.bytes.items()},
        "restored": int(restored),
        "prebuilt_reused": int(early[0].op is dist.isend and torch.equal(early_received, small)),
    }


def masked_against_reference(
    cases: list[tuple[int, int, str, tuple[int, ...] | None, int | None, int, str]],
) -> list[dict[str, float] | None]:
    """Each case (U, R, layout, documents, window, kv_heads, kernel) on L = 64, 4 heads, d 8,
    fp32, forward and backward through `cp_attention`; rank 0 returns the max abs error of
    out, dq, dk, dv against the float64 reference with the same mask (and with plain causal
    attention, `causal_*`: how far the check is from the mask-blind answer)."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.attention import reference_attention, unshard  # noqa: PLC0415
    from cpbench.attention.layouts import packing  # noqa: PLC0415

    seq_len, heads = 64, 4
    results: list[dict[str, float] | None] = []
    for ulysses, ring, layout, documents, window, kv_heads, kernel in cases:
        mesh = build_mesh(ulysses, ring)
        mask = MaskSpec(documents=documents, window=window)
        packed = packing(seq_len, ulysses, ring, layout, mask)
        g = torch.Generator().manual_seed(7)
        n = packed.seq_len
        q = torch.randn(2, n, heads, 8, generator=g)
        k = torch.randn(2, n, kv_heads, 8, generator=g)
        v = torch.randn(2, n, kv_heads, 8, generator=g)
        dout = torch.randn(2, n, heads, 8, generator=g)
        local = [shard(t, mesh, layout, mask=mask).requires_grad_(True) for t in (q, k, v)]
        out = cp_attention(*local, mesh, layout=layout, kernel=kernel, mask=mask)
        out.backward(shard(dout, mesh, layout, mask=mask))
        got = [unshard(t, mesh, layout, mask=mask) for t in (out.detach(), *(x.grad for x in local))]
        if dist.get_rank() != 0:
            results.append(None)
            continue
        record: dict[str, float] = {}
        for prefix, ref_mask in (("", packed.mask), ("causal_", None)):
            ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
            ref = reference_attention(*ref_in, mask=ref_mask)
            ref.backward(dout.double())
            refs = [ref.detach(), *(x.grad for x in ref_in)]
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, refs, strict=True):
                record[prefix + name] = float((a.double() - b).abs().max())
        results.append(record)
    return results


def probe_boundary_bytes(plan: Any, comm_budget_s: float) -> list[tuple[str, int, int]]:
    """`probe_on_rank` for the plan's collectives (its kernel shapes left out), with
    torch.distributed's `all_to_all_single` and `batch_isend_irecv` wrapped to record what each
    call hands in: per comm test, (kind, bytes of the send buffer per call, ranks of the group
    it ran on). The send buffer is nccl-tests' S: the whole input of an all-to-all
    (count x nranks x type size), the sent tensor of a send/recv. Every call of one test
    must hand in the same bytes."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.app.probe.ranks import probe_on_rank  # noqa: PLC0415

    calls: list[tuple[str, int, int]] = []
    originals = (dist.all_to_all_single, dist.batch_isend_irecv)
    isend = dist.isend

    def all_to_all_single(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group", args[2] if len(args) > 2 else None)
        calls.append(("all_to_all", input.numel() * input.element_size(),
                      dist.get_world_size(group)))  # fmt: skip
        return originals[0](output, input, *args, **kwargs)

    def batch_isend_irecv(ops: list) -> Any:
        for op in ops:
            if op.op is isend:
                calls.append(("send_recv", op.tensor.numel() * op.tensor.element_size(),
                              dist.get_world_size(op.group)))  # fmt: skip
        return originals[1](ops)

    dist.all_to_all_single, dist.batch_isend_irecv = all_to_all_single, batch_isend_irecv
    try:
        result = probe_on_rank(dataclasses.replace(plan, kernel_tests=()), comm_budget_s, 0.0)
    finally:
        dist.all_to_all_single, dist.batch_isend_irecv = originals
    per_test: list[tuple[str, int, int]] = []
    for samples in result.comm:
        # one warm-up and one sizing call, then the timed repetitions
        mine, calls = calls[: 2 + len(samples)], calls[2 + len(samples) :]
        if len(set(mine)) != 1:
            raise AssertionError(f"one probe test handed in different calls: {mine}")
        per_test.append(mine[0])
    if calls:
        raise AssertionError(f"{len(calls)} calls left over after the plan's tests")
    return per_test


def cases_with_a_wrong_ring(cases: list, device: str = "cpu") -> list[dict | None]:
    """`run_cases_on_rank` with a wrong program planted for the batch: on rank 0, every case
    with a ring (R > 1) gets its attention output scaled by 1.01 (so the output and the
    gradients are wrong, as a broken merge would make them); Ulysses-only cases run the real
    scheme. The judge (`run_case_on_rank`) and `cpbench verify`'s exit code must notice. The
    real `cp_attention` is restored afterwards (the pool's ranks are shared)."""
    import torch.distributed as dist  # noqa: PLC0415

    import cpbench.attention as attention  # noqa: PLC0415
    from cpbench.bench.reference import run_cases_on_rank  # noqa: PLC0415

    real = attention.cp_attention

    def wrong(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        mesh = args[3] if len(args) > 3 else kwargs["mesh"]
        return out * 1.01 if mesh.ring > 1 and dist.get_rank() == 0 else out

    attention.cp_attention = wrong  # type: ignore[assignment]
    try:
        return run_cases_on_rank(cases, device)
    finally:
        attention.cp_attention = real  # type: ignore[assignment]
