"""The results record: one JSON object per configuration, one per line (JSONL).

The record, its versioning and migration: docs/design.md section 6."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from cpbench.config.vocabulary import (
    CacheLayout,
    InferencePhase,
    Mask,
    PassKey,
    Phase,
    PrefillScheme,
)
from cpbench.model.ties import Interval, recorded_interval

SCHEMA_VERSION = 4
"""Version of the record's shape. Version 4 (dynamic CP): a policy of a scenario's `[dynamic]`
study carries a `dynamic` section (the policy, its plan's CP degrees, per-rank busy seconds and
idle share, predicted and measured step with its interval, the routed groups' checks) and no
`timing`; its `config` describes the batch (scheme and layout "dynamic", the sequences as
`documents`); records of versions 1 to 3 read unchanged (no `dynamic` key). Version 3
(inference): a prefill or decode point carries `config.inference` (the step: phase,
cached_len, new_tokens, scheme or cache_layout) and an `inference` section (TTFT or per-token
latency, tokens/s, KV-cache bytes per rank analytic and measured); training records are as in version 2, and version 2 records read unchanged (no
`inference` key: a training step). Version 2 (measurements you can trust): `timing.samples` are
as many iterations as the precision target took (`timing.iterations`, at least the scenario's
`iters`), with the median's 95% interval (`ci_low`, `ci_high`), `target_met`, the overlap's
interval and status; `config.equivalent` lists the points measured as this one (at ring degree 1
the layout is always `contiguous`); `accuracy.sampled_rows` the full-length check;
`environment.machine` the host's state. Version 1 records lack all of these: read, their
interval comes from their samples (`TimingSection.interval`), their overlap status is unknown.
Version 1 records written before the `impl` axis lack
`config.impl`; those written before the busbw rename carry `comm.achieved_algbw_GBps`
(`migrate_record` handles both); GPU records written before the per-process memory probes carry
`memory.nvml_used_bytes` (device-wide, read once: kept and documented as such) and no
`memory.sources`; records written before masks lack `config.mask`, `documents`, `window`,
`padding` and `run_seq_len` (read as causal or full by `causal`, one document, no window, no
padding: see `ConfigSection`)."""

Status = Literal["ok", "failed", "skipped", "timeout"]
"""What happened to a configuration: measured, failed (an error or a wrong result), skipped (a
rule rejects it, or the impl cannot run it) or timed out."""
STATUSES: tuple[str, ...] = get_args(Status)

MAX_COUNT = 2**62
"""Largest count (tokens, heads, ranks) a record may hold: beyond it no configuration exists."""
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
"""A count of at least one (a mesh degree of 0 is impossible): a record with another is
refused (`cpbench.results.store.parse_record`)."""
Size = Annotated[int, Field(ge=0, le=MAX_COUNT)]
"""A count that may be 0 (padding, cached tokens)."""
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A measured time: not negative, finite (NaN is refused too)."""
StepSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A measured step: it takes time (a median of 0 is no measurement)."""


class RecordModel(BaseModel):
    """Common settings of the record and its sections: strict types (no "false" -> False, no
    True -> 1), unknown keys kept, assignments validated, field docstrings as descriptions."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        validate_assignment=True,
        use_attribute_docstrings=True,
    )


