"""What a recommendation is asked and answers: the request, ranked candidates, rejections,
framework settings with their caveats and why the winner wins, as facts (`cpbench.render.recommend`
words them; their `dataclasses.asdict` is the `--json` answer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpbench.app.recommend.parallel import ParallelSizes
from cpbench.config.constraints import AttentionShape
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import CpComm, Phase
from cpbench.model.calibrate import CalibrationResult
from cpbench.model.calibrate.error_split import ErrorSplit
from cpbench.model.cost.prediction import Prediction
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.ties import Interval, PredictionInterval
from cpbench.model.topology import Placement

DEFAULT_HARDWARE = "h100-sxm"
TIME_CONVENTION = (
    "times are per attention layer and micro-batch on the slowest rank; "
    "compute = kernel time at perfect balance; imbalance = extra time of the busiest rank per "
    "ring step; exposed comm = communication not hidden behind compute"
)

SIGMA_CONVENTION = (
    "predicted time ±sigma: the interval is time x e^-sigma .. time x e^+sigma (one standard "
    "deviation of the model's relative error, about 68%); measured time ±: half the width of "
    "the median's 95% interval, relative to the median"
)

SigmaKind = Literal["calibration", "probe", "prior"]
"""Where the model's uncertainty comes from: a calibration's residuals (`--results` or a
calibrated TOML), a `cpbench probe` profile's stated fit error, or the prior's stated
accuracy."""


@dataclass(frozen=True)
class Uncertainty:
    """How sure the model is: one sigma of its relative step-time error, and why."""

    kind: SigmaKind
    sigma: float
    """One standard deviation of the relative error (0.35 = 35%)."""
    source: str
    """Where sigma comes from, in words (printed with every tie call)."""
    split: ErrorSplit | None = None
    """sigma split into the part common to the candidates of one problem and each
    candidate's own part (what a tie of two predictions is tested on: their ratio's sigma,
    `ErrorSplit.ratio_sigma`); None: ties tested against sigma itself."""

    @property
    def ratio_sigma(self) -> float:
        """Sigma of the log-ratio of two predictions (sigma itself without a split)."""
        return self.split.ratio_sigma if self.split else self.sigma


@dataclass(frozen=True)
class RecommendRequest:
    """What `cpbench recommend` is asked."""

    heads: int
    kv_heads: int
    seq_len: int = 131072
    """Global sequence length."""
    head_dim: int = 128
    batch: int = 1
    """Micro-batch (sequences per step of one data-parallel rank)."""
    gpus: int = 8
    gpus_per_node: int | None = None
    """Devices per node; None = the hardware profile's."""
    hardware: str | None = None
    """Profile name or TOML path; None = h100-sxm (cpu-local when all results are CPU runs)."""
    dtype: str = "bfloat16"
    causal: bool = True
    documents: str | None = None
    """Packed documents: lengths, a file of lengths or a distribution
    (`cpbench.config.documents.resolve_documents`); None = one sequence."""
    window: int | None = None
    """Sliding window W (a query sees the last W keys); None = unbounded."""
    seed: int = 0
    """Seed of a `documents` distribution."""
    tp: int = 1
    """Tensor-parallel size (splits the heads before CP)."""
    pp: int = 1
    cp: int | None = None
    """Context-parallel size; None = gpus / (TP x PP)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (global batch formula)."""
    phase: Phase = "fwd+bwd"
    """Rank by the forward step, or forward+backward (training)."""
    results: tuple[str, ...] = ()
    """Results files: calibrate the profile on them, rank measured configurations by their
    measurement."""
    top: int = 10
    """Feasible candidates to list (0 = all)."""
    cp_comms: tuple[CpComm, ...] | None = None
    """How the ring axis may exchange K/V: p2p (ring hops) and / or all_gather (the Llama 3
    scheme, as U x A meshes). None: both without results; with results, the ways they
    measured (the calibration fits only what was measured, so an unmeasured scheme would be
    ranked by an uncalibrated model beside calibrated ones)."""
    heads_k_strides: tuple[int | None, ...] = (None, 1)
    """Head strides tried for all-gather candidates: None = all KV heads in one gather, 1 =
    one KV head per gather (strides that do not divide a rank's KV heads are left out)."""


