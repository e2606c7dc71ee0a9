"""The runtime scenario: `Scenario`, a sweep's settings and axes, and its expansion into the
benchmark points (`BenchConfig`, each with its `Feasibility`); `distinct` merges the points that
are the same computation (`canonical_config`, `computation_signature`). Pure Python (no torch)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cpbench.config.bench import BenchConfig, check_choice, check_positive_int, factorizations
from cpbench.config.constraints import Feasibility, check_cpu_world
from cpbench.config.documents import resolve_documents
from cpbench.config.inference import InferenceStep
from cpbench.config.vocabulary import (
    DEFAULT_DTYPE,
    DEVICES,
    INFERENCE_PHASES,
    SCENARIO_DEVICES,
    Device,
)
from cpbench.errors import CpbenchError
from cpbench.results.scenarios.dynamic import DynamicStudy, dynamic_study
from cpbench.results.scenarios.file_schema import ScenarioAxes, ScenarioDynamic, ScenarioSettings

CPU_WORLD_SIZE = 4
"""Ranks that `world_size = "auto"` gives on the CPU (gloo)."""


class Scenario(ScenarioSettings, ScenarioAxes):
    """A sweep: run settings and the axes whose product gives the benchmark points.

    The validated file itself (`loading.parse_scenario` builds it): its run settings and the
    axes of its `[axes]` table (or of one `[[also]]` table), with a default name, its source,
    the `[[also]]` products, gqa_ratio = (1,) where the file gives neither it nor kv_heads, and
    a documents file beside the scenario file named by its path from here."""

    name: str
    """Short name (the file's stem when the file gives none), used in records and file names."""
    source: str
    """File the scenario came from, or "<builtin>" for one shipped in the package."""
    also: tuple[Scenario, ...] = ()
    """Further products (the `[[also]]` tables): this scenario with some axes overridden;
    `expand` lists their points after its own."""
    dynamic: ScenarioDynamic | None = None
    """The dynamic-CP study (the `[dynamic]` table), measured after the points; None = none."""
    dynamic_lengths: str | None = None
    """The study's lengths source, a file beside the scenario file named by its path from
    here."""
    has_axes: bool = True
    """Whether the file has an `[axes]` table (a `[dynamic]`-only scenario has no points)."""

    def dynamic_study(self, device: str, world_size: int) -> DynamicStudy | None:
        """The `[dynamic]` table's study on this device and world (None without one);
        CpbenchError naming the file and key when the batch does not fit the ranks."""
        if self.dynamic is None:
            return None
        return dynamic_study(self.dynamic, self.source, device, world_size, self.seed,
                             self.dynamic_lengths)  # fmt: skip

    def resolve(
        self, device: str = "auto", gpu_count: int = 0, launched_world: int | None = None
    ) -> tuple[Device, int]:
        """The device and world size to run with.

        `device` is the command line's choice ("auto" defers to the scenario's own, and an
        "auto" there means cuda when `gpu_count` > 0). A world size of "auto" is the launched
        world's (`launched_world`: under torchrun or srun the processes that were started are
        the world, on any device), else `gpu_count` on cuda and 4 on cpu; a named one that
        differs from the launched world is an error naming both. Whether the node has enough
        GPUs is left to the caller (under torchrun the ranks span several nodes)."""
        check_choice("device", device, SCENARIO_DEVICES)
        wanted = device if device != "auto" else self.device
        chosen: Device
        if wanted == "cpu" or (wanted == "auto" and gpu_count <= 0):
            chosen = "cpu"
        elif gpu_count <= 0:
            raise CpbenchError(f"{self.source}: device 'cuda' requested but no GPU is visible")
        else:
            chosen = "cuda"
        if self.world_size != "auto":
            world = self.world_size
            if launched_world is not None and world != launched_world:
                raise CpbenchError(
                    f"{self.source}: key 'world_size': {world} != the launched world size "
                    f"({launched_world} processes): drop world_size from the file (a launched "
                    f"sweep runs on the launched world) or launch {world} processes"
                )
        elif launched_world is not None:
            world = launched_world
        else:
            world = gpu_count if chosen == "cuda" else CPU_WORLD_SIZE
        if chosen == "cpu" and launched_world is None:
            check_cpu_world(world)
        return chosen, world

    def meshes(self, world_size: int) -> list[tuple[int, int]]:
        """The (U, R) pairs of the mesh axis for a world size; raises if one does not fit."""
        if isinstance(self.mesh, str):  # "all"
            return factorizations(world_size)
        for u, r in self.mesh:
            if u * r != world_size:
                raise CpbenchError(
                    f"{self.source}: key 'mesh': \"{u}x{r}\" gives ulysses ({u}) x ring ({r}) "
                    f"= {u * r} != world_size ({world_size})"
                )
        return list(self.mesh)

    def expand(self, device: str, world_size: int) -> list[tuple[BenchConfig, Feasibility]]:
        """Every point of the axes' product, in a fixed order (mesh varies fastest, the impl
        next), each with its feasibility; infeasible points are kept. The feasibility is
        cpbench's mesh and shape rules; what an external impl supports on top of them is
        checked when the sweep runs (`cpbench.impls.skip_reason`). The points of the `also`
        products follow, without the configurations already listed.

        `world_size` is normally the one `resolve` gives; a different one (a command-line
        override) is accepted as long as every listed mesh multiplies to it."""
        if not self.has_axes:
            return []
        out = self._expand_own(device, world_size)
        seen = {config.key for config, _ in out}
        for extra in self.also:
            for config, feasibility in extra._expand_own(device, world_size):
                if config.key not in seen:
                    seen.add(config.key)
                    out.append((config, feasibility))
        return out

    def distinct(self, device: str, world_size: int) -> list[DistinctPoint]:
        """`expand`'s points with equivalent ones merged: points that are the same computation
        run once (`canonical`). The first of a set stands for it, under its canonical name
        (at ring degree 1 every layout is contiguous), with the ids of the others as
        `equivalent`; the order is `expand`'s."""
        out: list[DistinctPoint] = []
        by_signature: dict[str, int] = {}
        for config, feasibility in self.expand(device, world_size):
            canonical = canonical_config(config)
            signature = computation_signature(canonical, feasibility)
            if signature in by_signature:
                i = by_signature[signature]
                point = out[i]
                if config.key != point.config.key and config.key not in point.equivalent:
                    out[i] = dataclasses.replace(point, equivalent=(*point.equivalent, config.key))
                continue
            by_signature[signature] = len(out)
            equivalent = (config.key,) if canonical.key != config.key else ()
            out.append(DistinctPoint(canonical, canonical.feasibility, equivalent))
        return out

    def _expand_own(self, device: str, world_size: int) -> list[tuple[BenchConfig, Feasibility]]:
        """The points of this scenario's own axes (not the `also` products)."""
        if device not in DEVICES:
            raise CpbenchError(f"device {device!r} is not one of {', '.join(DEVICES)}")
        check_positive_int("world_size", world_size)
        if self.phase[0] in INFERENCE_PHASES:  # one table is all inference or all training
            return self._expand_inference(device, world_size)
        meshes = [{"ulysses": u, "ring": r} for u, r in self.meshes(world_size)]
        if self.seq_len is None:  # ScenarioAxes requires it of the training phases
            raise CpbenchError(f"{self.source}: key 'seq_len' is required in [axes]")
        # a head stride is an all-gather knob: p2p points take only "none" from that axis
        exchanges = [
            {"cp_comm": cp_comm, "heads_k_stride": stride}
            for cp_comm in self.cp_comm
            for stride in self.heads_k_stride
            if cp_comm == "all_gather" or stride is None
        ]
        points = _combinations(
            _axis("seq_len", self.seq_len),
            _axis("batch", self.batch),
            self._head_pairs(),
            _axis("head_dim", self.head_dim),
            _axis("dtype", self.dtype or (DEFAULT_DTYPE[device],)),
            _axis("causal", self.causal),
            _axis("source", self.documents),  # resolved per seq_len below
            _axis("window", self.window),
            exchanges,
            _axis("layout", self.layout),
            _axis("kv_replication", self.kv_replication),
            _axis("kernel", self.backend),
            _axis("phase", self.phase),
            _axis("impl", self.impl),
            meshes,
        )
        out = []
        for point in points:
            source = point.pop("source")
            if source is not None:
                point["documents"] = resolved_documents(source, point["seq_len"], self.seed)
            config = BenchConfig(**point, device=device, world_size=world_size, nodes=self.nodes)
            out.append((config, config.feasibility))
        return out

    def _head_pairs(self) -> list[dict[str, int]]:
        """heads and kv_heads of the axes: kv_heads (never empty) or heads // each ratio."""
        ratios = self.gqa_ratio or (1,)
        return [
            {"heads": h, "kv_heads": kv}
            for h in self.heads
            for kv in self.kv_heads or [h // g for g in ratios]
        ]

    def _expand_inference(
        self, device: Device, world_size: int
    ) -> list[tuple[BenchConfig, Feasibility]]:
        """The inference points (phase prefill or decode): shape x phase x cached_len x
        new_tokens x scheme (prefill) or cache_layout (decode) x backend, each on the mesh its
        step runs on (`InferenceStep.mesh`), contiguous shards, forward only."""
        if self.new_tokens is None:  # ScenarioAxes requires it of the inference phases
            raise CpbenchError(f"{self.source}: key 'new_tokens' is required in [axes]")
        shapes = _combinations(
            _axis("batch", self.batch),
            self._head_pairs(),
            _axis("head_dim", self.head_dim),
            _axis("dtype", self.dtype or (DEFAULT_DTYPE[device],)),
        )
        out = []
        for shape, phase in itertools.product(shapes, self.phase):
            # a prefill takes a scheme, a decode a cache layout
            hows = (
                _axis("scheme", self.scheme or ("pass_kv",))
                if phase == "prefill"
                else _axis("cache_layout", self.cache_layout or ("contiguous",))
            )
            steps = _combinations(
                _axis("cached_len", self.cached_len or (0,)),
                _axis("new_tokens", self.new_tokens),
                hows,
            )
            for how, backend in itertools.product(steps, self.backend):
                step = InferenceStep(phase=phase, **how)
                ulysses, ring = step.mesh(world_size)
                config = BenchConfig(
                    **shape,
                    seq_len=step.total,
                    ulysses=ulysses,
                    ring=ring,
                    layout="contiguous",
                    kernel=backend,
                    phase="fwd",
                    device=device,
                    world_size=world_size,
                    nodes=self.nodes,
                    inference=step,
                )
                out.append((config, config.feasibility))
        return out


def _axis(name: str, values: Iterable[Any]) -> list[dict[str, Any]]:
    """One axis as the fields it sets: a dict {name: value} per value."""
    return [{name: value} for value in values]


def _combinations(*factors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every choice of one dict per factor, merged, the last factor varying fastest (the order
    of `itertools.product`)."""
    return [
        {key: value for part in choice for key, value in part.items()}
        for choice in itertools.product(*factors)
    ]


@dataclass(frozen=True)
class DistinctPoint:
    """A configuration to measure once, and the names of the points that are the same
    computation."""

    config: BenchConfig
    """The configuration, under its canonical name (`canonical_config`)."""
    feasibility: Feasibility
    """Whether it can run (the rules of `BenchConfig.feasibility`)."""
    equivalent: tuple[str, ...] = ()
    """Ids (`BenchConfig.key`) of the scenario's other points that are this same computation
    (another layout name at ring degree 1, an axis value that normalises to the same), in
    expansion order; empty when none."""


def canonical_config(config: BenchConfig) -> BenchConfig:
    """The configuration under its canonical name: with ring degree 1 every layout shards like
    contiguous (`cpbench.attention.layouts`: a ring of one holds the whole sequence, in order,
    for every mask), so the layout is contiguous (one document filling the sequence is already
    no documents: `CpProblem` normalises it)."""
    changes: dict[str, Any] = {}
    if config.ring == 1 and config.layout != "contiguous":
        changes["layout"] = "contiguous"
    if config.ring == 1 and (config.cp_comm != "p2p" or config.heads_k_stride is not None):
        changes["cp_comm"], changes["heads_k_stride"] = "p2p", None  # no ring axis to gather over
    return dataclasses.replace(config, **changes) if changes else config


def computation_signature(config: BenchConfig, feasibility: Feasibility) -> str:
    """What makes two points the same computation: the canonical id with the KV replication
    resolved ("auto" and the number it resolves to are the same run)."""
    if feasibility.ok and config.kv_replication != feasibility.kv_replication:
        config = dataclasses.replace(config, kv_replication=feasibility.kv_replication)
    return canonical_config(config).key


@lru_cache(maxsize=256)
def resolved_documents(source: str, seq_len: int, seed: int) -> tuple[int, ...]:
    """The document lengths a source gives for one sequence length and seed (cached: a
    scenario resolves each pair once for all its points)."""
    return resolve_documents(source, seq_len, seed)
