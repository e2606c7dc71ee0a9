"""The scenario file's layout, strict types and no unknown keys: `ScenarioSettings`, `ScenarioAxes`
and `ScenarioFile` (both, and the `[[also]]` tables). Their defaults are the scenario's and their
field docstrings say what each key means (scenarios/README.md). Pure Python (no torch)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    NonNegativeInt,
    PlainValidator,
    PositiveInt,
    Tag,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from cpbench.config.bench import is_int
from cpbench.config.documents import DISTRIBUTIONS
from cpbench.config.file_schema import FileModel, problem, rule
from cpbench.config.impls import DEFAULT_IMPL, IMPLS, Impl
from cpbench.config.inference import MAX_DECODE_TOKENS
from cpbench.config.vocabulary import (
    BACKENDS,
    CACHE_LAYOUTS,
    CP_COMMS,
    DTYPES,
    INFERENCE_PHASES,
    LAYOUTS,
    PHASES,
    PREFILL_SCHEMES,
    SCENARIO_DEVICES,
    SCENARIO_PHASES,
    Backend,
    CacheLayout,
    CpComm,
    Dtype,
    Layout,
    PrefillScheme,
    ScenarioDevice,
    ScenarioPhase,
)
from cpbench.model.dynamic.schedule import POLICIES, Policy

_MESH_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")

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
    if is_int(value) and value >= 1:
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


def _count_or_none(what: str, of: str) -> PlainValidator:
    """A positive number of `of` (a window in tokens, a head stride in KV heads), or "none" /
    null (None: unbounded, all at once)."""

    def parse(value: object) -> int | None:
        if value is None or value == "none":
            return None
        if is_int(value) and value >= 1:
            return value
        raise problem(f'{value!r} is not {what}; give a positive number of {of} or "none"')

    return PlainValidator(parse)


SCENARIO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
"""A scenario's name: it names the default output file (results/<name>-<time>.jsonl), so no
path separator, no leading dot, nothing a terminal or rich would read as markup."""


def _plain_name(name: str | None) -> str | None:
    if name is not None and not SCENARIO_NAME.fullmatch(name):
        raise problem(
            f"{name!r} is not a plain name: 1 to 100 letters, digits, '.', '_', '+' or '-', "
            f"starting with a letter or digit (it names the output file results/<name>-<time>.jsonl)"
        )
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
PositiveSeconds = Annotated[
    float, Field(gt=0, allow_inf_nan=False), rule("must be a positive, finite number of seconds")
]
MeshEntry = Annotated[tuple[int, int], PlainValidator(_mesh_entry)]
KvReplication = Annotated[int | None, PlainValidator(_kv_replication)]
DocumentsSource = Annotated[str | None, PlainValidator(_documents_source)]
Window = Annotated[int | None, _count_or_none("a window", "tokens")]
HeadStride = Annotated[int | None, _count_or_none("a head stride", "KV heads")]
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

    seq_len: Axis[PositiveInt] | None = None
    """Global sequence lengths (required by the training phases; an inference step's length is
    cached_len + new_tokens, so they take none)."""
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
    phase: Axis[Annotated[ScenarioPhase, _one_of(SCENARIO_PHASES)]] = ("fwd+bwd",)
    """Timed phases: training (fwd, fwd+bwd: a step over seq_len tokens) or inference (prefill,
    decode: a step of new_tokens on cached_len cached tokens), not both in one table."""
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
    cached_len: Axis[NonNegativeInt] | None = None
    """Inference only: tokens already in the KV cache (P); absent = 0 (a prompt with no cache)."""
    new_tokens: Axis[PositiveInt] | None = None
    """Inference only (required there): new tokens of the step (T): a prefill's prompt, a
    decode step's 1 to 8 queries."""
    scheme: Axis[Annotated[PrefillScheme, _one_of(PREFILL_SCHEMES)]] | None = None
    """Prefill only: how the ranks exchange data (pass_kv, pass_q, all_gather, ulysses; the
    mesh is the scheme's: W x 1 for ulysses, 1 x W otherwise); absent = pass_kv."""
    cache_layout: Axis[Annotated[CacheLayout, _one_of(CACHE_LAYOUTS)]] | None = None
    """Decode only: how the KV cache is sharded by sequence (contiguous, interleaved); absent =
    contiguous."""

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
        for key, divisors, why in (
            ("gqa_ratio", self.gqa_ratio, ""),
            ("kv_heads", self.kv_heads, ": GQA groups must be even"),
        ):
            for d in divisors or ():
                for h in self.heads:
                    if h % d:
                        raise problem(f"{d} does not divide heads ({h}){why}", key=key)
        return self

    @model_validator(mode="after")
    def _step_axes(self) -> ScenarioAxes:
        """The training phases take seq_len and none of the inference axes; the inference
        phases take new_tokens (and cached_len, scheme, cache_layout), none of the training
        step's axes; one table does not mix the two."""
        training = [p for p in self.phase if p in PHASES]
        inference = [p for p in self.phase if p in INFERENCE_PHASES]
        if training and inference:
            raise problem(
                f"{list(self.phase)!r} mixes training ({', '.join(training)}) and inference "
                f"({', '.join(inference)}) phases; put the inference phases in an [[also]] "
                "table (an inference step has no seq_len axis, a training step no new_tokens)",
                key="phase",
            )
        given = self.model_fields_set
        if training:
            if self.seq_len is None:
                raise problem("key 'seq_len' is required in [axes]", key="")
            for key in INFERENCE_AXES:
                if getattr(self, key) is not None:
                    raise problem(
                        f"{list(getattr(self, key))!r} is an inference axis (phase prefill or "
                        f"decode), but phase is {', '.join(training)}",
                        key=key,
                    )
            return self
        if self.seq_len is not None:
            raise problem(
                f"{list(self.seq_len)!r}: phase {', '.join(inference)} takes no seq_len; an "
                "inference step's length is cached_len + new_tokens (give those)",
                key="seq_len",
            )
        if self.new_tokens is None:
            raise problem(
                f"key 'new_tokens' is required in [axes] for phase {', '.join(inference)}", key=""
            )
        for key, phase in (("scheme", "prefill"), ("cache_layout", "decode")):
            if getattr(self, key) is not None and phase not in inference:
                raise problem(
                    f"{list(getattr(self, key))!r} is a {phase} axis, but phase is "
                    f"{', '.join(inference)}",
                    key=key,
                )
        if "decode" in inference:
            for t in self.new_tokens:
                if t > MAX_DECODE_TOKENS:
                    raise problem(
                        f"{t}: a decode step takes 1 to {MAX_DECODE_TOKENS} new tokens (more is a "
                        "prefill: give decode its own [[also]] table)",
                        key="new_tokens",
                    )
        for key in TRAINING_STEP_AXES:
            if key in given and not (key == "impl" and self.impl == (DEFAULT_IMPL,)):
                raise problem(
                    f"{_shown(getattr(self, key))} is a training axis; an inference step (phase "
                    f"{', '.join(inference)}) runs cpbench's own causal attention over one "
                    "sequence, sharded by its scheme (prefill) or cache_layout (decode)",
                    key=key,
                )
        if False in self.causal:
            raise problem(
                f"false: phase {', '.join(inference)} runs causal attention", key="causal"
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


INFERENCE_AXES: tuple[str, ...] = ("cached_len", "new_tokens", "scheme", "cache_layout")
"""The axes only the inference phases (prefill, decode) take."""
TRAINING_STEP_AXES: tuple[str, ...] = (
    "seq_len",
    "mesh",
    "layout",
    "kv_replication",
    "impl",
    "documents",
    "window",
    "cp_comm",
    "heads_k_stride",
)
"""The axes of a training step that an inference step does not take (its mesh and shards are
its scheme's or cache layout's)."""


def _shown(value: object) -> str:
    """An axis value as the file wrote it (a tuple as a list)."""
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


class ScenarioSettings(FileModel):
    """The run settings: the top-level keys of a scenario file but its tables."""

    name: Annotated[str | None, AfterValidator(_plain_name)] = None
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
    timeout: PositiveSeconds = 300.0
    """Seconds one configuration may take before it is recorded as `timeout`."""
    check_max_seq_len: PositiveInt = 4096
    """The reference check runs at min(seq_len, this), rounded down to a valid multiple."""
    nodes: PositiveInt = 1
    """Hosts the ranks span; world_size must be a multiple of it."""
    seed: NonNegativeInt = 0
    """Seed of the document distributions of the documents axis."""
    precision: Precision = 0.05
    """Target relative width of each step median's 95% interval ((high - low) / median, 0 < p
    < 1): timing goes on past `iters` until it is met, `max_iters` or `budget`; or "off" (a
    fixed count of `iters`)."""
    max_iters: PositiveInt = 100
    """Timed iterations at most, per variant (>= iters)."""
    budget: PositiveSeconds = 2.0
    """Seconds of timed steps per configuration before timing stops short of the precision
    (each of the two variants gets half)."""
    check_rows: NonNegativeInt = 256
    """Query rows of the full-length sampled-row check (0 = off); it runs when the capped
    check is shorter than the configuration."""

    @model_validator(mode="after")
    def _world_fits_nodes(self) -> ScenarioSettings:
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


def _lengths_source(value: object) -> str:
    """A batch's sequence lengths (`cpbench.config.documents.global_batch`): a non-empty
    string."""
    if not isinstance(value, str) or not value.strip():
        raise problem(
            f"{value!r} is not a lengths source; write comma-separated lengths, a file of "
            f'lengths or a distribution ({", ".join(d + ":..." for d in DISTRIBUTIONS)})'
        )
    return value.strip()


class ScenarioDynamic(FileModel):
    """The `[dynamic]` table: a dynamic-CP study of one variable-length global batch, measured
    under each policy on the sweep's ranks (docs/dynamic-cp.md, "Measured by sweep")."""

    lengths: Annotated[str, PlainValidator(_lengths_source)]
    """The batch's sequence lengths: a distribution ("lognormal:mean=1024,sigma=1.5,min=128,
    max=8192"), a file of lengths (relative to the scenario file) or explicit lengths; drawn
    with the scenario's seed until they hold step_tokens."""
    tokens_per_rank: PositiveInt
    """C: the most tokens a rank holds in one micro-batch (a sequence of s tokens needs
    ceil(s / C) ranks)."""
    step_tokens: PositiveInt | None = None
    """The step's token budget (the batch drawn until it holds this many); absent = 8 x
    world_size x tokens_per_rank."""
    policies: Axis[Annotated[Policy, _one_of(POLICIES)]] = POLICIES
    """The policies measured: static, megatron, cpbench (default all three)."""
    heads: PositiveInt
    """Query heads of the attention layer."""
    kv_heads: PositiveInt | None = None
    """KV heads, dividing heads; absent = heads (MHA)."""
    head_dim: PositiveInt = 128
    """Channels per head."""
    dtype: Annotated[Dtype, _one_of(DTYPES)] | None = None
    """Element type; absent = float32 on cpu, bfloat16 on cuda."""
    static_cp: PositiveInt | None = None
    """The static policy's CP degree; absent = the least power of two that holds the longest
    sequence and divides the world."""
    hardware: str | None = None
    """The hardware profile of the predictions (a name or a TOML path, as `--hardware`);
    absent = cpu-local on cpu, h100-sxm on cuda."""
    rounds: PositiveInt = 3
    """Interleaved rounds: each round times every policy once in turn, so the machine's
    drift falls on all of them alike."""
    backend: Annotated[Backend, _one_of(BACKENDS)] = "auto"
    """Local attention kernel of every group."""

    @model_validator(mode="after")
    def _kv_divides_heads(self) -> ScenarioDynamic:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise problem(f"{self.kv_heads} does not divide heads ({self.heads})", key="kv_heads")
        return self


class ScenarioFile(ScenarioSettings):
    """A scenario file: the run settings, the `[axes]` table, the `[[also]]` tables and the
    `[dynamic]` table."""

    axes: ScenarioAxes | None = None
    """The axes of the sweep (required unless a [dynamic] table is given)."""
    also: list[dict[str, Any]] = []
    """Further products: each table overrides some axes of [axes] (`[[also]]`)."""
    dynamic: ScenarioDynamic | None = None
    """A dynamic-CP study measured after the axes' points (`[dynamic]`)."""

    @model_validator(mode="after")
    def _something_to_run(self) -> ScenarioFile:
        if self.axes is None and self.dynamic is None:
            raise problem(
                "missing the [axes] table (seq_len, heads, ...) or a [dynamic] table", key=""
            )
        if self.axes is None and self.also:
            raise problem("[[also]] tables override [axes]: give an [axes] table", key="also")
        return self


TOP_LEVEL_KEYS: tuple[str, ...] = tuple(ScenarioFile.model_fields)
AXIS_KEYS: tuple[str, ...] = tuple(ScenarioAxes.model_fields)
DYNAMIC_KEYS: tuple[str, ...] = tuple(ScenarioDynamic.model_fields)