class ConfigSection(RecordModel):
    """The configuration measured (`cpbench.config.bench.BenchConfig.to_dict`)."""

    seq_len: Count
    """Global sequence length (tokens)."""
    batch: Count
    """Batch size."""
    heads: Count
    """Query heads."""
    kv_heads: Count
    """Key/value heads (GQA when fewer than heads)."""
    head_dim: Count
    """Dimension of one head."""
    dtype: str
    """float32 | bfloat16 | float16 (`cpbench.config.vocabulary.Dtype`)."""
    causal: bool
    """Causal mask (else full attention); `mask` names the whole mask."""
    ulysses: Count
    """Ulysses (all-to-all) degree U of the U x R mesh."""
    ring: Count
    """Ring degree R of the U x R mesh."""
    layout: str
    """contiguous | zigzag | striped | doc_zigzag | balanced: how the sequence is cut over the
    ring (`cpbench.config.vocabulary.Layout`)."""
    kv_replication: Count
    """Copies of each KV head (1 = none), resolved."""
    backend: str
    """Kernel requested (`cpbench.config.vocabulary.Backend`): auto | sdpa | naive | flash_attn |
    flash_attn3 | cudnn | efficient."""
    kernel: str | None
    """Kernel used (null when not run)."""
    device: str
    """cpu | cuda."""
    world_size: Count
    """Ranks of the run (U x R)."""
    nodes: Count
    """Nodes the ranks span."""
    phase: Phase
    """fwd | fwd+bwd: what one timed step runs."""
    scheme: str
    """ring | ulysses | usp | single."""
    impl: str
    """The implementation measured (`cpbench.config.impls.IMPLS`); ids of impls other than
    cpbench end in "-impl_<name>". Absent in records written before the impl axis, which are
    cpbench's own (`migrate_record`)."""
    mask: Mask | None = None
    """causal | full | document | sliding_window | document_sliding_window
    (`cpbench.config.masks.MaskSpec.kind`). Absent in records written before masks: read as
    causal or full by `causal` (filled in when the record is read, not written back)."""
    documents: list[Count] | None = None
    """Lengths of the documents packed into each sequence, in order, summing to seq_len (the
    resolved lengths, whatever source the scenario named); null = one document."""
    window: Count | None = None
    """Sliding window W in tokens: a query sees the last W keys, itself included; null =
    unbounded."""
    cp_comm: str = "p2p"
    """How the ring axis exchanges K/V (`cpbench.config.vocabulary.CpComm`): p2p (the ring)
    or all_gather (every rank gathers all K/V; dK/dV reduce-scattered)."""
    heads_k_stride: Count | None = None
    """KV heads per all-gather (all_gather only); null = all in one gather."""
    padding: Size | None = None
    """Tokens the layout added (doc_zigzag pads every document to a multiple of 2R; the other
    layouts add none). Read as 0 from records written before masks; null for a configuration
    whose layout cannot be packed (skipped)."""
    run_seq_len: Count | None = None
    """Tokens as run: seq_len + padding (what every byte and FLOP of the record is counted
    on). Read as seq_len from records written before masks."""
    inference: InferenceConfigSection | None = None
    """The inference step of a prefill or decode point (`cpbench.config.inference.
    InferenceStep`); absent for a training step (and in records before version 3). Its
    `phase` is then fwd (forward only) and seq_len is cached_len + new_tokens."""
    equivalent: list[str] | None = None
    """Ids of the scenario's other points that are this same computation, measured once as
    this record (e.g. the zigzag name of a ring-degree-1 mesh, whose canonical layout is
    contiguous); absent when none (and in version 1 records)."""

    @model_validator(mode="after")
    def _mesh_is_the_world(self) -> ConfigSection:
        if self.ulysses * self.ring != self.world_size:
            raise PydanticCustomError(
                "impossible_mesh",
                "ulysses x ring = world_size ({ulysses} x {ring} = {product}, not {world})",
                {"ulysses": self.ulysses, "ring": self.ring,
                 "product": self.ulysses * self.ring, "world": self.world_size},
            )  # fmt: skip
        return self

    @model_validator(mode="after")
    def _mask_defaults(self) -> ConfigSection:
        """Records written before masks: the mask their `causal` says, no padding. Filled in
        without marking the fields as set, so such a record is written back as it was read."""
        if self.mask is None:
            self.__dict__["mask"] = "causal" if self.causal else "full"
        if self.padding is None and "padding" not in self.model_fields_set:
            self.__dict__["padding"] = 0
        if self.run_seq_len is None and "run_seq_len" not in self.model_fields_set:
            padding = self.padding if self.padding is not None else 0
            self.__dict__["run_seq_len"] = self.seq_len + padding
        return self


class InferenceConfigSection(RecordModel):
    """What an inference point runs (`InferenceStep.to_dict`)."""

    phase: InferencePhase
    """prefill (T new tokens on P cached) or decode (1 to 8 new queries over the cache)."""
    cached_len: Size
    """P: tokens already in the KV cache."""
    new_tokens: Count
    """T: new tokens of the step."""
    scheme: PrefillScheme | None = None
    """prefill: pass_kv | pass_q | all_gather | ulysses; null for decode."""
    cache_layout: CacheLayout | None = None
    """decode: contiguous | interleaved; null for prefill."""