@dataclass(frozen=True)
class RankedCandidate:
    """A feasible candidate with its prediction and, when measured, its measurement."""

    prediction: Prediction
    """The (calibrated) model's prediction."""
    measured_s: float | None = None
    """Measured step time (results record median) when this configuration was measured."""
    record_id: str | None = None
    interval: PredictionInterval | None = None
    """The prediction with its uncertainty: step x exp(+-sigma) (`Uncertainty`)."""
    measured_interval: Interval | None = None
    """The measured median's 95% interval, when measured (`results.frame.record_interval`)."""

    @property
    def low_s(self) -> float:
        """Lower end of what it is ranked by (the measured interval, else the predicted)."""
        if self.measured_s is not None:
            return self.measured_interval.low if self.measured_interval else self.measured_s
        return self.interval.low_s if self.interval else self.prediction.step_s

    @property
    def high_s(self) -> float:
        """Upper end of what it is ranked by."""
        if self.measured_s is not None:
            return self.measured_interval.high if self.measured_interval else self.measured_s
        return self.interval.high_s if self.interval else self.prediction.step_s

    @property
    def time_s(self) -> float:
        """What it is ranked by: the measurement when there is one, else the prediction."""
        return self.measured_s if self.measured_s is not None else self.prediction.step_s

    @property
    def source(self) -> str:
        return "measured" if self.measured_s is not None else "model"

    @property
    def sigma(self) -> float | None:
        """The predicted interval's relative sigma (None when measured or without one)."""
        return self.interval.relative_sigma if self.interval and self.measured_s is None else None

    @property
    def plus_minus(self) -> float | None:
        """The ± of the time: sigma, or half the measured interval's width over the median."""
        if self.measured_s is None:
            return self.sigma
        return (self.high_s - self.low_s) / (2 * self.time_s) if self.time_s > 0 else 0.0

    @property
    def interval_source(self) -> str:
        """Where `low_s` .. `high_s` comes from, in words."""
        if self.measured_s is not None:
            m = self.measured_interval
            return f"measured: the median's 95% interval ({m.method if m else 'no interval'})"
        return self.interval.source if self.interval else ""

    @property
    def label(self) -> str:
        """`U x R layout`, then `all-gather` (and `hs<stride>`) when the ring axis gathers."""
        c = self.prediction.candidate
        return f"{c.ulysses}x{c.ring} {layout_label(self.prediction)}{comm_label(self.prediction)}"


@dataclass(frozen=True)
class Rejection:
    """A candidate that cannot run, with the rule that rejects it."""

    ulysses: int
    ring: int
    layouts: tuple[str, ...]
    rule: str
    """The rule with the numbers (check_mesh's reason, or the memory rule)."""
    kind: str
    """mesh or memory."""
    cp_comm: str = "p2p"
    """How the rejected candidates' ring axis exchanges K/V (p2p or all_gather)."""


CaveatKind = Literal[
    "cp1", "te_chunks", "te_layout", "kv_replication", "no_a2a_all_gather", "te_all_gather",
    "ds_ulysses", "ds_gqa", "ds_ring", "no_ulysses_mesh", "closest_ulysses", "yunchang",
    "torchtitan", "titan_ulysses", "closest_ring", "no_ring_mesh", "ag_alternative",
    "ag_best_has_ulysses", "ag_ulysses_megatron", "llama3", "llama3_layout", "gather_only",
    "documents", "ring_flash_documents", "ring_only", "window", "closest_layout",
]
"""What a framework caveat is about (`cpbench/data/settings/frameworks.toml` words each)."""


