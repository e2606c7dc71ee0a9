"""`predict`: the predicted step time, traffic and memory of one CP attention layer on a
hardware profile (`Prediction`): docs/design.md section 2, "The time of one phase". Pure Python."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.config.vocabulary import PHASE_PASSES
from cpbench.errors import CpbenchError
from cpbench.model.cost.breakdown import CommTerm, PhaseTime, TierTraffic
from cpbench.model.cost.kernel import HEAD_DIM_SOURCE, kernel_factor
from cpbench.model.cost.schemes import Context, phase_time, tier_traffic
from cpbench.model.cost.work import config_work
from cpbench.model.formulas import comm_volume
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.memory import max_seq_len_for_budget, memory_estimate
from cpbench.model.topology import PLACEMENT_ORDERS, Placement, TopologyPlacement, placement
from cpbench.model.topology import place as place_on
from cpbench.units import GIB


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
    backward: PhaseTime
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
    `placement`'s two tiers); `cpbench.model.topology.describe` tells it."""
    head_dim_factors: tuple[float, float] = (1.0, 1.0)
    """The kernel's throughput at this head dim relative to the curve's 128, forward and
    backward (`cpbench.model.cost.kernel`; 1.0 where no table applies)."""

    @property
    def curve_note(self) -> str:
        """Which efficiency curve the prediction used, in one sentence."""
        requested = self.candidate.kernel
        runs = self.kernel if requested == self.kernel else f"{requested} runs {self.kernel}"
        if self.curve_kernel == self.kernel:
            text = f"kernel {runs}: {self.kernel} efficiency curve of {self.profile_name}"
        else:
            text = (
                f"kernel {runs}: {self.profile_name} has no {self.kernel} efficiency curve, "
                f"its default {self.curve_kernel} curve was used"
            )
        if self.head_dim_factors != (1.0, 1.0):
            forward, backward = self.head_dim_factors
            text += (
                f"; at head dim {self.candidate.head_dim} x{forward:.2f} forward, "
                f"x{backward:.2f} backward ({HEAD_DIM_SOURCE})"
            )
        return text

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
            sent = {"forward": t.forward_bytes, "backward": t.backward_bytes}
            out[t.tier] += sent.get(phase, t.total_bytes)
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


def predict(
    config_like: CpProblem | Mapping[str, Any],
    profile: HardwareProfile,
    gpus_per_node: int | None = None,
    rank_stride: int = 1,
    memory: bool = True,
) -> Prediction:
    """Predict one configuration; CpbenchError when the mesh is infeasible.

    `config_like` is a MeshCandidate (a BenchConfig is one), a CpProblem (fwd+bwd on the
    profile's kernel) or a results record's `config` dict; `gpus_per_node` defaults to the
    profile's devices per node. `memory=False` leaves the memory fields at 0 (a fit that
    needs only times: the memory estimate is most of a prediction's cost).
    """
    candidate = _as_candidate(config_like)
    config = candidate.require_feasible()
    per_node = gpus_per_node if gpus_per_node is not None else profile.devices_per_node
    place = placement(config.ulysses, config.ring, per_node, rank_stride)
    work = config_work(config)
    family = profile.kernel_for(candidate.kernel, config.dtype)
    curve_family = family if profile.has_curve(family) else profile.default_kernel
    curve = profile.curve(curve_family)
    volume = comm_volume(config)
    flops_per_s = profile.peak_flops(config.dtype) * curve.at(config.ring_shard)
    contexts = [
        Context(candidate, profile, place, volume, flops_per_s, topo, family)
        for topo in _topology_placements(config, profile, per_node, rank_stride)
    ]
    times = [(phase_time(ctx, "forward"), phase_time(ctx, "backward")) for ctx in contexts]
    fwd_only = candidate.phase == "fwd"
    totals = [f.total_s + (0.0 if fwd_only else b.total_s) for (f, _), (b, _) in times]
    best = 0
    for index, total in enumerate(totals):
        if total < 0.99 * totals[best]:  # ulysses_low unless another is faster
            best = index
    ctx, ((forward, forward_terms), (backward, backward_terms)) = contexts[best], times[best]
    memory_phase = PHASE_PASSES[candidate.phase]
    return Prediction(
        candidate=candidate,
        profile_name=profile.name,
        placement=place,
        kernel_seq_len=config.ring_shard,
        kernel=family,
        curve_kernel=curve_family,
        curve_source=curve.source,
        attention_tflops=ctx.flops_per_s / 1e12,
        forward=forward,
        backward=backward,
        traffic=tier_traffic(ctx),
        comm_terms=forward_terms + backward_terms,
        work_imbalance=work.imbalance,
        memory_bytes=memory_estimate(config).peak(memory_phase) if memory else 0,
        memory_capacity_bytes=profile.memory_bytes,
        max_seq_len=(
            max_seq_len_for_budget(profile.memory_bytes, config, memory_phase) if memory else 0
        ),
        ring_steps=config.ring_steps,
        padding=config.padding,
        padding_fraction=work.padding_fraction,
        work_overhead=work.overhead,
        slowest_ring_rank=work.slowest_ring_rank,
        topology=ctx.topology,
        head_dim_factors=(
            kernel_factor(family, profile.device_kind, config.head_dim, config.causal, "forward"),
            kernel_factor(family, profile.device_kind, config.head_dim, config.causal, "backward"),
        ),
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