class InferenceSection(RecordModel):
    """An inference point's serving numbers (`cpbench.app.record`); seconds are the
    step median (max over ranks of each iteration, as `timing.median`)."""

    phase: InferencePhase
    """prefill or decode (as `config.inference.phase`)."""
    ttft_s: float | None = None
    """prefill: time to first token, seconds per prefill: the median of the timed forward of
    all T new tokens on P cached (from the ranks' input shards to their output shards: no
    unshard, no sampling); null for decode."""
    step_latency_s: float | None = None
    """decode: seconds per decode step (with new_tokens = 1, the inter-token latency of one
    sequence); null for prefill."""
    per_token_latency_s: float | None = None
    """decode: seconds per decode step / new_tokens (time per new token of one sequence: with
    T > 1, e.g. speculative drafts all accepted, below the step's latency); null for prefill."""
    tokens_per_s: float
    """batch x new_tokens / step median: tokens a second at the batch (decode: generated
    tokens; prefill: prompt tokens processed)."""
    kv_cache_bytes_analytic: int
    """KV-cache bytes (one layer) of the rank holding the most, from the model (decode:
    `kv_cache_bytes_per_rank` of P + T tokens over W ranks; prefill: its cache shard plus its
    new-token shard, `prefill_kv_bytes_per_rank`)."""
    kv_cache_bytes_measured: list[int]
    """Each rank's nbytes of the K and V tensors it holds for the step (prefill: its cache and
    new-token shards; decode: its cache shard)."""
    kv_cache_ratio: float
    """max of kv_cache_bytes_measured / kv_cache_bytes_analytic (1 = the model's memory)."""
    convention: str
    """What the numbers count, in words."""


class TimingSection(RecordModel):
    """Step times in seconds; present when status is "ok"."""

    phase: Phase
    """fwd | fwd+bwd: what one timed step runs."""
    median: StepSeconds
    """Median step time (the max over ranks of each iteration)."""
    p10: Seconds
    """10th percentile of the step time."""
    p90: Seconds
    """90th percentile of the step time."""
    samples: list[Seconds]
    """Step time of each iteration, max over ranks."""
    per_rank_median: list[float] | None = None
    """Each rank's own median (the causal load balance)."""
    compute_only: float | None
    """Median of the same step with communication removed; null, like comm_only, exposed_comm
    and overlap, for an external impl (the variants exist only for cpbench)."""
    compute_only_per_rank: list[float] | None = None
    """Each rank's median of the compute-only step."""
    comm_only: float | None
    """Median of the same communication with the kernels removed."""
    exposed_comm: float | None
    """max(0, median - compute_only): communication not hidden under compute."""
    overlap: float | None = None
    """(compute + comm - step) / min(compute, comm), clamped to [0, 1]; null without
    communication or variants."""
    overlap_note: str | None = None
    """What the overlap figure means for this record (clamping, no communication, ...)."""
    ci_low: float | None = None
    """Lower end of the median's 95% confidence interval (distribution-free order statistics
    over `samples`; the sample range when fewer than 6). Absent in version 1 records."""
    ci_high: float | None = None
    """Upper end of the median's 95% confidence interval."""
    interval_method: str | None = None
    """How ci_low/ci_high were obtained (`cpbench.model.ties`)."""
    iterations: int | None = None
    """Timed iterations of the full step (= len(samples))."""
    warmup_iterations: int | None = None
    """Warm-up iterations of the full step (past the scenario's warmup while timings drifted)."""
    precision_target: float | None = None
    """Target relative width (ci_high - ci_low) / median; null = a fixed count of iterations."""
    relative_width: float | None = None
    """(ci_high - ci_low) / median as measured."""
    target_met: bool | None = None
    """relative_width <= precision_target (null without a target)."""
    stop_reason: str | None = None
    """Why timing stopped: precision reached | max iterations | time budget | fixed count."""
    compute_only_ci: list[float] | None = None
    """[low, high] 95% interval of compute_only."""
    comm_only_ci: list[float] | None = None
    """[low, high] 95% interval of comm_only."""
    overlap_low: float | None = None
    """Lowest overlap the three intervals allow (null unless overlap_status is measured)."""
    overlap_high: float | None = None
    """Highest overlap the three intervals allow."""
    overlap_status: str | None = None
    """measured | not measurable (communication within the timing noise) | none by
    construction (Ulysses: an all-to-all hides nothing) | no communication."""
    tiebreak: dict[str, Any] | None = None
    """`sweep --separate-ties` only: the interleaved re-measurement (A B A B) of the tied
    leaders of this record's group: median, ci_low, ci_high, iterations, with (the ids measured
    together), separated (whether the intervals parted)."""

    def interval(self) -> Interval:
        """The median and its 95% interval: as recorded, or (version 1 records) from the
        samples."""
        return recorded_interval(
            self.median, self.ci_low, self.ci_high, self.iterations or len(self.samples),
            self.interval_method or "recorded", self.samples,
        )


