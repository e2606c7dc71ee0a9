"""What an explanation of a recommendation says, as facts: the margin, the communication left
exposed, the imbalance, the memory, the mask's and the all-gather's numbers
(`cpbench.app.recommend.explain` finds them; `cpbench.render.recommend` words them;
`dataclasses.asdict` of an `Explanation` is the `--json` answer's `explanation`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpbench.config.vocabulary import Phase
from cpbench.model.cost import Placement
from cpbench.model.formulas import CollectiveKind

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
    """The layout."""
    work_imbalance: float
    """Slowest ring rank's work / mean."""
    slowest_ring_rank: int
    """The ring rank with the most work."""
    ring_steps: int
    """Ring steps run (of R)."""
    padding: int
    """Padding tokens."""
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
    """Sliding window W, if any."""


@dataclass(frozen=True)
class GatherFacts:
    """Where all-gather wins or loses against the ring and Ulysses."""

    best: CandidateFacts
    """The fastest all-gather candidate."""
    kv_heads_per_rank: int
    """KV heads per rank it gathers."""
    received_bytes: int
    """Bytes received per rank per forward."""
    gathers: int
    """Gathers (head strides) per pass."""
    stride: int
    """KV heads per gather."""
    ulysses: int
    """U of its mesh."""
    ring: CandidateFacts | None
    """The ring on the same mesh."""
    pure: tuple[CandidateFacts, CandidateFacts] | None
    """(all-gather, ring) without Ulysses, when the best all-gather has U > 1."""
    strided: tuple[CandidateFacts, CandidateFacts, int] | None
    """(strided, unstrided, stride) on one mesh and layout."""
    fastest_ulysses: CandidateFacts | None
    """The fastest Ulysses-only candidate."""


@dataclass(frozen=True)
class LinkUse:
    """Bytes a rank sends per layer on one link."""

    bytes: int
    """Forward plus backward bytes."""
    kind: CollectiveKind
    """all_to_all or send_recv."""
    link: str
    """The link's name in the profile."""


@dataclass(frozen=True)
class Explanation:
    """Why the winner wins (`cpbench.render.recommend.why_lines` and `explanation_text`)."""

    winner: CandidateFacts
    """The winner's numbers."""
    measured: bool
    """Whether the winner's time is a measurement."""
    phase: Phase
    """The phase ranked by."""
    runner_up: CandidateFacts | None
    """The fastest candidate on another mesh (None: the only feasible mesh)."""
    margin: float | None
    """runner_up time / winner time - 1."""
    same_mesh_ties: tuple[str, ...]
    """Layouts on the winner's mesh at the same time."""
    all_gather: bool
    """Whether the winner's ring axis gathers K/V."""
    placement: Placement
    """Where the winner's groups sit and which tier each collective uses."""
    links: tuple[LinkUse, ...]
    """Bytes per link the winner sends."""
    balance: Balance
    """How its causal work is spread."""
    layout: str
    """Its layout."""
    mask_label: str
    """Its mask, named."""
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
    """Kernel TFLOP/s per rank."""
    curve_note: str
    """Which kernel and efficiency curve priced the compute."""
    memory_capacity_bytes: float
    """Device memory per rank, bytes."""
    mask: MaskFacts | None = None
    """The mask's facts (document or window masks)."""
    gather: GatherFacts | None = None
    """The all-gather's facts (when all-gather candidates were ranked)."""
