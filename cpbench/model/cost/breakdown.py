"""What a prediction is made of: the time breakdown of a phase (`PhaseTime`), the bytes per
link tier (`TierTraffic`) and the linear pieces of the communication time (`CommTerm`).
Units: seconds, bytes, FLOP."""

from __future__ import annotations

from dataclasses import dataclass, fields

from cpbench.config.vocabulary import Pass, Passes
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.profile import LinkTier


@dataclass(frozen=True)
class PhaseTime:
    """Predicted time of one phase of one layer, with its breakdown (seconds)."""

    phase: Passes
    """forward, backward or forward_backward."""
    total_s: float
    """Predicted step time: compute_s + imbalance_s + exposed_comm_s."""
    compute_s: float
    """Kernel time at perfect balance (mean rank's FLOPs) plus per-step overheads."""
    imbalance_s: float
    """Extra kernel time because the busiest rank of each ring step sets the step."""
    exposed_comm_s: float
    """Communication time not hidden behind compute."""
    comm_s: float
    """All communication serialised (what a comm-only measurement sees)."""
    ulysses_comm_s: float
    """All-to-all time (always exposed)."""
    ring_comm_s: float
    """Ring hop time (with cp_comm all_gather: all-gather and reduce-scatter time),
    serialised."""
    memory_bound_s: float
    """Memory-bound seconds (ring merges, accumulations) in the time-setting compute."""
    overlappable_s: float
    """Sum over ring steps of min(compute, comm): what perfect overlap hides."""
    slowest_flops: float
    """FLOPs that set the kernel time, summed over steps: the busiest rank's, or on a node with
    more ranks than compute slots the mean rank's x ranks / slots when that is larger."""
    steps: float
    """Step overheads paid: k per phase, the ring steps run (x ranks / slots where the node's
    share sets a step)."""
    calls: float = 0.0
    """Kernel calls beyond one document's schedule paid (`work.extra_calls`), each at the
    profile's call overhead (x ranks / slots where the node's share sets a step)."""

    def __add__(self, other: PhaseTime) -> PhaseTime:
        values = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name != "phase"
        }
        return PhaseTime(phase="forward_backward", **values)

    @classmethod
    def priced(
        cls, phase: Pass, total_s: float, balanced_s: float, slowest_s: float, ulysses_s: float,
        ring_s: float, memory_s: float, overlappable_s: float, flops: float, steps: float,
        calls: float = 0.0,
    ) -> PhaseTime:
        """The breakdown of a phase from its time, its kernel time at perfect balance and on
        the slowest rank, and its serialised all-to-all and ring (or all-gather) time."""
        return cls(
            phase, total_s, balanced_s, max(0.0, slowest_s - balanced_s),
            total_s - max(slowest_s, balanced_s), ulysses_s + ring_s, ulysses_s, ring_s,
            memory_s, overlappable_s, flops, steps, calls,
        )  # fmt: skip


@dataclass(frozen=True)
class TierTraffic:
    """Bytes one rank sends through one collective kind on one link tier, per layer."""

    tier: LinkTier
    """intra_node or inter_node."""
    kind: CollectiveKind
    """all_to_all or send_recv (the all-gather stage counts as all_to_all: it is priced on the
    all-to-all link cost)."""
    forward_bytes: int
    backward_bytes: int

    @property
    def total_bytes(self) -> int:
        """Forward plus backward bytes."""
        return self.forward_bytes + self.backward_bytes


@dataclass(frozen=True)
class CommTerm:
    """A linear piece of the serialised communication time: messages x latency + bytes / bw.

    Calibration fits latency and bandwidth per (tier, kind) on these pieces; the cost model
    sums the same pieces, so the two cannot disagree.
    """

    tier: LinkTier
    kind: CollectiveKind
    phase: Pass
    """forward or backward."""
    messages: int
    """Calls (or concurrent exchanges) paying the latency."""
    bytes: float
    """Bytes a rank sends, scaled by the ranks sharing the link (a NIC); on a topology, the
    bytes per device across `level`'s links (so that bytes / that level's busbw is its time)."""
    level: int | None = None
    """On a profile with a `[topology]`: the node tier (index into `node_tiers()`) whose
    latency (`messages`) or per-device bandwidth (`bytes`) this term prices (the highest level
    a call crosses pays the latency, its bounding level the bandwidth); None where `tier`'s
    link is priced (a flat profile, or the network between nodes)."""