class CollectiveBytes(RecordModel):
    """Bytes of one collective in one direction."""

    analytic: int
    """Bytes a rank sends, from cpbench.model."""
    measured: list[int]
    """Bytes each rank sent, counted."""


class CommSection(RecordModel):
    """Communication volume, analytic and counted."""

    analytic_bytes: dict[PassKey, int]
    """Bytes a rank sends per direction, from cpbench.model."""
    measured_bytes: dict[PassKey, list[int]]
    """Bytes each rank sent per direction, counted."""
    counted_at: Literal["torch.distributed"] | None = None
    """Where `measured_bytes` were counted: at torch.distributed's entry points
    (`cpbench.attention.boundary`), for every impl. Absent in older records (cpbench's own
    wrappers counted its bytes)."""
    by_collective: dict[PassKey, dict[str, CollectiveBytes]] | None = None
    """Per direction, per collective: analytic and counted bytes."""
    match: bool | None
    """Counted bytes equal the analytic ones on every rank; null for an external impl (its
    bytes are counted at the torch.distributed boundary and compared, not judged)."""
    note: str | None = None
    """External impl only: what was counted and how."""
    model_ratio: dict[PassKey, float | None] | None = None
    """External impl only: max measured over ranks / analytic, per direction."""
    achieved_busbw_GBps: float | None = None
    """Bytes a rank sends / comm_only time, in GB/s (nccl-tests busbw); null without
    communication or variants. Older records call it achieved_algbw_GBps."""


class MemorySection(RecordModel):
    """Memory per rank, measured and analytic (bytes). Measured numbers are of the one step run
    under the memory probe (`cpbench.bench.memory`); `sources` names what measured each."""

    peak_bytes: list[int] | None = None
    """Peak bytes of each rank during the step: on GPU `torch.cuda.max_memory_allocated`
    (tensors alive at once, statistics reset right before the step), on CPU the tensor tracker
    (the inputs' storages plus the peak of the storages the step created)."""
    source: str | None = None
    """cpu-tensor-tracker | torch-cuda-allocator: what measured peak_bytes."""
    reserved_peak_bytes: list[int | None] | None = None
    """GPU: peak bytes the torch caching allocator held from the driver during the step, per
    rank (`torch.cuda.max_memory_reserved`, after `torch.cuda.empty_cache` and a reset right
    before the step): peak_bytes plus the allocator's cache and fragmentation."""
    nvml_process_peak_bytes: list[int | None] | None = None
    """GPU: peak of each rank's own process memory on its GPU during the step, as nvidia-smi
    lists it per process (NVML's `usedGpuMemory` for the PID, sampled while the step ran:
    reserve, CUDA context, NCCL buffers); null where NVML does not list it (`sources`)."""
    rss_peak_bytes: list[int | None] | None = None
    """CPU: process peak RSS of each rank during the step (VmHWM, reset before the step)."""
    sources: dict[str, str] | None = None
    """What measured each of the fields above, by field name (for NVML: the query, the PID,
    the sampling; or why the value is null). Absent in records written before it."""
    nvml_used_bytes: list[int | None] | None = None
    """Older GPU records only: NVML's device-wide "used" memory read once after the step (not
    a peak, every process's); kept as read, nvml_process_peak_bytes replaces it."""
    analytic_peak_bytes: int | None = None
    """cpbench.model.memory lower bound of a rank's peak."""


