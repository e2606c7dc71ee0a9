"""Scenarios: TOML files that describe a sweep, and the benchmark points they expand to.

A scenario holds run settings (world size, device, warm-up, iterations, timeout) and an `[axes]`
table; `Scenario.expand` takes the product of the axes and pairs every point (`BenchConfig`)
with its `Feasibility`. Infeasible points are kept: the sweep records them as `skipped` with the
rule that rejects them. The file is described by the pydantic models `ScenarioFile` and
`ScenarioAxes` (strict types, no unknown keys); mistakes in it (unknown keys, wrong types, a mesh
that does not multiply to the world size) raise `CpbenchError` naming the file, the key, the
value and the rule: `<file>: key '<key>': <value> <rule>`, the first problem only.

```toml
name = "example"
world_size = 4              # or "auto": all local GPUs on cuda, 4 ranks on cpu
device = "cpu"              # auto | cpu | cuda

[axes]
seq_len = [1024, 2048]
heads = 8
kv_heads = [8, 2]           # or gqa_ratio = [1, 4]
head_dim = 64
mesh = "all"                # or ["4x1", "2x2"] or [[4, 1], [2, 2]]
layout = ["zigzag", "contiguous"]
impl = ["cpbench", "torch_cp"]   # optional: external implementations (cpbench.impls)
documents = ["none", "lognormal:mean=1024"]   # optional: packed documents (see below)
window = ["none", 1024]                      # optional: sliding windows
```

Masks: `documents` takes the sources `cpbench.config.documents.resolve_documents` takes
(explicit lengths "512,512,...", a file of lengths, or a distribution such as
"lognormal:mean=1024,max=8192"), or "none" (one document); each is resolved for every seq_len
with the scenario's `seed` (top level, default 0), and the resolved lengths go into the
configuration (a file path is taken relative to the scenario file when it is there). `window`
takes positive token counts (a window >= L is allowed: it sees everything causal does) or
"none". Both need a causal mask.

Further products: each `[[also]]` table overrides some axes of `[axes]`; the sweep runs the
product of `[axes]`, then the product of each `[[also]]` table's axes (a configuration already
listed is not run twice), e.g. a sliding-window study next to a layout study:

```toml
[[also]]
documents = "none"
layout = "contiguous"
window = ["none", 1024]
```

Pure Python (no torch), so the CLI can list and validate scenarios without importing torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    NonNegativeInt,
    PlainValidator,
    PositiveInt,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import ErrorDetails

from cpbench.config.bench import BenchConfig, check_positive_int, factorizations, is_int
from cpbench.config.constraints import Feasibility
from cpbench.config.documents import DISTRIBUTIONS, resolve_documents
from cpbench.config.file_schema import MESSAGE, RULE, FileModel, problem, rule
from cpbench.config.impls import DEFAULT_IMPL, IMPLS, Impl
from cpbench.config.vocabulary import (
    BACKENDS,
    CP_COMMS,
    DEFAULT_DTYPE,
    DEVICES,
    DTYPES,
    LAYOUTS,
    PHASES,
    SCENARIO_DEVICES,
    Backend,
    CpComm,
    Device,
    Dtype,
    Layout,
    Phase,
    ScenarioDevice,
)
from cpbench.errors import CpbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BUILTIN = "<builtin>"
"""`Scenario.source` of a scenario shipped inside the package (`cpbench/data/*.toml`)."""
CPU_WORLD_SIZE = 4
"""Ranks that `world_size = "auto"` gives on the CPU (gloo)."""

DEFAULT_PRECISION = 0.05
"""Default target relative width of a median's 95% interval (5%)."""
DEFAULT_MAX_ITERS = 100
DEFAULT_BUDGET = 2.0
DEFAULT_CHECK_ROWS = 256

_MESH_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