@dataclass(frozen=True)
class Caveat:
    """One thing to know about a framework setting."""

    kind: CaveatKind
    values: tuple[int, ...] = ()
    """Its numbers: a degree, a stride, a replication factor, KV heads."""
    name: str = ""
    """Its name: a layout, a framework, a ring implementation."""
    candidate: str = ""
    """The candidate it points to (the closest alternative), by label."""
    position: int = 0
    """That candidate's rank (1 = the winner)."""
    time_s: float = 0.0
    """That candidate's time, seconds."""


@dataclass(frozen=True)
class FrameworkSetting:
    """How to run the winner (or the closest thing) in one framework."""

    framework: str
    """Megatron-LM, DeepSpeed, yunchang, torchtitan, ring-flash-attn or all-gather CP."""
    expressible: bool
    """Whether the framework can express the winning mesh and layout."""
    settings: str
    """Flags, config keys or code."""
    note: str = ""
    """What to watch out for, in words (`cpbench plan`'s settings)."""
    caveats: tuple[Caveat, ...] = ()
    """What to watch out for, or what the framework runs instead, as facts (`recommend`)."""


TieBreak = Literal["clear", "measured", "memory", "likeliest", "simpler_setting"]
"""What named the pick: no tie; a measured tie settled by re-measurement; else the first
rule of `TIE_BREAK_RULES` that leaves one candidate."""
TIE_BREAK_RULES = (
    "among predictions within the ratio's uncertainty: (1) memory, only where it binds: a "
    "candidate whose longest sequence is within 10% of the requested length (or under it) "
    "gives way to one with headroom; (2) likeliest: the candidate most likely fastest, the "
    "fastest prediction (the same per-candidate sigma for each), with the probability that "
    "it is faster than the next; (3) simpler_setting, between equal predictions only: p2p "
    "before all-gather, no head stride, one CP axis before two, zigzag before striped before "
    "contiguous. A tie led by a measurement keeps the fastest measured median"
)
"""The stated tie-break (printed with every tie)."""


@dataclass(frozen=True)
class TieCall:
    """Whether the leaders of the ranking tie within the uncertainty."""

    tied: tuple[RankedCandidate, ...]
    """The leader and every candidate tied with it, fastest first (one: a clear winner)."""
    runner_up: RankedCandidate | None
    """The fastest candidate not tied with the leader (None: every candidate ties, or one)."""
    rule: str
    """How a tie is decided here (the model's sigma; `TIE_RULE` for measured pairs)."""
    message: str
    """The sentence printed under the table."""
    resolved_by: str | None = None
    """How a tie among measured leaders was settled (an interleaved re-measurement), if it
    was."""
    decided_by: TieBreak = "clear"
    """Which rule named the pick (`TIE_BREAK_RULES`): clear (no tie), measured (the fastest
    measured median, or an interleaved re-measurement), memory, likeliest or simpler_setting."""
    decision: str = ""
    """The tie-break in words, with the numbers that decided it."""

    @property
    def clear(self) -> bool:
        """One candidate is faster than every other beyond the uncertainty."""
        return len(self.tied) == 1

    @property
    def measured(self) -> bool:
        """Whether a tied candidate is measured (their measured intervals overlap)."""
        return any(r.measured_s is not None for r in self.tied)

    @property
    def pick(self) -> RankedCandidate:
        return self.tied[0]


# ------------------------------------------------------------ why the winner wins, as facts

Balance = Literal["no_mask", "ulysses_any_mask", "ulysses", "balanced", "imbalanced", "masked"]
"""How the winner's causal work is spread: no causal mask; Ulysses under a document / window
mask (balanced, no padding); Ulysses (whole sequence per rank); a ring layout that balances
(slowest / mean <= 1.01) or one that leaves imbalance; a masked ring (see `MaskFacts`)."""