class FlopsSection(RecordModel):
    """Attention FLOPs and the FLOP/s achieved."""

    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    convention: str
    """What is counted (cpbench.model.flops.FLOPS_CONVENTION)."""
    global_flops: float = Field(validation_alias="global", serialization_alias="global")
    """FLOPs of one step over all ranks (key "global" in the file)."""
    slowest_rank: float | None = None
    """FLOPs of the busiest rank."""
    achieved_tflops: float
    """Global FLOPs / median step / 1e12 (all ranks)."""
    achieved_tflops_per_rank: float | None = None
    """achieved_tflops / world_size."""
    per_rank_work: list[float] | None = None
    """Predicted attention work of each rank (`cpbench.app.record.per_rank_work`): what its
    compute-only time should follow. Absent in older records."""


class AccuracySection(RecordModel):
    """The reference check of the configuration (`cpbench.bench.reference.reference_check`)."""

    max_abs_error: float
    """Largest absolute error over the output and the gradients."""
    errors: dict[str, float] | None = None
    """Max absolute error per tensor (out, dq, dk, dv)."""
    check_seq_len: int
    """Sequence length of the check (the configuration's, capped by check_max_seq_len)."""
    tolerance: float
    """The largest per-tensor bound."""
    bounds: dict[str, float] | None = None
    """Error bound per tensor."""
    passed: bool
    """Every tensor's error is within its bound."""
    known_issues: list[str] | None = None
    """Only when a documented upstream precision issue loosened a gradient's bound: the
    issues."""
    tolerances: dict[str, float] | None = None
    """Only with known_issues: the relative tolerance used per tensor."""
    sampled_rows: SampledRowsSection | None = None
    """The full-length sampled-row check (`cpbench.bench.rowcheck`); absent when the capped
    check already ran at the full length (and in version 1 records)."""


class SampledRowsSection(RecordModel):
    """The forward at the benchmarked length on a sample of query rows, against a float64
    reference of those rows and every key, under the point's mask."""

    seq_len: Count
    """The benchmarked length (tokens)."""
    run_seq_len: Count | None = None
    """Tokens as run (seq_len + the layout's padding)."""
    rows: int
    """Query rows checked (spread evenly over the run, first and last included)."""
    max_abs_error: float
    """Largest absolute error of the output over the sampled rows."""
    bound: float
    """Allowed error (`cpbench.config.tolerances.allowed_error` of the rows' reference)."""
    passed: bool
    """max_abs_error <= bound."""
    method: str | None = None
    """The check in words."""


class EnvironmentSection(RecordModel):
    """What the record was measured on; any further keys are kept."""

    cpbench: str | None = None
    """cpbench version."""
    torch: str | None = None
    """torch version."""
    cuda: str | None = None
    """CUDA version torch was built with (null on a CPU build)."""
    nccl: str | None = None
    """NCCL version (null without CUDA)."""
    flash_attn: str | None = None
    """flash-attn version (null when not installed)."""
    python: str | None = None
    """Python version."""
    platform: str | None = None
    """platform.platform()."""
    cpu_count: int | None = None
    """os.cpu_count()."""
    env: dict[str, str] | None = None
    """Environment variables that change communication (NCCL_*, CUDA_*, GLOO_*, OMP_*, ...)."""
    hostnames: list[str] | None = None
    """Hosts of the ranks (sorted, once each)."""
    devices: list[str] | None = None
    """Each rank's device."""
    torch_threads_per_rank: int | None = None
    """torch.get_num_threads() on a rank."""
    impl_version: str | None = None
    """External impl only: the library's version."""
    machine: MachineSection | None = None
    """The host's state during this configuration (version 2): ranks per core, load, steal,
    GPU clocks, and the warnings they call for."""
    kernel_version: str | None = None
    """The version of what ran the local kernel (`config.kernel`): flash-attn's or FA3's
    version, cuDNN's number, or torch's for PyTorch's own ops. Absent in older records."""