# --------------------------------------------------------------------------------------------
# Scenario
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A sweep: run settings and the axes whose product gives the benchmark points."""

    name: str
    """Short name, used in results records and file names."""
    description: str
    """One or two sentences: what the sweep studies."""
    source: str
    """File the scenario came from, or "<builtin>" for one shipped in the package."""
    world_size: int | Literal["auto"]
    """Ranks; "auto" = all local GPUs on cuda, 4 on cpu (see `resolve`)."""
    device: ScenarioDevice
    """cpu, cuda, or auto (cuda when a GPU is visible)."""
    warmup: int
    """Untimed iterations before timing (>= 0)."""
    iters: int
    """Timed iterations (>= 1)."""
    timeout: float
    """Seconds one configuration may take before it is recorded as `timeout`."""
    check_max_seq_len: int
    """The reference check runs at min(seq_len, this), rounded down to a valid multiple."""
    nodes: int
    """Hosts the ranks span (torchrun --nnodes); world_size must be a multiple of it."""
    seq_len: tuple[int, ...]
    """Axis: global sequence lengths."""
    batch: tuple[int, ...]
    """Axis: batch sizes."""
    heads: tuple[int, ...]
    """Axis: query heads."""
    kv_heads: tuple[int, ...] | None
    """Axis: KV heads; None when gqa_ratio is given instead."""
    gqa_ratio: tuple[int, ...] | None
    """Axis: query heads per KV head (kv_heads = heads // ratio); None when kv_heads is given."""
    head_dim: tuple[int, ...]
    """Axis: channels per head."""
    dtype: tuple[Dtype, ...] | None
    """Axis: element types; None = float32 on cpu, bfloat16 on cuda."""
    causal: tuple[bool, ...]
    """Axis: causal mask or not."""
    mesh: tuple[tuple[int, int], ...] | Literal["all"]
    """Axis: (U, R) pairs, or "all" = every factorisation of the world size."""
    layout: tuple[Layout, ...]
    """Axis: sequence layouts."""
    kv_replication: tuple[int | None, ...]
    """Axis: KV replication requested (None = automatic, 1 = off)."""
    backend: tuple[Backend, ...]
    """Axis: local attention kernels."""
    phase: tuple[Phase, ...]
    """Axis: timed phases."""
    impl: tuple[str, ...] = (DEFAULT_IMPL,)
    """Axis: implementations (cpbench's own and external libraries, `cpbench.impls`)."""
    documents: tuple[str | None, ...] = (None,)
    """Axis: document sources (`cpbench.config.documents.resolve_documents`), None = one
    document; resolved per seq_len with `seed`."""
    window: tuple[int | None, ...] = (None,)
    """Axis: sliding windows in tokens, None = unbounded."""
    cp_comm: tuple[CpComm, ...] = ("p2p",)
    """Axis: how the ring axis exchanges K/V: p2p (the ring) or all_gather."""
    heads_k_stride: tuple[int | None, ...] = (None,)
    """Axis: KV heads per all-gather (all_gather only), None = all in one gather."""
    seed: int = 0
    """Seed of the document distributions (the same seed gives the same lengths)."""
    also: tuple[Scenario, ...] = ()
    """Further products (the `[[also]]` tables): this scenario with some axes overridden;
    `expand` lists their points after its own."""
    precision: float | None = DEFAULT_PRECISION
    """Target relative width of the 95% interval of each step's median ((high - low) /
    median); timing goes on past `iters` until it is met, `max_iters` or `budget`. None = a
    fixed count of `iters` iterations."""
    max_iters: int = DEFAULT_MAX_ITERS
    """Timed iterations at most, per variant."""
    budget: float = DEFAULT_BUDGET
    """Wall seconds of timed steps per configuration after which timing stops even if the
    precision is not met (each of the two variants gets half)."""
    check_rows: int = DEFAULT_CHECK_ROWS
    """Query rows of the full-length sampled-row check (0 = off); it runs when the capped
    check is shorter than the configuration."""

    def resolve(self, device: str = "auto", gpu_count: int = 0) -> tuple[Device, int]:
        """The device and world size to run with.

        `device` is the command line's choice ("auto" defers to the scenario's own, and an
        "auto" there means cuda when `gpu_count` > 0). A world size of "auto" is `gpu_count`
        on cuda and 4 on cpu. Whether the node has enough GPUs is left to the caller (under
        torchrun the ranks span several nodes)."""
        if device not in SCENARIO_DEVICES:
            raise CpbenchError(f"device {device!r} is not one of {', '.join(SCENARIO_DEVICES)}")
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
        else:
            world = gpu_count if chosen == "cuda" else CPU_WORLD_SIZE
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
        meshes = self.meshes(world_size)
        dtypes = self.dtype or (DEFAULT_DTYPE[device],)
        head_pairs = [
            (h, kv)
            for h in self.heads
            for kv in (
                self.kv_heads
                if self.kv_heads is not None
                else [h // g for g in self.gqa_ratio or (1,)]
            )
        ]
        # two products of at most six axes each (typed), multiplied: the same order as one
        shapes = itertools.product(
            self.seq_len, self.batch, head_pairs, self.head_dim, dtypes, self.causal
        )
        runs = list(
            itertools.product(
                self.layout, self.kv_replication, self.backend, self.phase, self.impl, meshes
            )
        )
        # a head stride is an all-gather knob: p2p points take only "none" from that axis
        exchanges = [
            (cp_comm, stride)
            for cp_comm in self.cp_comm
            for stride in self.heads_k_stride
            if cp_comm == "all_gather" or stride is None
        ]
        masks = [
            (source, window, cp_comm, stride)
            for source, window in itertools.product(self.documents, self.window)
            for cp_comm, stride in exchanges
        ]
        out = []
        for (seq_len, batch, (heads, kv_heads), head_dim, dtype, causal), (
            source,
            window,
            cp_comm,
            heads_k_stride,
        ), (
            layout,
            kv_replication,
            backend,
            phase,
            impl,
            (ulysses, ring),
        ) in itertools.product(shapes, masks, runs):
            documents = None if source is None else resolved_documents(source, seq_len, self.seed)
            config = BenchConfig(
                seq_len=seq_len,
                batch=batch,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                dtype=dtype,
                causal=causal,
                ulysses=ulysses,
                ring=ring,
                layout=layout,
                kv_replication=kv_replication,
                kernel=backend,
                phase=phase,
                device=device,
                world_size=world_size,
                nodes=self.nodes,
                impl=impl,
                documents=documents,
                window=window,
                cp_comm=cp_comm,
                heads_k_stride=heads_k_stride,
            )
            out.append((config, config.feasibility))
        return out


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
    for every mask), so the layout is contiguous; one document filling the sequence is no
    documents."""
    changes: dict[str, Any] = {}
    if config.ring == 1 and config.layout != "contiguous":
        changes["layout"] = "contiguous"
    if config.documents is not None and len(config.documents) == 1:
        changes["documents"] = None
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


# --------------------------------------------------------------------------------------------
# The file: pydantic models
# --------------------------------------------------------------------------------------------

T = TypeVar("T")


def _axis_values(value: object, handler: ValidatorFunctionWrapHandler) -> tuple[Any, ...]:
    """A list of values (a scalar means a list of one), each validated by the item type; no
    value twice."""
    raw = list(value) if isinstance(value, (list, tuple)) else [value]
    parsed: tuple[Any, ...] = handler(tuple(raw))
    for i, item in enumerate(parsed):
        if item in parsed[:i]:
            raise problem(f"{raw[i]!r} is repeated in {raw!r}")
    return parsed


Axis = Annotated[tuple[T, ...], Field(min_length=1), WrapValidator(_axis_values)]
"""An axis: one value or a non-empty list of distinct values of the item type."""


def _one_of(values: Iterable[str]) -> WrapValidator:
    return rule(f"is not one of {', '.join(values)}")


def _mesh_entry(value: object) -> tuple[int, int]:
    """One mesh: "UxR" (spaces allowed) or [U, R], both degrees positive."""
    if isinstance(value, str):
        match = _MESH_RE.match(value)
        if not match:
            raise problem(f'"{value}" is not a mesh; write "UxR" such as "4x2", or [4, 2]')
        u, r = int(match.group(1)), int(match.group(2))
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(is_int(v) for v in value):
        u, r = value
    else:
        raise problem(f'{value!r} is not a mesh; write "UxR" such as "4x2", [4, 2], or "all"')
    if u <= 0 or r <= 0:
        raise problem(f"{value!r}: ulysses and ring degrees must be positive")
    return u, r


def _kv_replication(value: object) -> int | None:
    """`"auto"` (None: as many copies as the mesh needs), "off" (1) or a positive integer."""
    if value == "auto":
        return None
    if value == "off":
        return 1
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise problem(f'{value!r} is not "auto", "off" or a positive integer')


def _documents_source(value: object) -> str | None:
    """A document source string (`cpbench.config.documents`), or "none" / null: one document."""
    if value is None or value == "none":
        return None
    if not isinstance(value, str) or not value.strip():
        raise problem(
            f"{value!r} is not a document source; write comma-separated lengths, a file of "
            f'lengths, a distribution ({", ".join(d + ":..." for d in DISTRIBUTIONS)}) or "none"'
        )
    return value.strip()


def _window(value: object) -> int | None:
    """A sliding window: a positive number of tokens, or "none" / null (unbounded)."""
    if value is None or value == "none":
        return None
    if is_int(value) and value >= 1:
        return value
    raise problem(f'{value!r} is not a window; give a positive number of tokens or "none"')


def _not_empty(name: str | None) -> str | None:
    if name is not None and not name.strip():
        raise problem("must not be empty")
    return name


def _literal_or(literal: str, tag: str) -> Discriminator:
    """Validate against the union member tagged "literal" when the value is `literal`, else the
    one tagged `tag` (so that errors come from that member only)."""
    return Discriminator(lambda value: "literal" if value == literal else tag)


def _precision(value: object) -> float | None:
    """A relative width in (0, 1), or "off" (None: a fixed count of iterations)."""
    if value == "off":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
        return float(value)
    raise problem(f'{value!r} is not a relative width between 0 and 1 (0.05 = 5%) or "off"')


Precision = Annotated[float | None, PlainValidator(_precision)]
MeshEntry = Annotated[tuple[int, int], PlainValidator(_mesh_entry)]
KvReplication = Annotated[int | None, PlainValidator(_kv_replication)]
DocumentsSource = Annotated[str | None, PlainValidator(_documents_source)]
Window = Annotated[int | None, PlainValidator(_window)]


def _stride(value: object) -> int | None:
    """KV heads per all-gather: a positive number, or "none" / null (all at once)."""
    if value is None or value == "none":
        return None
    if is_int(value) and value >= 1:
        return value
    raise problem(f'{value!r} is not a head stride; give a positive number of KV heads or "none"')


HeadStride = Annotated[int | None, PlainValidator(_stride)]
WorldSize = Annotated[
    Annotated[Literal["auto"], Tag("literal")] | Annotated[PositiveInt, Tag("int")],
    _literal_or("auto", "int"),
]
MeshAxis = Annotated[
    Annotated[Literal["all"], Tag("literal")] | Annotated[Axis[MeshEntry], Tag("list")],
    _literal_or("all", "list"),
]


class ScenarioAxes(FileModel):
    """The `[axes]` table: each key one value or a list; the sweep is their product."""

    seq_len: Axis[PositiveInt]
    """Global sequence lengths (required)."""
    batch: Axis[PositiveInt] = (1,)
    """Batch sizes."""
    heads: Axis[PositiveInt]
    """Query heads (required)."""
    kv_heads: Axis[PositiveInt] | None = None
    """KV heads, each dividing every heads value; at most one of kv_heads and gqa_ratio."""
    gqa_ratio: Axis[PositiveInt] | None = None
    """Query heads per KV head (kv_heads = heads // ratio); neither given = 1 (MHA)."""
    head_dim: Axis[PositiveInt] = (128,)
    """Channels per head."""
    dtype: Axis[Annotated[Dtype, _one_of(DTYPES)]] | None = None
    """Element types; absent = float32 on cpu, bfloat16 on cuda."""
    causal: Axis[bool] = (True,)
    """Causal mask or not."""
    mesh: MeshAxis = "all"
    """(U, R) meshes as "UxR" or [U, R], or "all" = every factorisation of the world size."""
    layout: Axis[Annotated[Layout, _one_of(LAYOUTS)]] = ("zigzag",)
    """Sequence layouts."""
    kv_replication: Axis[KvReplication] = (None,)
    """KV replication: "auto", "off" or a number of copies."""
    backend: Axis[Annotated[Backend, _one_of(BACKENDS)]] = ("auto",)
    """Local attention kernels."""
    phase: Axis[Annotated[Phase, _one_of(PHASES)]] = ("fwd+bwd",)
    """Timed phases."""
    impl: Axis[Annotated[Impl, _one_of(IMPLS)]] = (DEFAULT_IMPL,)
    """Implementations (cpbench's own and external libraries, `cpbench.impls`)."""
    documents: Axis[DocumentsSource] = (None,)
    """Packed documents: sources as `cpbench.config.documents.resolve_documents` takes them
    (lengths, a file, a distribution), or "none" (one document per sequence)."""
    window: Axis[Window] = (None,)
    """Sliding windows in tokens, or "none" (unbounded); >= seq_len is allowed."""
    cp_comm: Axis[Annotated[CpComm, _one_of(CP_COMMS)]] = ("p2p",)
    """How the ring axis exchanges K/V: p2p (the ring) or all_gather (the Llama 3 scheme)."""
    heads_k_stride: Axis[HeadStride] = (None,)
    """KV heads per all-gather (all_gather only): a positive number, or "none" (all at once)."""

    @model_validator(mode="before")
    @classmethod
    def _one_kv_axis(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kv_heads" in data and "gqa_ratio" in data:
            raise problem(
                f"keys 'kv_heads' = {data['kv_heads']!r} and 'gqa_ratio' = "
                f"{data['gqa_ratio']!r} are both given; use exactly one of them",
                key="",
            )
        return data

    @model_validator(mode="after")
    def _groups_divide_heads(self) -> ScenarioAxes:
        for g in self.gqa_ratio or ():
            for h in self.heads:
                if h % g:
                    raise problem(f"{g} does not divide heads ({h})", key="gqa_ratio")
        for kv in self.kv_heads or ():
            for h in self.heads:
                if h % kv:
                    raise problem(
                        f"{kv} does not divide heads ({h}): GQA groups must be even",
                        key="kv_heads",
                    )
        return self

    @model_validator(mode="after")
    def _masks_need_causal(self) -> ScenarioAxes:
        if False not in self.causal:
            return self
        for key, values in (("window", self.window), ("documents", self.documents)):
            given = [v for v in values if v is not None]
            if given:
                raise problem(
                    f"{given[0]!r} needs a causal mask (a sliding window counts the keys before "
                    f"a query, a document mask is causal within each document), but causal "
                    f"is false",
                    key=key,
                )
        return self


class ScenarioFile(FileModel):
    """A scenario file: run settings and the `[axes]` table."""

    name: Annotated[str | None, AfterValidator(_not_empty)] = None
    """Short name; absent = the file's stem."""
    description: str = ""
    """One or two sentences: what the sweep studies."""
    world_size: WorldSize = "auto"
    """Ranks, or "auto" (all local GPUs on cuda, 4 on cpu)."""
    device: Annotated[ScenarioDevice, _one_of(SCENARIO_DEVICES)] = "auto"
    """cpu, cuda, or auto (cuda when a GPU is visible)."""
    warmup: NonNegativeInt = 3
    """Untimed iterations before timing."""
    iters: PositiveInt = 10
    """Timed iterations."""
    timeout: Annotated[
        float,
        Field(gt=0, allow_inf_nan=False),
        rule("must be a positive, finite number of seconds"),
    ] = 300.0
    """Seconds one configuration may take before it is recorded as `timeout`."""
    check_max_seq_len: PositiveInt = 4096
    """Longest sequence of the reference check."""
    nodes: PositiveInt = 1
    """Hosts the ranks span; world_size must be a multiple of it."""
    seed: NonNegativeInt = 0
    """Seed of the document distributions of the documents axis."""
    precision: Precision = DEFAULT_PRECISION
    """Target relative width of each median's 95% interval (0 < p < 1), or "off" (a fixed
    count of `iters`)."""
    max_iters: PositiveInt = DEFAULT_MAX_ITERS
    """Timed iterations at most, per variant (>= iters)."""
    budget: Annotated[
        float,
        Field(gt=0, allow_inf_nan=False),
        rule("must be a positive, finite number of seconds"),
    ] = DEFAULT_BUDGET
    """Seconds of timed steps per configuration before timing stops short of the precision."""
    check_rows: NonNegativeInt = DEFAULT_CHECK_ROWS
    """Query rows of the full-length sampled-row check (0 = off)."""
    axes: ScenarioAxes
    """The axes of the sweep (required)."""
    also: list[dict[str, Any]] = []
    """Further products: each table overrides some axes of [axes] (`[[also]]`)."""

    @model_validator(mode="after")
    def _world_fits_nodes(self) -> ScenarioFile:
        if self.nodes > 1 and self.world_size == "auto":
            raise problem(
                f'"auto" is for one node; with nodes = {self.nodes} give a number',
                key="world_size",
            )
        if self.world_size != "auto" and self.world_size % self.nodes != 0:
            raise problem(
                f"{self.world_size} is not a multiple of nodes ({self.nodes})", key="world_size"
            )
        if self.max_iters < self.iters:
            raise problem(
                f"{self.max_iters} is below iters ({self.iters}): the most iterations cannot be "
                "fewer than the least",
                key="max_iters",
            )
        return self


TOP_LEVEL_KEYS: tuple[str, ...] = tuple(ScenarioFile.model_fields)
AXIS_KEYS: tuple[str, ...] = tuple(ScenarioAxes.model_fields)

_TYPE_RULES: dict[str, str] = {
    "int_type": "is not an integer",
    "string_type": "is not a string",
    "bool_type": "is not true or false",
}


def _rank(error: ErrorDetails) -> int:
    """Which problem to report first, in the order a reader fixes them: unknown top-level keys,
    the [axes] table itself, unknown and missing axes, then the values top to bottom."""
    loc, kind = error["loc"], error["type"]
    if not loc:
        return 0 if kind == "model_type" else 6
    if loc[0] != "axes":
        return 0 if kind == "extra_forbidden" else 4
    if len(loc) == 1:
        return 1
    return {"extra_forbidden": 2, "missing": 3}.get(kind, 5)


def _scenario_error(exc: ValidationError, source: str) -> CpbenchError:
    """The first problem of a validation, in the words `<file>: key '<key>': <value> <rule>`."""
    error = min(exc.errors(), key=_rank)
    loc, kind, value = error["loc"], error["type"], error["input"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    in_axes = len(loc) > 1 and loc[0] == "axes"
    key = str(loc[1] if in_axes else loc[0]) if loc else ""
    if kind == "model_type" and not loc:
        return CpbenchError(f"{source}: expected a TOML table, got {type(value).__name__}")
    if kind == "extra_forbidden" and in_axes:
        return CpbenchError(
            f"{source}: unknown key {key!r} in [axes]; allowed keys: {', '.join(AXIS_KEYS)}"
        )
    if kind == "extra_forbidden":
        hint = " (axis keys go in the [axes] table)" if key in AXIS_KEYS else ""
        return CpbenchError(
            f"{source}: unknown key {key!r}{hint}; allowed keys: {', '.join(TOP_LEVEL_KEYS)}"
        )
    if kind == "missing":
        if in_axes:
            return CpbenchError(f"{source}: key '{key}' is required in [axes]")
        return CpbenchError(f"{source}: missing the [axes] table (seq_len, heads, ...)")
    if kind == "model_type":
        text = f"{value!r} is not a table; write an [axes] section"
    elif kind == MESSAGE:
        key = key if ctx.get("key") is None else ctx["key"]
        text = ctx["message"]
    elif kind == "too_short":
        text = "the list is empty; give at least one value"
    elif kind == "greater_than":  # PositiveInt
        text = f"{value!r} must be " + ("positive" if ctx["gt"] == 0 else f"> {ctx['gt']}")
    elif kind == "greater_than_equal":  # NonNegativeInt
        text = f"{value!r} must be >= {ctx['ge']}"
    else:
        text = f"{value!r} {ctx['rule'] if kind == RULE else _TYPE_RULES.get(kind, error['msg'])}"
    return CpbenchError(f"{source}: key '{key}': {text}" if key else f"{source}: {text}")


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_scenario(data: dict, source: str) -> Scenario:
    """Build and validate a scenario from a parsed TOML document; `source` names the file in
    error messages."""
    try:
        spec = ScenarioFile.model_validate(data)
    except ValidationError as exc:
        raise _scenario_error(exc, source) from None
    scenario = _scenario(spec, spec.axes, source)
    extras = []
    for number, override in enumerate(spec.also, 1):
        where = f"{source} ([[also]] table {number})"
        merged = _merged_axes(data.get("axes") or {}, override)
        try:
            axes = ScenarioFile.model_validate({**data, "axes": merged, "also": []}).axes
        except ValidationError as exc:
            raise _scenario_error(exc, where) from None
        extras.append(_scenario(spec, axes, where, base=source))
    return dataclasses.replace(scenario, also=tuple(extras))


def _merged_axes(axes: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """[axes] with an [[also]] table's keys replacing them (naming kv_heads or gqa_ratio
    replaces both)."""
    merged = dict(axes)
    if "kv_heads" in override or "gqa_ratio" in override:
        merged.pop("kv_heads", None)
        merged.pop("gqa_ratio", None)
    merged.update(override)
    return merged


def _scenario(
    spec: ScenarioFile, axes: ScenarioAxes, source: str, base: str | None = None
) -> Scenario:
    """The scenario of a validated file and one set of axes (`source` names it in messages,
    `base` is the file when that differs); its documents are resolved once for every sequence
    length (an error names the file and the key)."""
    documents = tuple(
        None if d is None else _document_path(d, base or source) for d in axes.documents
    )
    for d in documents:
        for seq_len in axes.seq_len if d is not None else ():
            try:
                resolved_documents(d, seq_len, spec.seed)
            except CpbenchError as exc:
                raise CpbenchError(f"{source}: key 'documents': {exc}") from None
    scenario = Scenario(
        name=spec.name if spec.name is not None else _default_name(source),
        description=spec.description,
        source=source,
        world_size=spec.world_size,
        device=spec.device,
        warmup=spec.warmup,
        iters=spec.iters,
        timeout=spec.timeout,
        check_max_seq_len=spec.check_max_seq_len,
        nodes=spec.nodes,
        seq_len=axes.seq_len,
        batch=axes.batch,
        heads=axes.heads,
        kv_heads=axes.kv_heads,
        gqa_ratio=(1,) if axes.kv_heads is None and axes.gqa_ratio is None else axes.gqa_ratio,
        head_dim=axes.head_dim,
        dtype=axes.dtype,
        causal=axes.causal,
        mesh=axes.mesh,
        layout=axes.layout,
        kv_replication=axes.kv_replication,
        backend=axes.backend,
        phase=axes.phase,
        impl=axes.impl,
        documents=documents,
        window=axes.window,
        cp_comm=axes.cp_comm,
        heads_k_stride=axes.heads_k_stride,
        seed=spec.seed,
        precision=spec.precision,
        max_iters=spec.max_iters,
        budget=spec.budget,
        check_rows=spec.check_rows,
    )
    if scenario.world_size != "auto":
        scenario.meshes(scenario.world_size)  # a mesh that does not fit is an error in the file
    return scenario


def _document_path(source: str, scenario_source: str) -> str:
    """A document file named relative to the scenario file, as a path from here; any other
    source as given."""
    kind = source.partition(":")[0]
    if kind in DISTRIBUTIONS or Path(source).is_absolute() or scenario_source.startswith("<"):
        return source
    beside = Path(scenario_source).parent / source
    return str(beside) if beside.is_file() and not Path(source).is_file() else source


def _default_name(source: str) -> str:
    return Path(source).stem if source != BUILTIN else "unnamed"


def _builtin_dir() -> Any:
    return resources.files("cpbench") / "data"


def available_scenarios() -> list[str]:
    """Names `load_scenario` accepts: built-in ones, then those in ./scenarios."""
    names = sorted(
        p.name[: -len(".toml")] for p in _builtin_dir().iterdir() if p.name.endswith(".toml")
    )
    local = Path("scenarios")
    if local.is_dir():
        names += sorted(p.stem for p in local.glob("*.toml") if p.stem not in names)
    return names


def _parse_text(text: str, source: str) -> Scenario:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"{source}: invalid TOML: {exc}") from None
    return parse_scenario(data, source)


def load_scenario(name_or_path: str) -> Scenario:
    """Load a scenario from a .toml path, or by name: the package's built-in
    `cpbench/data/<name>.toml` first, then `scenarios/<name>.toml` under the current directory."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or "/" in name_or_path or path.is_file():
        if not path.is_file():
            raise CpbenchError(f"{name_or_path}: no such scenario file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CpbenchError(f"{name_or_path}: cannot read: {exc}") from None
        return _parse_text(text, name_or_path)
    builtin = _builtin_dir() / f"{name_or_path}.toml"
    if builtin.is_file():
        return _parse_text(builtin.read_text(encoding="utf-8"), BUILTIN)
    local = Path("scenarios") / f"{name_or_path}.toml"
    if local.is_file():
        return _parse_text(local.read_text(encoding="utf-8"), str(local))
    raise CpbenchError(
        f"unknown scenario {name_or_path!r}; available: {', '.join(available_scenarios())} "
        f"(or give a path to a .toml file)"
    )


def default_scenario(device: str) -> Scenario:
    """The built-in sweep for a machine: cpu-smoke on cpu, gpu-node on cuda."""
    if device not in DEVICES:
        raise CpbenchError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    return load_scenario("cpu-smoke" if device == "cpu" else "gpu-node")
