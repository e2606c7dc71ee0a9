"""A dynamic-CP step on the ranks: every micro-batch's CP groups built as subgroups, each group's
packed sequences routed to it, checked against the single-process reference, then the whole
step timed (a barrier ends each micro-batch). docs/dynamic-cp.md, "Measured"."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention.mesh import group_cache
from cpbench.bench.reference import TORCH_DTYPES, run_case_on_rank
from cpbench.bench.timing import TimingPolicy, time_to_precision
from cpbench.config.bench import VerifyCase
from cpbench.config.vocabulary import CpComm, Dtype, Layout


@dataclass(frozen=True)
class RoutedGroup:
    """One CP group of a micro-batch: its ranks, its mesh and the sequences it packs."""

    ranks: tuple[int, ...]
    """Global ranks, consecutive."""
    ulysses: int
    ring: int
    layout: Layout
    cp_comm: CpComm
    documents: tuple[int, ...]
    """The packed sequences' lengths, each padded as the scheme needs (docs/dynamic-cp.md)."""


@dataclass(frozen=True)
class RoutedStep:
    """A policy's step as the ranks run it."""

    micro_batches: tuple[tuple[RoutedGroup, ...], ...]
    heads: int
    kv_heads: int
    head_dim: int
    dtype: Dtype = "float32"
    kernel: str = "auto"

    def case(self, group: RoutedGroup, seed: int) -> VerifyCase:
        """The group's work as a verify case (its check and its inputs' shapes)."""
        return VerifyCase(
            seq_len=sum(group.documents), batch=1, heads=self.heads, kv_heads=self.kv_heads,
            head_dim=self.head_dim, dtype=self.dtype, causal=True,
            documents=group.documents if len(group.documents) > 1 else None,
            ulysses=group.ulysses, ring=group.ring, layout=group.layout,
            cp_comm=group.cp_comm, kernel=self.kernel, seed=seed,  # type: ignore[arg-type]
        )  # fmt: skip


@group_cache
def _subgroup(ranks: tuple[int, ...]) -> dist.ProcessGroup:
    """The process group of `ranks`, created once per worker (collective over the world:
    every rank asks for the same groups in the same order, so the caches agree)."""
    return dist.new_group(list(ranks))


def _meshes(step: RoutedStep) -> dict[tuple[int, int, tuple[int, ...]], Any]:
    """This rank's groups' meshes, every group's process groups created on every rank in one
    order (group creation is collective over the world): the group's ranks as a subgroup, its
    Ulysses and ring groups inside it."""
    from cpbench.attention import build_mesh  # noqa: PLC0415

    rank = dist.get_rank()
    meshes: dict[tuple[int, int, tuple[int, ...]], Any] = {}
    for groups in step.micro_batches:
        for g in groups:
            key = (g.ulysses, g.ring, g.ranks)
            if key in meshes:
                continue
            mesh = build_mesh(g.ulysses, g.ring, _subgroup(g.ranks), ranks=g.ranks)
            meshes[key] = mesh if rank in g.ranks else None
    return meshes


def _mine(step: RoutedStep, rank: int) -> list[RoutedGroup | None]:
    """This rank's group in each micro-batch (None where it idles)."""
    return [next((g for g in groups if rank in g.ranks), None) for groups in step.micro_batches]


def run_routed_step_on_rank(
    step: RoutedStep, settings: dict[str, Any], device: str = "cpu", check: bool = True
) -> dict[str, Any] | None:
    """Pool task: check every group of every micro-batch against the reference (its first rank
    judges), then time the whole step to the settings' precision and measure each rank's busy
    seconds in one more step. Rank 0 returns {"checks", "samples", "busy_s", "instrumented_s"}
    (that step's seconds); the others None."""
    from cpbench.attention import cp_attention, shard  # noqa: PLC0415

    dev = torch.device(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    meshes = _meshes(step)
    mine = _mine(step, rank)
    checks: list[dict[str, Any]] = []
    if check:
        for m, groups in enumerate(step.micro_batches):
            for i, g in enumerate(groups):
                if rank in g.ranks:
                    record = run_case_on_rank(step.case(g, seed=1000 * m + i), dev,
                                              mesh=meshes[(g.ulysses, g.ring, g.ranks)])
                    if record is not None:
                        checks.append({**record, "micro_batch": m, "group": i})
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, checks)
        checks = [c for part in gathered for c in part]
    dtype = TORCH_DTYPES[step.dtype]
    work: list[tuple[Any, VerifyCase, list[torch.Tensor], torch.Tensor] | None] = []
    for m, group in enumerate(mine):
        if group is None:
            work.append(None)
            continue
        case = step.case(group, seed=m)
        mesh = meshes[(group.ulysses, group.ring, group.ranks)]
        gen = torch.Generator(device=dev).manual_seed(m * 7919 + rank)

        def draw(heads: int, gen: torch.Generator = gen, case: VerifyCase = case) -> torch.Tensor:
            return torch.randn(1, case.seq_len, heads, case.head_dim, generator=gen, device=dev)

        q, k, v, dout = (draw(h) for h in (step.heads, step.kv_heads, step.kv_heads, step.heads))
        local = [shard(t, mesh, case.layout, mask=case.mask).to(dtype) for t in (q, k, v, dout)]
        leaves = [t.requires_grad_(True) for t in local[:3]]
        work.append((mesh, case, leaves, local[3]))

    def one_group(item: tuple[Any, VerifyCase, list[torch.Tensor], torch.Tensor]) -> None:
        mesh, case, (lq, lk, lv), ldout = item
        out = cp_attention(lq, lk, lv, mesh, layout=case.layout, kernel=step.kernel,
                           mask=case.mask, cp_comm=case.cp_comm)  # fmt: skip
        out.backward(ldout)

    def run() -> None:
        for item in work:
            if item is not None:
                one_group(item)
            dist.barrier()  # the micro-batch ends when its slowest group does

    timed = time_to_precision(run, TimingPolicy.from_settings(settings), dev)
    busy = 0.0
    dist.barrier()
    began = time.perf_counter()
    for item in work:  # one more step, each rank's busy seconds (the straggler's idle share)
        start = time.perf_counter()
        if item is not None:
            one_group(item)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        busy += time.perf_counter() - start
        dist.barrier()
    per_rank = torch.tensor([busy, time.perf_counter() - began], dtype=torch.float64, device=dev)
    everyone = [torch.zeros_like(per_rank) for _ in range(world)]
    dist.all_gather(everyone, per_rank)
    if rank != 0:
        return None
    return {"checks": checks, "samples": timed.max_samples,
            "busy_s": [float(t[0]) for t in everyone],
            "instrumented_s": max(float(t[1]) for t in everyone)}  # fmt: skip