class MachineSection(RecordModel):
    """What else the machine was doing (`cpbench.bench.environment.machine_state`)."""

    cores: int | None = None
    """Cores this process may run on (CPU affinity)."""
    ranks_on_node: int | None = None
    """Ranks of the run on this host."""
    threads_per_rank: int | None = None
    """torch threads per rank."""
    ranks_per_core: float | None = None
    """ranks x threads / cores (CPU runs); above 1 = oversubscribed."""
    oversubscribed: bool | None = None
    """ranks_per_core > 1."""
    load1_before: float | None = None
    """1-minute load average just before the configuration."""
    load1_after: float | None = None
    """1-minute load average just after it (the ranks' own load included)."""
    own_load: float | None = None
    """Load the ranks themselves account for (min(ranks x threads, cores) on CPU)."""
    other_cpu: float | None = None
    """Share of the machine's CPU time that other processes used during the configuration:
    busy CPU time (/proc/stat) minus the ranks' and cpbench's own CPU time, over all CPU time;
    null where unmeasured (no /proc/stat, or records written before it existed)."""
    steal: float | None = None
    """Share of CPU time stolen by the hypervisor during the configuration (/proc/stat);
    null where unreadable."""
    seconds: float | None = None
    """Wall seconds between the two snapshots."""
    gpus: list[dict[str, Any]] | None = None
    """Per rank on GPUs (NVML, read only): index, SM clock and its maximum (MHz), throttle
    reasons; null elsewhere or without NVML."""
    warnings: list[str] | None = None
    """Oversubscription, other load, steal, throttling; and when the precision target was not
    met."""


class DynamicGroupSection(RecordModel):
    """One CP group of a micro-batch of a policy's plan."""

    degree: Count
    """Ranks of the group."""
    scheme: str
    """ring | ulysses | allgather (`cpbench.model.dynamic.schedule.GroupScheme`)."""
    sequences: Size
    """Sequences packed into it."""
    tokens: Size
    """Their tokens (unpadded)."""
    predicted_s: Seconds
    """Predicted seconds of its pack."""


class DynamicChecks(RecordModel):
    """The reference checks of every routed group of a policy (`bench.dynamic`)."""

    groups: Size
    """Routed groups checked (one per group of every micro-batch)."""
    passed: Size
    """Groups whose output and dQ/dK/dV are within their bounds."""
    max_abs_error: float | None = None
    """Largest absolute error over every group and tensor."""
    max_error_ratio: float | None = None
    """Largest error / bound over every group (<= 1: every group passed)."""
    failures: list[str] | None = None
    """The failed groups in words (micro-batch, group, case, error); absent when none."""


class DynamicSection(RecordModel):
    """One policy of a dynamic-CP study measured by `cpbench sweep` (docs/dynamic-cp.md,
    "Measured by sweep"): seconds are of one attention layer's forward + backward over the
    whole batch, the micro-batches in turn (a barrier ends each)."""

    study: str
    """The study's id (shared by its policies' records; `DynamicStudy.key`)."""
    policy: str
    """static | megatron | cpbench."""
    lengths_source: str
    """The lengths source the scenario named."""
    sequences: Size
    """Sequences of the batch (`config.documents` lists their lengths)."""
    step_tokens: Count
    """The token budget the batch was drawn to."""
    tokens_per_rank: Count
    """C: the most tokens a rank holds in a micro-batch."""
    static_cp: Count
    """The static policy's CP degree."""
    hardware: str
    """The hardware profile of the predictions."""
    degrees: dict[str, int]
    """Sequences per CP degree the plan used (degree as text -> sequences)."""
    micro_batches: list[list[DynamicGroupSection]]
    """The plan: each micro-batch's groups in rank order."""
    predicted_s: Seconds
    """Predicted step seconds (the plan's; `PolicyPlan.step_s`)."""
    predicted_static_s: Seconds | None = None
    """The static policy's predicted step on the same batch (null when static cannot plan it):
    predicted speedup = predicted_static_s / predicted_s."""
    predicted_idle_share: float
    """1 - the plan's predicted busy share."""
    median_s: StepSeconds
    """Measured step seconds: the median over every round's iterations (each the max over
    ranks)."""
    ci_low: Seconds
    """Lower end of the median's 95% interval (distribution-free order statistics)."""
    ci_high: Seconds
    """Upper end of the median's 95% interval."""
    samples: list[Seconds]
    """Every timed step, all rounds."""
    rounds: Count
    """Interleaved rounds (each times every policy measured in this run in turn)."""
    busy_s: list[Seconds]
    """Each rank's seconds of work in one instrumented step."""
    instrumented_s: Seconds
    """That step's seconds (the max over ranks)."""
    idle_share: float
    """1 - sum(busy_s) / (W x instrumented_s): the ranks' idle share, of the straggler's step."""
    checks: DynamicChecks
    """Every routed group's reference check."""