@dataclass(frozen=True)
class CandidateFacts:
    """The numbers of one candidate an explanation cites."""

    label: str
    """`U x R layout` (`RankedCandidate.label`)."""
    time_s: float
    """What it is ranked by: seconds per layer and micro-batch."""
    comm_s: float
    """Communication of its phase, serialised."""
    exposed_comm_s: float
    """Communication not hidden behind compute."""
    memory_bytes: int
    """Bytes per rank (attention layer lower bound)."""
    max_seq_len: int
    """Longest sequence that fits its mesh."""
    gathered_bytes: int
    """Gathered K/V a rank holds in the forward (0 unless the ring axis gathers)."""
    launches: float
    """Kernel launches (steps) of its phase."""


@dataclass(frozen=True)
class LayoutFacts:
    """One layout's causal work on a mesh under a document or window mask."""

    layout: str
    work_imbalance: float
    """Slowest ring rank's work / mean."""
    slowest_ring_rank: int
    ring_steps: int
    """Ring steps run (of R)."""
    padding: int
    padding_fraction: float
    """Extra query-key pairs from the padding (fraction)."""


@dataclass(frozen=True)
class MaskFacts:
    """Why the layout under a document or window mask, on the fastest ring mesh."""

    ulysses: int
    """U of the fastest ring mesh."""
    ring: int
    """R of the fastest ring mesh."""
    winner: bool
    """Whether that ring candidate is the winner."""
    fallback: CandidateFacts | None
    """The fastest ring candidate when the winner has no ring (should one be needed)."""
    best: LayoutFacts
    """That candidate's layout."""
    layouts: dict[str, LayoutFacts]
    """Every layout ranked on that mesh, by name."""
    documents: int
    """Packed documents (0: one sequence)."""
    window: int | None


@dataclass(frozen=True)
class GatherFacts:
    """Where all-gather wins or loses against the ring and Ulysses."""

    best: CandidateFacts
    kv_heads_per_rank: int
    received_bytes: int
    """Bytes received per rank per forward."""
    gathers: int
    """Gathers (head strides) per pass."""
    stride: int
    ring: CandidateFacts | None
    pure: tuple[CandidateFacts, CandidateFacts] | None
    """(all-gather, ring) without Ulysses, when the best all-gather has U > 1."""
    strided: tuple[CandidateFacts, CandidateFacts, int] | None
    """(strided, unstrided, stride) on one mesh and layout."""
    fastest_ulysses: CandidateFacts | None


@dataclass(frozen=True)
class LinkUse:
    """Bytes a rank sends per layer on one link."""

    bytes: int
    """Forward plus backward bytes."""
    kind: CollectiveKind
    link: str


@dataclass(frozen=True)
class TierBound:
    """A link tier that sets the bandwidth time of one collective kind the winner calls."""

    kind: CollectiveKind
    tier: str
    """The tier: a `[topology]` tier's kind (nvlink, pcie_switch, host_bridge, numa_node,
    socket), or intra_node / inter_node on a flat profile and for the network."""
    name: str
    """The tier's technology, as the profile names it."""
    source: str
    """Where its bus bandwidth comes from (the profile's source text)."""


@dataclass(frozen=True)
class Explanation:
    """Why the winner wins (`cpbench.render.recommend.explanation.why_lines` and `explanation_text`)."""

    winner: CandidateFacts
    measured: bool
    phase: Phase
    runner_up: CandidateFacts | None
    """The fastest candidate on another mesh (None: the only feasible mesh)."""
    margin: float | None
    """runner_up time / winner time - 1."""
    same_mesh_ties: tuple[str, ...]
    """Layouts on the winner's mesh at the same time."""
    all_gather: bool
    placement: Placement
    """Where the winner's groups sit and which tier each collective uses."""
    links: tuple[LinkUse, ...]
    balance: Balance
    layout: str
    mask_label: str
    work_imbalance: float
    """Slowest / mean rank work."""
    imbalance_s: float
    """Time the busiest rank adds per step."""
    heads_per_rank: int
    """Query heads per rank after the all-to-all."""
    kv_heads_per_rank: int
    """KV heads per rank after the all-to-all."""
    kv_replication: int
    """KV heads replicated this many times for the all-to-all."""
    kernel_seq_len: int
    """Tokens the kernel works on (L / R)."""
    attention_tflops: float
    curve_note: str
    """Which kernel and efficiency curve priced the compute."""
    memory_capacity_bytes: float
    """Device memory per rank, bytes."""
    mask: MaskFacts | None = None
    """The mask's facts (document or window masks)."""
    gather: GatherFacts | None = None
    """The all-gather's facts (when all-gather candidates were ranked)."""
    bounds: tuple[TierBound, ...] = ()
    """The tiers whose bandwidth sets the winner's collectives' times."""
    tie_break: str = ""
    """Why the winner was picked among the candidates it ties with (`TieCall.decision`; empty:
    a clear winner). With it, `margin` may be negative: a tied candidate predicted faster."""


