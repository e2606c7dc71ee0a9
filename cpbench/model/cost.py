"""Cost model: predicted step time of one CP attention layer on a hardware profile. Pure Python.

Inputs: a configuration (shape, U x R mesh, layout, dtype, causal mask, KV replication), a
`HardwareProfile` and the number of devices per node. The model follows what the
implementation does (`cpbench/attention/`):

- **Placement.** CP rank `p` sits on global rank `p * rank_stride` (`rank_stride` = TP in
  Megatron's tp-cp-dp-pp order, 1 otherwise); node = global rank // devices per node. Ulysses
  groups are runs of U consecutive CP ranks: inside a node when they fit, otherwise the part of
  an all-to-all going to peers on other nodes uses the inter-node tier. Ring groups are strided
  by U: when any hop of a ring crosses a node boundary, that hop paces every step (the ring is
  synchronous), so the ring runs at the inter-node send/recv speed.
- **Shared compute.** A profile may have fewer compute slots per node than ranks (CPU cores):
  then a step takes at least the mean rank's time x ranks / slots, because idle ranks lend
  their slots to busy ones (on 4 ranks over 2 cores the causal imbalance of a layout matters
  little, the total work does).
- **Kernel.** The efficiency curve is that of the kernel family the configuration runs
  (`MeshCandidate.kernel`, a record's `config.kernel` or `backend`: `auto` is the profile's
  default family on its device, e.g. FlashAttention-2 on a CUDA profile in bf16); a family the
  profile has no curve for reads the default family's (`Prediction.curve_note` says which).
- **Mask.** The candidate's mask (`MeshCandidate.documents`, `window`) sets the work of every
  rank at every ring step (`flops.layout_work`: the mask geometry of `model/masking.py` for
  packed documents, windows and the doc_zigzag / balanced layouts), the ring steps k the mask
  needs (steps k..R-1 are not run: no compute, no hop, no overhead) and, for doc_zigzag, the
  run length L_run = L + padding that every byte and FLOP term uses.
- **Compute.** The kernel of a ring step runs at `peak(dtype) x efficiency(L_run/R)` FLOP/s on
  `flops.py`'s per-step work of the busiest rank (the slowest rank sets the step), plus the
  profile's fixed `step_overhead` per step, plus the memory-bound fp32 work of ring.py at the
  profile's memory bandwidth (forward: the online-softmax merge, 7 passes over the output
  accumulator from step 1 on; backward: the dQ accumulation, 3 passes over Q-sized, and the
  dK/dV accumulation, 7 passes over K/V-sized fp32 tensors, every step); backward = 2.5 x
  forward FLOPs.
- **Ring.** Forward: steps `s = 0..k-2` post the next K/V hop before computing, so a step takes
  `max(c_s, h) + (1 - overlap) * min(c_s, h)`; the last step computes with no transfer in flight.
  Backward: K/V hops (steps 0..k-2) and the fp32 dK/dV accumulator hops (posted after each
  step's compute, in flight during the next step) share the link; the last dK/dV hop (to the
  owner) is exposed; k = 1 sends nothing. (The textbook "max(compute, comm) per step plus the first, unhidden step": here the
  step computed with nothing in flight is the last forward step, since step 0 computes on the
  own chunk while the first hop travels.)
- **All-gather** (`cp_comm = "all_gather"` on the ring axis, `cpbench/attention/allgather.py`).
  No ring steps: a rank computes all its pieces against the gathered K/V, so its kernel time is
  its own total (the slowest rank's pairs, not a sum of busiest-per-step), in `G = (c*h_kv/U)
  / hs` strides of equal work, one step overhead per (stride, ring step) of pieces. Forward:
  the first stride's gather travels while the own chunk of that stride is computed on (the
  slowest rank's step-0 share of its work, `o`): `max(o, a) + (1 - overlap) * min(o, a)`; then
  the rest of stride 0 and every later stride compute while the next stride is gathered,
  `max(c_g, a) + (1 - overlap) * min(c_g, a)`, the last stride with nothing in flight; backward
  likewise, the reduce-scatter of stride g in flight during stride g+1 with the next gather,
  the last reduce-scatter exposed. One stride (the default) can hide its gather only behind
  the own chunk (1/R of the work) and exposes the whole reduce-scatter: the honest trade
  against ring hops hidden behind compute at every step. A gather
  of `b` bytes received (nccl-tests busbw view: (R-1)/R of its output) takes `latency +
  b / busbw` on the all-to-all link cost of the ring axis' tier (inter-node when the group
  spans nodes, the NIC shared as for the ring): nccl-tests' all_gather and alltoall busbw
  are alike on NVLink and on a NIC.
- **Ulysses.** The all-to-alls (Q, K/V, O forward; dO, dQ, dK/dV backward) are not overlapped:
  each costs `latency + bytes a rank sends / busbw` on its tier.
- **Breakdown** of a phase: `compute` (the mean rank's kernel time: perfect balance),
  `imbalance` (busiest-rank-per-step compute minus that), `exposed comm` (the rest of the step
  time); `comm` is all communication serialised (what a comm-only measurement sees).
- **Memory** per rank from `memory.py` (a lower bound for one layer, fwd+bwd peak) against the
  profile's capacity, and the largest sequence that fits.

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any

from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.config.vocabulary import (
    GLOBAL_LAYOUTS,
    PASSES,
    PHASE_PASSES,
    Pass,
    Passes,
)
from cpbench.errors import CpbenchError
from cpbench.model.flops import (
    BACKWARD_FACTOR,
    LayoutWork,
    flops_per_pair,
    layout_work,
    ring_step_pairs,
)
from cpbench.model.formulas import (
    CollectiveKind,
    CommVolume,
    comm_volume,
)
from cpbench.model.hardware.profile import (
    HardwareProfile,
    LinkCost,
    LinkTier,
)
from cpbench.model.memory import max_seq_len_for_budget, memory_estimate
from cpbench.model.topology import (
    PLACEMENT_ORDERS,
    CollectiveTime,
    TopologyPlacement,
    all_to_all_time,
    ring_hop_time,
)
from cpbench.model.topology import place as place_on
from cpbench.units import GIB

MERGE_FORWARD_PASSES = 7
"""fp32 passes over the output accumulator per forward merge (ring.py `_merge`)."""
ACCUMULATE_Q_PASSES = 3
"""fp32 passes over a Q-sized tensor per backward step (dQ += block dQ)."""
ACCUMULATE_KV_PASSES = 7
"""fp32 passes over a K/V-sized tensor per backward step (block dK/dV, received + block)."""
MAX_EXACT_RING = 64
"""Rings up to this size take their per-step work from flops.py; larger ones use the same
closed forms (flops.py's step matrix is R x R)."""


# -------------------------------------------------------------------------------- candidate


# -------------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class Placement:
    """Where the CP groups of a U x R mesh sit and which link tier each collective uses (the
    facts; `cpbench.render.recommend.placement_text` words them)."""

    ulysses: int
    """U."""
    ring: int
    """R."""
    devices_per_node: int
    """G: devices (ranks) per node."""
    rank_stride: int
    """Global ranks between consecutive CP ranks (TP in Megatron's order, else 1)."""
    nodes: int
    """Nodes the CP group spans."""
    ulysses_tier: LinkTier
    """Tier of the all-to-all: inter_node when a Ulysses group spans nodes."""
    ulysses_peers_in_node: int
    """k: members of the worst Ulysses group on one node (itself included); k = U inside."""
    ring_tier: LinkTier
    """Tier pacing the ring: inter_node when any hop crosses a node boundary."""
    ring_crossing_hops: int
    """Hops of the worst ring group (out of R) that cross a node boundary."""

    @property
    def ulysses_inter_fraction(self) -> Fraction:
        """Share of a rank's all-to-all bytes sent to other nodes: (U - k) / (U - 1)."""
        if self.ulysses == 1:
            return Fraction(0)
        return Fraction(self.ulysses - self.ulysses_peers_in_node, self.ulysses - 1)


def placement(ulysses: int, ring: int, devices_per_node: int, rank_stride: int = 1) -> Placement:
    """Placement of a U x R mesh on nodes of `devices_per_node` devices."""
    for name, value in (
        ("ulysses", ulysses),
        ("ring", ring),
        ("devices per node", devices_per_node),
        ("rank stride", rank_stride),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CpbenchError(f"{name} must be a positive integer, got {value!r}")

    def node(cp_rank: int) -> int:
        return cp_rank * rank_stride // devices_per_node

    world = ulysses * ring
    peers = ulysses
    for j in range(ring):
        nodes = [node(j * ulysses + u) for u in range(ulysses)]
        peers = min(peers, min(nodes.count(n) for n in set(nodes)))
    crossing = 0
    if ring > 1:
        for u in range(ulysses):
            hops = sum(
                node(j * ulysses + u) != node(((j + 1) % ring) * ulysses + u) for j in range(ring)
            )
            crossing = max(crossing, hops)
    return Placement(
        ulysses,
        ring,
        devices_per_node,
        rank_stride,
        node(world - 1) - node(0) + 1,
        "intra_node" if peers == ulysses else "inter_node",
        peers,
        "inter_node" if crossing else "intra_node",
        crossing,
    )


# --------------------------------------------------------------------------------- results


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

    def __add__(self, other: PhaseTime) -> PhaseTime:
        values = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name != "phase"
        }
        return PhaseTime(phase="forward_backward", **values)


@dataclass(frozen=True)
class TierTraffic:
    """Bytes one rank sends through one collective kind on one link tier, per layer."""

    tier: LinkTier
    """intra_node or inter_node."""
    kind: CollectiveKind
    """all_to_all or send_recv (the all-gather stage counts as all_to_all: it is priced on the
    all-to-all link cost)."""
    forward_bytes: int
    """Forward bytes."""
    backward_bytes: int
    """Backward bytes."""

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
    """Link tier."""
    kind: CollectiveKind
    """Collective kind."""
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


@dataclass(frozen=True)
class Prediction:
    """Predicted time, traffic and memory of one configuration on one profile."""

    candidate: MeshCandidate
    """What was predicted."""
    profile_name: str
    """Hardware profile used."""
    placement: Placement
    """Which tier each collective uses."""
    kernel_seq_len: int
    """L/R: the sequence length the kernel efficiency is read at."""
    kernel: str
    """Kernel family the configuration runs (`KernelFamily`; `auto` resolved on the profile)."""
    curve_kernel: str
    """Family whose efficiency curve was read: `kernel`, or the profile's default family when
    the profile has no curve for `kernel`."""
    curve_source: str
    """Where that curve comes from (the profile's source text)."""
    attention_tflops: float
    """Achieved kernel TFLOP/s per rank assumed (peak x efficiency)."""
    forward: PhaseTime
    """Forward breakdown."""
    backward: PhaseTime
    """Backward breakdown."""
    traffic: tuple[TierTraffic, ...]
    """Bytes per rank per (tier, kind); they sum to comm_volume's totals."""
    comm_terms: tuple[CommTerm, ...]
    """Linear pieces of the serialised communication time (for calibration)."""
    work_imbalance: float
    """Slowest / mean rank attention work under the layout and mask (1.0 = balanced)."""
    memory_bytes: int
    """Per-rank peak of the phase (memory.py's lower bound for one layer)."""
    memory_capacity_bytes: float
    """The profile's capacity per device."""
    max_seq_len: int
    """Largest sequence (a multiple of the layout's divisor) whose peak fits the capacity."""
    ring_steps: int = 1
    """k: ring steps run (R unless the mask lets the ring stop early)."""
    padding: int = 0
    """Padding tokens the layout adds (doc_zigzag)."""
    padding_fraction: float = 0.0
    """Pairs computed for padding / the mask's pairs."""
    work_overhead: float = 1.0
    """Slowest rank's pairs / the ideal share of the mask's pairs (imbalance and padding)."""
    slowest_ring_rank: int = 0
    """The ring rank with the most work."""
    topology: TopologyPlacement | None = None
    """Where the ranks sit on the profile's node topology (None: a flat profile, priced by
    `placement`'s two tiers); `cpbench.model.topology.describe` and `.export()` tell it."""

    @property
    def curve_note(self) -> str:
        """Which efficiency curve the prediction used, in one sentence."""
        requested = self.candidate.kernel
        runs = self.kernel if requested == self.kernel else f"{requested} runs {self.kernel}"
        if self.curve_kernel == self.kernel:
            return f"kernel {runs}: {self.kernel} efficiency curve of {self.profile_name}"
        return (
            f"kernel {runs}: {self.profile_name} has no {self.kernel} efficiency curve, "
            f"its default {self.curve_kernel} curve was used"
        )

    @property
    def forward_backward(self) -> PhaseTime:
        """Forward plus backward."""
        return self.forward + self.backward

    @property
    def phase_time(self) -> PhaseTime:
        """The breakdown of the candidate's phase (fwd or fwd+bwd)."""
        return self.forward if self.candidate.phase == "fwd" else self.forward_backward

    @property
    def step_s(self) -> float:
        """Predicted step time of the candidate's phase."""
        return self.phase_time.total_s

    @property
    def compute_only_s(self) -> float:
        """Predicted time with communication removed (busiest rank per step)."""
        t = self.phase_time
        return t.compute_s + t.imbalance_s

    @property
    def comm_only_s(self) -> float:
        """Predicted time of the communication alone."""
        return self.phase_time.comm_s

    @property
    def fits(self) -> bool:
        """Whether the per-rank peak fits the capacity."""
        return self.memory_bytes <= self.memory_capacity_bytes

    def bytes_by_tier(self, phase: str = "forward_backward") -> dict[str, int]:
        """Bytes per rank on each tier: phase forward, backward or forward_backward."""
        out = {"intra_node": 0, "inter_node": 0}
        for t in self.traffic:
            if phase == "forward":
                out[t.tier] += t.forward_bytes
            elif phase == "backward":
                out[t.tier] += t.backward_bytes
            else:
                out[t.tier] += t.total_bytes
        return out

    def memory_rule(self) -> str | None:
        """The rejection rule when the peak does not fit, else None."""
        if self.fits:
            return None
        return (
            f"needs {self.memory_bytes / GIB:.1f} GiB per rank > "
            f"{self.memory_capacity_bytes / GIB:.1f} GiB of device memory ({self.profile_name}); "
            f"the longest sequence that fits this mesh is {self.max_seq_len}"
        )


# ----------------------------------------------------------------------------- step work


@functools.lru_cache(maxsize=4096)
def step_pair_stats(
    seq_len: int, ring: int, layout: str, causal: bool
) -> tuple[tuple[Fraction, Fraction], ...]:
    """(busiest ring rank, mean over ring ranks) pairs at each ring step, all heads of a ring
    group: from flops.py's step matrix for R <= MAX_EXACT_RING, else in closed form."""
    if ring <= MAX_EXACT_RING:
        return tuple(
            (max(step), sum(step, Fraction(0)) / ring)
            for step in ring_step_pairs(seq_len, ring, layout, causal)
        )
    return closed_form_step_pair_stats(seq_len, ring, layout, causal)


def closed_form_step_pair_stats(
    seq_len: int, ring: int, layout: str, causal: bool
) -> tuple[tuple[Fraction, Fraction], ...]:
    """flops.py's (busiest, mean) pairs per ring step in closed form, n = L/R. Non-causal: n^2.
    Causal step 0 (own shard): n^2/2. Later steps s: contiguous, the R-s ranks after the
    source see the whole chunk (busiest n^2, mean (R-s)n^2/R); zigzag, every rank sees half
    (n^2/2); striped, ranks after the source n(n+1)/2, the s before it n(n-1)/2."""
    if layout not in GLOBAL_LAYOUTS:
        raise CpbenchError(
            f"layout {layout!r} has no closed form (one of {', '.join(GLOBAL_LAYOUTS)}): its "
            f"work comes from the mask geometry (mask_step_stats)"
        )
    n = Fraction(seq_len, ring)
    if not causal:
        return tuple((n * n, n * n) for _ in range(ring))
    stats = [(n * n / 2, n * n / 2)]
    for s in range(1, ring):
        if layout == "contiguous":
            stats.append((n * n, n * n * (ring - s) / ring))
        elif layout == "zigzag":
            stats.append((n * n / 2, n * n / 2))
        else:
            after, before = n * (n + 1) / 2, n * (n - 1) / 2
            stats.append((after, (after * (ring - s) + before * s) / ring))
    return tuple(stats)


@functools.lru_cache(maxsize=1024)
def config_work(config: CpProblem) -> LayoutWork:
    """The work of every ring rank and ring step of a configuration under its mask."""
    return layout_work(config)


def mask_step_stats(config: CpProblem) -> tuple[tuple[Fraction, Fraction], ...]:
    """(busiest ring rank, mean over ring ranks) pairs at each of the k ring steps the mask
    needs: `step_pair_stats` for causal or full attention on a global layout, otherwise the
    mask geometry's per-step pairs."""
    if config.plain_geometry:
        s = config.shape
        return step_pair_stats(s.seq_len, config.ring, config.layout, config.mask.causal)
    work = config_work(config)
    return tuple(zip(work.step_max_pairs, work.step_mean_pairs, strict=True))


# ------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class _Context:
    """What every part of one prediction needs."""

    config: MeshCandidate
    profile: HardwareProfile
    placement: Placement
    volume: CommVolume
    flops_per_s: float
    topology: TopologyPlacement | None = None


def predict(
    config_like: CpProblem | Mapping[str, Any],
    profile: HardwareProfile,
    gpus_per_node: int | None = None,
    rank_stride: int = 1,
) -> Prediction:
    """Predict one configuration; CpbenchError when the mesh is infeasible.

    `config_like` is a MeshCandidate (a BenchConfig is one), a CpProblem (fwd+bwd on the
    profile's kernel) or a results record's `config` dict; `gpus_per_node` defaults to the
    profile's devices per node.
    """
    candidate = _as_candidate(config_like)
    config = candidate.require_feasible()
    per_node = gpus_per_node if gpus_per_node is not None else profile.devices_per_node
    place = placement(config.ulysses, config.ring, per_node, rank_stride)
    kernel_seq_len = config.ring_shard
    work = config_work(config)
    family = profile.kernel_for(candidate.kernel, config.dtype)
    curve_family = family if profile.has_curve(family) else profile.default_kernel
    curve = profile.curve(curve_family)
    volume = comm_volume(config)
    flops_per_s = profile.peak_flops(config.dtype) * curve.at(kernel_seq_len)
    best: tuple[float, _Context, PhaseTime, tuple[CommTerm, ...], PhaseTime, tuple[CommTerm, ...]]
    best = (0.0, _Context(candidate, profile, place, volume, flops_per_s), *_NO_TIMES)
    for index, topo in enumerate(_topology_placements(config, profile, per_node, rank_stride)):
        ctx = _Context(candidate, profile, place, volume, flops_per_s, topo)
        forward, forward_terms = _phase_time(ctx, "forward")
        backward, backward_terms = _phase_time(ctx, "backward")
        total = forward.total_s + (0.0 if candidate.phase == "fwd" else backward.total_s)
        if index == 0 or total < 0.99 * best[0]:  # ulysses_low unless another is faster
            best = (total, ctx, forward, forward_terms, backward, backward_terms)
    _, ctx, forward, forward_terms, backward, backward_terms = best
    memory_phase = PHASE_PASSES[candidate.phase]
    return Prediction(
        candidate=candidate,
        profile_name=profile.name,
        placement=place,
        kernel_seq_len=kernel_seq_len,
        kernel=family,
        curve_kernel=curve_family,
        curve_source=curve.source,
        attention_tflops=ctx.flops_per_s / 1e12,
        forward=forward,
        backward=backward,
        traffic=_traffic(ctx),
        comm_terms=forward_terms + backward_terms,
        work_imbalance=work.imbalance,
        memory_bytes=memory_estimate(config).peak(memory_phase),
        memory_capacity_bytes=profile.memory_bytes,
        max_seq_len=max_seq_len_for_budget(profile.memory_bytes, config, memory_phase),
        ring_steps=config.ring_steps,
        padding=config.padding,
        padding_fraction=work.padding_fraction,
        work_overhead=work.overhead,
        slowest_ring_rank=work.slowest_ring_rank,
        topology=ctx.topology,
    )


_NO_TIMES: tuple[PhaseTime, tuple[CommTerm, ...], PhaseTime, tuple[CommTerm, ...]] = (
    PhaseTime("forward", *([0.0] * 11)),
    (),
    PhaseTime("backward", *([0.0] * 11)),
    (),
)


def _topology_placements(
    config: CpProblem, profile: HardwareProfile, per_node: int, rank_stride: int
) -> tuple[TopologyPlacement | None, ...]:
    """The placements to price: on a profile with a `[topology]` each order of
    `topology.PLACEMENT_ORDERS` (ulysses_low first; the prediction keeps the fastest, so the
    placement is part of the candidate); (None,) on a flat profile."""
    if profile.topology is None:
        return (None,)
    orders = PLACEMENT_ORDERS if config.ulysses > 1 and config.ring > 1 else PLACEMENT_ORDERS[:1]
    return tuple(
        place_on(config.ulysses, config.ring, profile, per_node, rank_stride, order)
        for order in orders
    )


def _as_candidate(config_like: CpProblem | Mapping[str, Any]) -> MeshCandidate:
    if isinstance(config_like, MeshCandidate):
        return config_like
    if isinstance(config_like, CpProblem):
        return MeshCandidate(**config_like.problem_fields())
    if isinstance(config_like, Mapping):
        return MeshCandidate.from_record(config_like)
    raise CpbenchError(
        f"cannot predict a {type(config_like).__name__}: give a MeshCandidate, a CpProblem or "
        f"a results record's config dict"
    )


def _phase_factor(phase: Pass) -> Fraction:
    return Fraction(1) if phase == "forward" else BACKWARD_FACTOR


def merge_bytes(config: CpProblem, phase: Pass, step: int) -> int:
    """fp32 bytes the ring's merge (forward) or accumulation (backward) moves at a step."""
    if config.ring == 1:
        return 0
    s = config.shape
    q_elements = s.batch * config.ring_shard * config.heads_per_rank * s.head_dim
    kv_elements = 2 * s.batch * config.ring_shard * config.kv_heads_per_rank * s.head_dim
    if phase == "forward":
        return 0 if step == 0 else MERGE_FORWARD_PASSES * q_elements * 4
    return (ACCUMULATE_Q_PASSES * q_elements + ACCUMULATE_KV_PASSES * kv_elements) * 4


def _step_merges(ctx: _Context, phase: Pass) -> list[float]:
    """Memory-bound seconds of each ring step of a phase."""
    c = ctx.config
    return [merge_bytes(c, phase, s) / ctx.profile.memory_bandwidth for s in range(c.ring_steps)]


@dataclass(frozen=True)
class _StepCost:
    """What sets one ring step's compute time, in pieces the calibration can refit."""

    seconds: float
    """Step compute time."""
    flops: float
    """FLOPs that set it (busiest rank, or the node's share when ranks share compute slots)."""
    overheads: float
    """Step overheads paid (1, or ranks / slots on a shared node)."""
    memory_s: float
    """Memory-bound seconds in it."""


def _node_share(ctx: _Context) -> float:
    """Ranks per compute slot on a node (> 1 only when more ranks than slots, e.g. CPU cores)."""
    slots = ctx.profile.compute_slots_per_node
    if slots is None:
        return 1.0
    place = ctx.placement
    ranks = min(place.devices_per_node, ctx.config.world * place.rank_stride)
    return max(1.0, ranks / slots)


def _step_costs(ctx: _Context, phase: Pass, merges: list[float]) -> list[_StepCost]:
    """Compute time of each ring step: the busiest rank's kernel, overhead and memory-bound
    work; on a node with more ranks than compute slots, at least the mean rank's times
    ranks / slots (the slots are shared, so idle ranks lend theirs)."""
    c = ctx.config
    per_pair = flops_per_pair(c.shape, c.ulysses) * _phase_factor(phase)
    stats = mask_step_stats(c)
    overhead, share = ctx.profile.step_overhead_s, _node_share(ctx)
    costs = []
    for (busiest, mean), merge in zip(stats, merges, strict=True):
        busiest_flops, mean_flops = float(busiest * per_pair), float(mean * per_pair)
        alone = busiest_flops / ctx.flops_per_s + overhead + merge
        shared = share * (mean_flops / ctx.flops_per_s + overhead + merge)
        if share > 1 and shared > alone:
            costs.append(_StepCost(shared, share * mean_flops, share, share * merge))
        else:
            costs.append(_StepCost(alone, busiest_flops, 1.0, merge))
    return costs


def _phase_time(ctx: _Context, phase: Pass) -> tuple[PhaseTime, tuple[CommTerm, ...]]:
    if ctx.config.all_gather:
        return _gather_phase_time(ctx, phase)
    c = ctx.config
    merges = _step_merges(ctx, phase)
    costs = _step_costs(ctx, phase, merges)
    computes = [cost.seconds for cost in costs]
    ulysses_s, ulysses_terms = _ulysses_time(ctx, phase)
    ring_total, ring_comm, overlappable, ring_terms = _ring_time(ctx, phase, computes)
    slowest = sum(computes)
    run_pairs = config_work(c).total  # the pairs the ranks compute, padding included
    mean_flops = float(run_pairs * flops_per_pair(c.shape, 1) * _phase_factor(phase)) / c.world
    balanced = _node_share(ctx) * (
        mean_flops / ctx.flops_per_s + c.ring_steps * ctx.profile.step_overhead_s + sum(merges)
    )
    total = ulysses_s + ring_total
    timing = PhaseTime(
        phase=phase,
        total_s=total,
        compute_s=balanced,
        imbalance_s=max(0.0, slowest - balanced),
        exposed_comm_s=total - max(slowest, balanced),
        comm_s=ulysses_s + ring_comm,
        ulysses_comm_s=ulysses_s,
        ring_comm_s=ring_comm,
        memory_bound_s=sum(cost.memory_s for cost in costs),
        overlappable_s=overlappable,
        slowest_flops=sum(cost.flops for cost in costs),
        steps=sum(cost.overheads for cost in costs),
    )
    return timing, ulysses_terms + ring_terms


def _ulysses_time(ctx: _Context, phase: Pass) -> tuple[float, tuple[CommTerm, ...]]:
    """Exposed all-to-all time of a phase and its linear pieces."""
    total, terms = 0.0, []
    for collective in ctx.volume.collectives(phase):
        if collective.kind != "all_to_all":
            continue
        seconds, pieces = _all_to_all_call(ctx, phase, collective.bytes_sent)
        total += seconds
        terms.extend(pieces)
    return total, tuple(terms)


def _all_to_all_call(ctx: _Context, phase: Pass, bytes_sent: int) -> tuple[float, list[CommTerm]]:
    """One all-to-all call: inside a node, or split between the tiers (the slower part sets
    the time, the inter-node latency is paid once)."""
    place, profile = ctx.placement, ctx.profile
    if ctx.topology is not None:  # the slowest crossed tier of the node topology bounds it
        timed = all_to_all_time(ctx.topology, bytes_sent)
        return timed.seconds, _level_terms(ctx.topology, timed, "all_to_all", phase)
    intra = profile.intra_node
    if place.ulysses_tier == "intra_node":
        term = CommTerm("intra_node", "all_to_all", phase, 1, bytes_sent)
        return intra.all_to_all.seconds(bytes_sent), [term]
    inter = profile.inter_node
    inter_bytes = float(bytes_sent * place.ulysses_inter_fraction)
    intra_bytes = bytes_sent - inter_bytes
    inter_scaled = inter_bytes * inter.devices_per_nic
    intra_s = intra_bytes / intra.all_to_all.busbw
    inter_s = inter_scaled / inter.all_to_all.busbw
    seconds = inter.all_to_all.latency_s + max(intra_s, inter_s)
    if inter_s >= intra_s:
        return seconds, [CommTerm("inter_node", "all_to_all", phase, 1, inter_scaled)]
    return seconds, [
        CommTerm("inter_node", "all_to_all", phase, 1, 0.0),
        CommTerm("intra_node", "all_to_all", phase, 0, intra_bytes),
    ]


def _ring_hop_bytes(ctx: _Context, phase: Pass) -> tuple[int, int]:
    """(K/V hop bytes, dK/dV hop bytes) per call of a phase; zeros without a ring."""
    kv = dkv = 0
    for collective in ctx.volume.collectives(phase):
        if collective.name == "p2p_kv":
            kv = collective.bytes_per_call
        elif collective.name == "p2p_dkv":
            dkv = collective.bytes_per_call
    return kv, dkv


def _ring_time(
    ctx: _Context, phase: Pass, computes: list[float]
) -> tuple[float, float, float, tuple[CommTerm, ...]]:
    """(ring stage time, serialised hop time, overlappable time, linear pieces)."""
    k = ctx.config.ring_steps
    if ctx.config.ring == 1 or k == 1:
        return computes[0], 0.0, 0.0, ()
    tier = ctx.placement.ring_tier
    link = ctx.profile.link(tier)
    cost, sharing = link.send_recv, link.devices_per_nic
    kv, dkv = _ring_hop_bytes(ctx, phase)
    overlap = ctx.profile.overlap
    total = comm = hidden = 0.0
    terms = []
    for s, compute in enumerate(computes):
        # The next step's K/V, and (from step 2) the dK/dV accumulator posted after step s-1:
        # the own chunk's gradient stays home, so the first accumulator leaves after step 1.
        in_flight = (kv if s < k - 1 else 0) + (dkv if s >= 2 else 0)
        if in_flight == 0:
            total += compute
            continue
        hop = _hop_seconds(ctx, cost, in_flight, sharing)
        comm += hop
        hidden += min(compute, hop)
        total += max(compute, hop) + (1 - overlap) * min(compute, hop)
        terms.extend(_hop_terms(ctx, tier, phase, in_flight, sharing))
    if dkv:
        home = _hop_seconds(ctx, cost, dkv, sharing)  # the last dK/dV hop goes home, exposed
        total += home
        comm += home
        terms.extend(_hop_terms(ctx, tier, phase, dkv, sharing))
    return total, comm, hidden, tuple(terms)


def _level_terms(
    placement: TopologyPlacement, timed: CollectiveTime, kind: CollectiveKind, phase: Pass
) -> list[CommTerm]:
    """The linear pieces of one collective on a topology: the latency of the highest level it
    crosses and the bandwidth time of its bounding level (their sum is `timed.seconds`)."""
    if timed.bounding < 0:
        return []
    tier: LinkTier = "inter_node" if timed.crosses_network else "intra_node"

    def term(index: int, messages: int, nbytes: float) -> CommTerm:
        level = placement.tiers[index]
        if level.kind == "network":  # the profile's inter_node link: bytes x NIC sharing
            return CommTerm("inter_node", kind, phase, messages, nbytes * level.devices_per_link)
        return CommTerm(tier, kind, phase, messages, nbytes, level=index)

    top, bound = len(timed.levels) - 1, timed.bounding
    per_device = timed.levels[bound].seconds * placement.tiers[bound].cost(kind).busbw
    return [term(top, 1, 0.0), term(bound, 0, per_device)]


def _hop_terms(
    ctx: _Context, tier: LinkTier, phase: Pass, nbytes: int, sharing: int
) -> list[CommTerm]:
    """The linear pieces of one ring exchange of `nbytes` per rank (`_hop_seconds`'s time)."""
    if ctx.topology is not None:
        return _level_terms(ctx.topology, ring_hop_time(ctx.topology, nbytes), "send_recv", phase)
    return [CommTerm(tier, "send_recv", phase, 1, float(nbytes * sharing))]


def _hop_seconds(ctx: _Context, cost: LinkCost, nbytes: int, sharing: int) -> float:
    """One ring exchange of `nbytes` per rank: on a topology the slowest hop's crossed tier
    (`topology.ring_hop_time`), else the ring tier's send/recv cost."""
    if ctx.topology is not None:
        return ring_hop_time(ctx.topology, nbytes).seconds
    return cost.seconds(nbytes, 1, sharing)


def _gather_call(ctx: _Context, phase: Pass, nbytes: int) -> tuple[float, CommTerm]:
    """One all-gather (or reduce-scatter) call of `nbytes` crossing the wire for a rank, on
    the all-to-all link cost of the ring axis' tier (the NIC shared as for the ring)."""
    tier = ctx.placement.ring_tier
    link = ctx.profile.link(tier)
    sharing = link.devices_per_nic
    seconds = link.all_to_all.seconds(nbytes, 1, sharing)
    return seconds, CommTerm(tier, "all_to_all", phase, 1, float(nbytes * sharing))


def _gather_phase_time(ctx: _Context, phase: Pass) -> tuple[PhaseTime, tuple[CommTerm, ...]]:
    """One phase of the all-gather scheme: G strides of equal work, the first gather behind
    the own chunk of stride 0 only, each later gather (and backward each reduce-scatter but the last) in flight during a
    stride's compute, the last reduce-scatter exposed."""
    c, profile = ctx.config, ctx.profile
    work = config_work(c)
    per_pair = float(flops_per_pair(c.shape, c.ulysses) * _phase_factor(phase))
    merges = sum(_step_merges(ctx, phase))
    strides = c.gathers
    overheads = strides * c.ring_steps
    share = _node_share(ctx)
    slowest_pairs = float(max(work.ring_rank_pairs))
    mean_pairs = float(sum(work.ring_rank_pairs, Fraction(0))) / c.ring
    alone = slowest_pairs * per_pair / ctx.flops_per_s + overheads * profile.step_overhead_s
    alone += merges
    balanced = share * (
        mean_pairs * per_pair / ctx.flops_per_s + overheads * profile.step_overhead_s + merges
    )
    shared = share > 1 and balanced > alone
    compute = balanced if shared else alone
    slowest_flops = share * mean_pairs if shared else slowest_pairs
    per_stride = compute / strides
    slowest = max(range(c.ring), key=lambda j: work.ring_rank_pairs[j])
    own_pairs = work.step_pairs[0][slowest] if work.step_pairs else Fraction(0)
    own_share = float(own_pairs / work.ring_rank_pairs[slowest]) if own_pairs else 0.0
    own = per_stride * own_share  # the own chunk of stride 0: computed while it is gathered
    gather_bytes = rs_bytes = 0
    for collective in ctx.volume.collectives(phase):
        if collective.name == "ag_kv":
            gather_bytes = collective.bytes_sent // collective.calls
        elif collective.name == "rs_dkv":
            rs_bytes = collective.bytes_sent // collective.calls
    gather_s, gather_term = _gather_call(ctx, phase, gather_bytes)
    terms = [gather_term] * strides
    overlap = profile.overlap
    # the first gather travels while the own chunk of stride 0 is computed on, then waits
    total = max(own, gather_s) + (1 - overlap) * min(own, gather_s)
    comm = gather_s * strides
    hidden = min(own, gather_s)
    rs_s = 0.0
    if rs_bytes:
        rs_s, rs_term = _gather_call(ctx, phase, rs_bytes)
        terms += [rs_term] * strides
        comm += rs_s * strides
    for g in range(strides):
        work_s = per_stride - own if g == 0 else per_stride
        in_flight = (gather_s if g + 1 < strides else 0.0) + (rs_s if g >= 1 else 0.0)
        if in_flight == 0:
            total += work_s
            continue
        hidden += min(work_s, in_flight)
        total += max(work_s, in_flight) + (1 - overlap) * min(work_s, in_flight)
    total += rs_s  # the last stride's dK/dV goes home exposed
    ulysses_s, ulysses_terms = _ulysses_time(ctx, phase)
    total += ulysses_s
    timing = PhaseTime(
        phase=phase,
        total_s=total,
        compute_s=balanced,
        imbalance_s=max(0.0, compute - balanced),
        exposed_comm_s=total - max(compute, balanced),
        comm_s=ulysses_s + comm,
        ulysses_comm_s=ulysses_s,
        ring_comm_s=comm,
        memory_bound_s=merges,
        overlappable_s=hidden,
        slowest_flops=slowest_flops * per_pair,
        steps=float(overheads) * (share if shared else 1.0),
    )
    return timing, ulysses_terms + tuple(terms)


def _traffic(ctx: _Context) -> tuple[TierTraffic, ...]:
    """Bytes per rank per (tier, kind), forward and backward."""
    place = ctx.placement
    per_phase: dict[tuple[LinkTier, CollectiveKind], list[int]] = {}
    for index, phase in enumerate(PASSES):
        for stage in ctx.volume.stages(phase):
            sent = stage.bytes_sent
            split: dict[LinkTier, int]
            kind: CollectiveKind
            if stage.stage == "ulysses":
                inter = int(sent * place.ulysses_inter_fraction)
                split = {"inter_node": inter, "intra_node": sent - inter}
                kind = "all_to_all"
            elif stage.stage == "all_gather":  # priced on the all-to-all link cost
                split = {place.ring_tier: sent}
                kind = "all_to_all"
            else:
                split = {place.ring_tier: sent}
                kind = "send_recv"
            for tier, value in split.items():
                if value:
                    per_phase.setdefault((tier, kind), [0, 0])[index] += value
    return tuple(
        TierTraffic(tier, kind, fwd, bwd) for (tier, kind), (fwd, bwd) in sorted(per_phase.items())
    )


# ------------------------------------------------------------------------------ records


def record_devices_per_node(config: Mapping[str, Any]) -> int:
    """Devices per node of a record: world_size / nodes (one node when absent)."""
    world = int(
        config.get("world_size") or int(config.get("ulysses", 1)) * int(config.get("ring", 1))
    )
    nodes = max(1, int(config.get("nodes") or 1))
    return max(1, world // nodes)


def prediction_for_record(record: Mapping[str, Any], profile: HardwareProfile) -> Prediction | None:
    """Prediction for a results record (its config, phase and node count); None when the record
    is not `ok`, lacks a config, or describes a configuration the model cannot evaluate."""
    if record.get("status") != "ok":
        return None
    config = record.get("config")
    if not isinstance(config, Mapping):
        return None
    try:
        return predict(MeshCandidate.from_record(config), profile, record_devices_per_node(config))
    except (CpbenchError, TypeError, ValueError):
        return None