class ResultRecord(RecordModel):
    """One configuration's result: one line of a results file."""

    schema_version: int = Field(ge=1)
    """Version of the record's shape (SCHEMA_VERSION when written by this cpbench)."""
    id: str
    """The configuration's key (`BenchConfig.key`); `--resume` skips the ids in the file."""
    scenario: str | None = None
    """Name of the scenario that produced the record."""
    timestamp: str | None = None
    """When the configuration ended, ISO 8601 with the UTC offset."""
    status: Status
    """ok | failed | skipped | timeout."""
    error: str | None = None
    """One line: what went wrong, or the rule that rejects the configuration; null when ok
    (an ok record whose counted bytes differ from the model says so here)."""
    config: ConfigSection | None
    """The configuration (null only in a file whose config could not be read)."""
    timing: TimingSection | None = None
    """Step times; present when status is "ok"."""
    comm: CommSection | None = None
    """Communication bytes; present when status is "ok"."""
    memory: MemorySection | None = None
    """Memory; present when status is "ok"."""
    flops: FlopsSection | None = None
    """FLOPs; present when status is "ok"."""
    accuracy: AccuracySection | None = None
    """The reference check; present when it ran."""
    environment: EnvironmentSection | None = None
    """Versions, hosts, devices and variables."""
    inference: InferenceSection | None = None
    """An inference point's TTFT / latency, tokens/s and KV-cache bytes (version 3); absent for
    a training step."""
    dynamic: DynamicSection | None = None
    """A dynamic-CP policy's measurement (version 4); absent for every other record."""

    _source: str | None = PrivateAttr(default=None)

    @property
    def source(self) -> str | None:
        """Name of the file the record was read from (None for a record built in memory)."""
        return self._source


def is_dynamic_record(record: Mapping[str, Any]) -> bool:
    """Whether a record dict is a dynamic-CP policy's (its `DynamicSection`, or for one that
    did not run its config's scheme "dynamic"): the training tables,
    the cost model's fits and the report's training sections leave these out."""
    config = record.get("config")
    scheme = config.get("scheme") if isinstance(config, Mapping) else None
    return isinstance(record.get("dynamic"), Mapping) or scheme == "dynamic"


def migrate_record(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of a record as read from a file, brought to the current shape: the one place that
    knows older records' spellings (no `config.impl` or `config.phase`, `achieved_algbw_GBps`).
    Values it cannot interpret are left for validation."""
    record = dict(raw)
    config, timing, comm = record.get("config"), record.get("timing"), record.get("comm")
    if isinstance(config, dict):
        config = record["config"] = dict(config)
        if config.get("impl") is None:
            config["impl"] = "cpbench"
        if config.get("phase") is None and isinstance(timing, dict) and "phase" in timing:
            config["phase"] = timing["phase"]
    if isinstance(comm, dict) and "achieved_algbw_GBps" in comm:
        comm = record["comm"] = dict(comm)
        algbw = comm.pop("achieved_algbw_GBps")
        if comm.get("achieved_busbw_GBps") is None:
            comm["achieved_busbw_GBps"] = algbw
    return record


def dump_record(record: ResultRecord) -> dict[str, Any]:
    """The record as a JSON-ready dict: the keys that were set, none of the defaults, so a
    record read and written again keeps its shape."""
    return record.model_dump(mode="json", exclude_unset=True)


ConfigSection.model_rebuild()
AccuracySection.model_rebuild()
EnvironmentSection.model_rebuild()
ResultRecord.model_rebuild()