@dataclass(frozen=True)
class Recommendation:
    """The answer of `recommend`."""

    request: RecommendRequest
    profile: HardwareProfile
    """The profile used (calibrated when results were given)."""
    sizes: ParallelSizes
    shape: AttentionShape
    """The attention problem of one TP rank (heads / TP)."""
    gpus_per_node: int
    """Devices per node used for placement."""
    ranked: tuple[RankedCandidate, ...]
    """Feasible candidates, fastest first (all of them)."""
    rejected: tuple[Rejection, ...]
    explanation: Explanation | None
    """Why the winner wins, as facts (None: nothing is feasible)."""
    frameworks: tuple[FrameworkSetting, ...]
    calibration: CalibrationResult | None
    warnings: tuple[str, ...] = ()
    """What the user should know about the answer (e.g. no built-in profile describes the
    measured GPU, so the calibration started from a fallback)."""
    mask: MaskSpec = MaskSpec()
    """The mask ranked under (documents resolved from the request)."""
    uncertainty: Uncertainty | None = None
    """Sigma of the model's relative error and its source (None only before ranking)."""
    tie: TieCall | None = None
    """Whether the leaders tie (None when nothing is feasible)."""

    @property
    def winner(self) -> RankedCandidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def listed(self) -> tuple[RankedCandidate, ...]:
        """The candidates the answer lists: the first `top` ranked (all for 0)."""
        return self.ranked if self.request.top == 0 else self.ranked[: self.request.top]

    def tied(self, candidate: RankedCandidate) -> bool:
        """Whether `candidate` ties with the pick."""
        return self.tie is not None and any(candidate is r for r in self.tie.tied)


def layout_label(prediction: Prediction) -> str:
    """The layout, or `any` when it cannot matter (R = 1, or no causal mask)."""
    if prediction.candidate.ring == 1 or not prediction.candidate.causal:
        return "any"
    return prediction.candidate.layout


def comm_label(prediction: Prediction) -> str:
    """`""` for p2p (or no ring axis); ` all-gather` and ` all-gather hs<stride>` otherwise."""
    c = prediction.candidate
    if not c.all_gather:
        return ""
    return " all-gather" + ("" if c.heads_k_stride is None else f" hs{c.heads_k_stride}")


LAYOUT_PREFERENCE = {"zigzag": 0, "striped": 1, "contiguous": 2, "doc_zigzag": 3, "balanced": 4}
"""Among equal times prefer zigzag: every framework that load-balances uses it (then the
layouts frameworks support before cpbench's own balanced one)."""


def rank_key(r: RankedCandidate) -> tuple[float, int, int, int, int]:
    """Time (to 4 significant digits, so float noise cannot reorder ties), then p2p before
    all-gather (the ring holds less memory), layout preference, memory, and the larger
    Ulysses degree."""
    p = r.prediction
    return (
        float(f"{r.time_s:.4g}"),
        int(p.candidate.all_gather),
        LAYOUT_PREFERENCE[p.candidate.layout],
        p.memory_bytes,
        -p.candidate.ulysses,
    )
