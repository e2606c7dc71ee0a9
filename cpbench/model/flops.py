"""Attention FLOPs and the causal work of each rank under a layout. Pure Python.

The counting convention (attended pairs) and the masks: docs/design.md section 2."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from cpbench.config.constraints import AttentionShape, seq_divisor
from cpbench.config.geometry import pack, ring_counts, row_work
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import CpProblem, check_choice, check_positive_int
from cpbench.config.vocabulary import GLOBAL_LAYOUTS, LAYOUTS, PASS_TOTALS
from cpbench.errors import CpbenchError

FLOPS_CONVENTION = (
    "attention FLOPs count the two matmuls (Q K^T and P V) only: forward = 4*B*h*L^2*d_h for a "
    "full (non-causal) mask and half of it, 2*B*h*L^2*d_h, for a causal mask; backward = 2.5 x "
    "forward (forward+backward = 3.5 x forward); per rank 4*B*(h/U)*d_h FLOPs per attended "
    "(query, key) pair, a pair on the causal diagonal counting 1/2; under a document or "
    "sliding-window mask the pairs are those the mask leaves visible (exact count minus half "
    "the diagonal, the same continuum convention: one causal document of n tokens counts "
    "n^2/2), and a rank computes the pairs of the blocks it is given (doc_zigzag's padding "
    "tokens included, counted as padding overhead, never as the mask's FLOPs)"
)
BACKWARD_FACTOR = Fraction(5, 2)
"""Backward FLOPs / forward FLOPs."""

_PHASE_FACTOR: dict[str, Fraction] = {
    "forward": Fraction(1),
    "backward": BACKWARD_FACTOR,
    "forward_backward": 1 + BACKWARD_FACTOR,
}


def phase_factor(phase: str) -> Fraction:
    """FLOPs of a phase in units of forward FLOPs (1, 2.5 or 3.5)."""
    check_choice("phase", phase, PASS_TOTALS)
    return _PHASE_FACTOR[phase]


def attention_flops(shape: AttentionShape, causal: bool = True, phase: str = "forward") -> float:
    """Global attention FLOPs of one layer: 4*B*h*L^2*d_h forward (non-causal), see convention."""
    pairs = total_pairs(shape.seq_len, causal)
    return float(flops_per_pair(shape, 1) * pairs * phase_factor(phase))


@functools.lru_cache(maxsize=64)  # O(documents): once per mask, not once per configuration
def mask_pairs(mask: MaskSpec, seq_len: int) -> Fraction:
    """Attended pairs of a mask over `seq_len` tokens, continuum convention: the exact visible
    pairs minus half the diagonal (L^2/2 for one causal sequence, L^2 full)."""
    if mask.plain and not mask.has_documents:
        mask.check_length(seq_len)
        return total_pairs(seq_len, mask.causal)
    explicit = mask.for_length(seq_len)
    exact = row_work(explicit, 0, seq_len)
    return Fraction(exact) - (Fraction(seq_len, 2) if mask.causal else 0)


def flops_per_pair(shape: AttentionShape, ulysses: int = 1) -> int:
    """Forward FLOPs of one (query, key) pair on one rank: 4*B*(h/U)*d_h."""
    if ulysses <= 0 or shape.heads % ulysses:
        raise CpbenchError(
            f"ulysses ({ulysses}) must be a positive divisor of heads ({shape.heads})"
        )
    return 4 * shape.batch * (shape.heads // ulysses) * shape.head_dim


def total_pairs(seq_len: int, causal: bool) -> Fraction:
    """Attended pairs of the whole sequence: L^2/2 causal, L^2 full."""
    return Fraction(seq_len * seq_len, 2) if causal else Fraction(seq_len * seq_len)


# ------------------------------------------------------------------------- pair counting


def _check_ring_layout(seq_len: int, ring: int, layout: str) -> None:
    check_positive_int("seq_len", seq_len)
    check_positive_int("ring", ring)
    check_choice("layout", layout, LAYOUTS)
    divisor = seq_divisor(1, ring, layout)
    if seq_len % divisor:
        raise CpbenchError(
            f"seq_len ({seq_len}) must be divisible by {divisor} for the {layout} layout "
            f"over a ring of {ring}"
        )


@functools.lru_cache(maxsize=32)
def ring_step_pairs(
    seq_len: int, ring: int, layout: str, causal: bool = True
) -> tuple[tuple[Fraction, ...], ...]:
    """`[s][j]`: pairs ring rank j computes at ring step s (K/V of ring rank (j - s) mod R);
    R steps (a step the mask does not need is all zeros). Cached: R^2 exact pairs, the same
    for every head count and Ulysses degree (`cpbench plan` prices many meshes of one ring).
    Global layouts in closed form (n = L/R): full n^2 everywhere; causal step 0 n^2/2; a
    later step s: contiguous n^2 for j >= s, else 0; zigzag n^2/2 (half of each chunk pair);
    striped n(n+1)/2 for j >= s (the key rank is earlier), else n(n-1)/2."""
    _check_ring_layout(seq_len, ring, layout)
    if layout not in GLOBAL_LAYOUTS:
        steps = masked_step_pairs(MaskSpec(causal=causal), seq_len, 1, ring, layout)
        zeros = tuple(Fraction(0) for _ in range(ring))
        return steps + (zeros,) * (ring - len(steps))
    n = seq_len // ring
    if not causal:
        return ((Fraction(n * n),) * ring,) * ring
    own = (Fraction(n * n, 2),) * ring
    if layout == "zigzag":
        return (own,) * ring
    if layout == "contiguous":
        earlier, later = Fraction(n * n), Fraction(0)
    else:
        earlier, later = Fraction(n * (n + 1), 2), Fraction(n * (n - 1), 2)
    return (own,) + tuple((later,) * s + (earlier,) * (ring - s) for s in range(1, ring))


def ring_rank_pairs(
    seq_len: int, ring: int, layout: str, causal: bool = True
) -> tuple[Fraction, ...]:
    """Pairs each ring rank computes over all ring steps (all heads of the ring group).

    Closed forms with n = L/R: contiguous n^2*(j + 1/2); zigzag 2R*(L/(2R))^2 for every rank;
    striped R*n*(n-1)/2 + j*n + n/2. doc_zigzag and balanced: the mask geometry.
    """
    _check_ring_layout(seq_len, ring, layout)
    if layout not in GLOBAL_LAYOUTS:
        steps = masked_step_pairs(MaskSpec(causal=causal), seq_len, 1, ring, layout)
        return _column_sums(steps, ring)
    return tuple(_plain_rank_pairs(seq_len, ring, layout, causal, j) for j in range(ring))


def _column_sums(steps: tuple[tuple[Fraction, ...], ...], ring: int) -> tuple[Fraction, ...]:
    return tuple(exact_sum([step[j] for step in steps]) for j in range(ring))


def exact_sum(values: Sequence[Fraction]) -> Fraction:
    """The sum of `values`, exact, in integers over their common denominator: Fraction's own
    addition reduces at every step, 3x slower on the R^2 = 1M pairs of a ring of 1,024."""
    common = math.lcm(*{v.denominator for v in values})
    if common == 1:
        return Fraction(sum(v.numerator for v in values))
    return Fraction(sum(v.numerator * (common // v.denominator) for v in values), common)


def exact_max(values: Sequence[Fraction]) -> Fraction:
    """The largest of `values` (the first of equals), compared as integers over their common
    denominator (Fraction's comparisons cross-multiply each pair)."""
    common = math.lcm(*{v.denominator for v in values})
    scaled = [v.numerator * (common // v.denominator) for v in values]
    return values[scaled.index(max(scaled))]


# ------------------------------------------------------------------------- masked geometry


# a ranking prices one packing once per exchange in a row; few entries: one is R^2 Fractions
@functools.lru_cache(maxsize=4)
def masked_step_pairs(
    mask: MaskSpec, seq_len: int, ulysses: int, ring: int, layout: str
) -> tuple[tuple[Fraction, ...], ...]:
    """`[s][j]` for the `steps` ring steps the mask needs: ring rank j's pairs at step s from
    `ring_counts(pack(...))` (the schedule's, without its pieces), the diagonal's half taken
    off at step 0 (causal); CpbenchError when the layout cannot cut the sequence."""
    check_choice("layout", layout, LAYOUTS)
    schedule = ring_counts(pack(mask, seq_len, ulysses, ring, layout))
    half = [n if schedule.causal else 0 for n in schedule.own_tokens]  # twice the diagonal's half
    first = tuple(Fraction(2 * schedule.pairs[j][0] - half[j], 2) for j in range(ring))
    later = (tuple(Fraction(row[t]) for row in schedule.pairs) for t in range(1, schedule.steps))
    return (first, *later)


def imbalance(values: tuple[float, ...] | list[float]) -> float:
    """Slowest / mean (1.0 = perfectly balanced)."""
    if not values:
        raise CpbenchError("imbalance needs at least one value")
    mean = sum(values) / len(values)
    return float(max(values) / mean) if mean else 1.0


# ---------------------------------------------------------------------------- layout work


@dataclass(frozen=True)
class LayoutWork:
    """Attention work of every rank and every ring step under a layout and a mask.

    Causal or full attention on a global layout (`masked_steps` None) keeps no R x R matrix:
    its totals, busiest rank and per-step busiest / mean pairs are closed forms, O(1) or O(R),
    and `step_pairs` / `ring_rank_pairs` are built only when asked for."""

    seq_len: int
    """L: tokens of the sequence (padding excluded)."""
    ulysses: int
    """U: ranks sharing a ring rank's work by heads."""
    ring: int
    """R: ring ranks the layout spreads the tokens over."""
    layout: str
    """contiguous, zigzag, striped, doc_zigzag or balanced."""
    causal: bool
    """Causal mask (True) or full attention."""
    masked_steps: tuple[tuple[Fraction, ...], ...] | None = None
    """The mask geometry's `[s][j]` pairs (`masked_step_pairs`); None = the closed forms."""
    mask: MaskSpec = MaskSpec()
    """The mask (documents explicit when it has more than one)."""
    run_len: int = 0
    """L_run: tokens the ranks hold, padding included (0 = seq_len)."""
    mask_total: Fraction | None = None
    """Pairs of the mask over the L real tokens (None = the sum of the ranks' pairs)."""

    @property
    def plain(self) -> bool:
        """Causal or full attention on a global layout: the closed forms apply."""
        return self.masked_steps is None

    @functools.cached_property
    def step_pairs(self) -> tuple[tuple[Fraction, ...], ...]:
        """`[s][j]`: pairs of ring rank j at ring step s, all heads of the ring group, for the
        `steps` ring steps the ring runs."""
        if self.masked_steps is not None:
            return self.masked_steps
        return ring_step_pairs(self.seq_len, self.ring, self.layout, self.causal)

    @functools.cached_property
    def ring_rank_pairs(self) -> tuple[Fraction, ...]:
        """Pairs of each ring rank over all steps, all heads of the ring group (padding
        included)."""
        if self.masked_steps is not None:
            return _column_sums(self.masked_steps, self.ring)
        return ring_rank_pairs(self.seq_len, self.ring, self.layout, self.causal)

    @property
    def world(self) -> int:
        """P = U * R."""
        return self.ulysses * self.ring

    @property
    def run_length(self) -> int:
        """L_run = L + padding."""
        return self.run_len or self.seq_len

    @property
    def padding(self) -> int:
        """Padding tokens the layout adds (doc_zigzag only)."""
        return self.run_length - self.seq_len

    @property
    def steps(self) -> int:
        """Ring steps the mask needs (k <= R): K/V makes k - 1 hops."""
        return self.ring if self.masked_steps is None else len(self.masked_steps)

    @property
    def rank_pairs(self) -> tuple[Fraction, ...]:
        """Pairs per global rank p = j*U + u: its ring rank's pairs / U (head share)."""
        return tuple(
            self.ring_rank_pairs[p // self.ulysses] / self.ulysses for p in range(self.world)
        )

    @property
    def chunk_size(self) -> Fraction:
        """L_run / (2P): the chunk of the `2P`-chunk unit."""
        return Fraction(self.run_length, 2 * self.world)

    @property
    def rank_chunk_units(self) -> tuple[Fraction, ...]:
        """Pairs per global rank in units of (L/(2P))^2; mean 2P causal, 4P full."""
        unit = self.chunk_size**2
        return tuple(pairs / unit for pairs in self.rank_pairs)

    @functools.cached_property  # the cost model asks it of the same work thousands of times
    def total(self) -> Fraction:
        """Pairs of all ranks: L^2/2 causal, L^2 full (plus the padding's pairs)."""
        if self.masked_steps is None:
            return total_pairs(self.seq_len, self.causal)
        return sum(self.ring_rank_pairs, Fraction(0))

    @property
    def useful_total(self) -> Fraction:
        """Pairs of the mask over the real tokens (padding excluded)."""
        return self.total if self.mask_total is None else self.mask_total

    @property
    def padding_pairs(self) -> Fraction:
        """Pairs the ranks compute for padding tokens."""
        return self.total - self.useful_total

    @property
    def padding_fraction(self) -> float:
        """Padding pairs / the mask's pairs (0 without padding)."""
        useful = self.useful_total
        return float(self.padding_pairs / useful) if useful else 0.0

    @functools.cached_property
    def _busiest(self) -> tuple[int, Fraction]:
        """(the first ring rank with the most pairs, its pairs); closed form on a global
        layout: every rank alike under zigzag or full attention, the last rank the busiest
        under contiguous and striped."""
        if self.masked_steps is None:
            last = self.ring - 1 if self.causal and self.layout != "zigzag" else 0
            return last, _plain_rank_pairs(self.seq_len, self.ring, self.layout, self.causal, last)
        pairs = self.ring_rank_pairs
        most = max(pairs)
        return pairs.index(most), most

    @property
    def max_ring_rank_pairs(self) -> Fraction:
        """Pairs of the busiest ring rank over all steps."""
        return self._busiest[1]

    @property
    def imbalance(self) -> float:
        """Slowest rank / mean rank (of the pairs computed)."""
        if self.masked_steps is None:
            # `imbalance` of the ranks' float pairs: their float sum is the exact total, every
            # partial sum a half-integer below 2^53 (for L < 9.4e7)
            mean = float(self.total) / self.ring
            return float(float(self.max_ring_rank_pairs) / mean) if mean else 1.0
        return imbalance([float(p) for p in self.ring_rank_pairs])

    @property
    def overhead(self) -> float:
        """Slowest rank / its ideal share of the mask's pairs (imbalance x (1 + padding))."""
        ideal = self.useful_total / self.ring
        return float(self.max_ring_rank_pairs / ideal) if ideal else 1.0

    @property
    def slowest_ring_rank(self) -> int:
        """The ring rank with the most pairs (the first of equals)."""
        return self._busiest[0]

    def own_pairs(self, ring_rank: int) -> Fraction:
        """Pairs of a ring rank at step 0, on its own K/V (0 when the ring runs no step)."""
        if self.masked_steps is None:
            n = self.seq_len // self.ring
            return Fraction(n * n, 2) if self.causal else Fraction(n * n)
        return self.masked_steps[0][ring_rank] if self.masked_steps else Fraction(0)

    @functools.cached_property
    def step_stats(self) -> tuple[tuple[Fraction, Fraction], ...]:
        """(busiest ring rank, mean over ring ranks) pairs at each ring step; O(R) closed
        forms on a global layout (`plain_step_stats`)."""
        if self.masked_steps is None:
            return plain_step_stats(self.seq_len, self.ring, self.layout, self.causal)
        return tuple((exact_max(step), exact_sum(step) / self.ring) for step in self.masked_steps)

    @property
    def step_max_pairs(self) -> tuple[Fraction, ...]:
        """Pairs of the busiest ring rank at each ring step (what sets a step's time)."""
        return tuple(busiest for busiest, _ in self.step_stats)

    @property
    def busiest_step_sum(self) -> Fraction:
        """Sum over ring steps of the busiest rank's pairs: what a synchronous ring waits for."""
        return sum(self.step_max_pairs, Fraction(0))


def _plain_rank_pairs(seq_len: int, ring: int, layout: str, causal: bool, j: int) -> Fraction:
    """`ring_rank_pairs(...)[j]` of a global layout, alone."""
    n = seq_len // ring
    if not causal:
        return Fraction(seq_len * n)
    if layout == "contiguous":
        return Fraction(n * n * (2 * j + 1), 2)
    if layout == "zigzag":
        chunk = seq_len // (2 * ring)
        return Fraction(2 * ring * chunk * chunk)
    return Fraction(ring * n * (n - 1) + n * (2 * j + 1), 2)


@functools.lru_cache(maxsize=256)
def _plain_step_ratios(
    seq_len: int, ring: int, layout: str, causal: bool
) -> tuple[tuple[tuple[int, int], tuple[int, int]], ...]:
    """(busiest, mean) pairs of each step of `ring_step_pairs` in closed form, each an integer
    (numerator, denominator), n = L/R: full n^2; causal step 0 n^2/2; a later step s:
    contiguous (n^2, (R-s)n^2/R), zigzag (n^2/2, n^2/2), striped (n(n+1)/2,
    ((R-s) n(n+1)/2 + s n(n-1)/2) / R)."""
    _check_ring_layout(seq_len, ring, layout)
    if layout not in GLOBAL_LAYOUTS:
        raise CpbenchError(f"layout {layout!r} has no closed form: its work is the mask's")
    n = seq_len // ring
    if not causal:
        return (((n * n, 1), (n * n, 1)),) * ring
    half = (n * n, 2)
    if layout == "zigzag":
        return ((half, half),) * ring
    if layout == "contiguous":
        later = (((n * n, 1), (n * n * (ring - s), ring)) for s in range(1, ring))
    else:
        after, before = n * (n + 1), n * (n - 1)
        later = (((after, 2), (after * (ring - s) + before * s, 2 * ring)) for s in range(1, ring))
    return ((half, half), *later)


@functools.lru_cache(maxsize=256)
def plain_step_stats(
    seq_len: int, ring: int, layout: str, causal: bool
) -> tuple[tuple[Fraction, Fraction], ...]:
    """(busiest, mean) pairs of each step of `ring_step_pairs`, exact (`_plain_step_ratios`)."""
    ratios = _plain_step_ratios(seq_len, ring, layout, causal)
    return tuple((Fraction(*busiest), Fraction(*mean)) for busiest, mean in ratios)


def plain_step_scaled(
    seq_len: int, ring: int, layout: str, causal: bool, scale: Fraction
) -> tuple[tuple[float, float], ...]:
    """`plain_step_stats` times `scale` (FLOPs per pair), as floats: each the one correctly
    rounded integer division of the exact product (what float(pairs * scale) gives), without
    building a Fraction per step."""
    num, den = scale.numerator, scale.denominator
    return tuple(
        (busiest * num / (busiest_den * den), mean * num / (mean_den * den))
        for (busiest, busiest_den), (mean, mean_den) in _plain_step_ratios(
            seq_len, ring, layout, causal
        )
    )


def layout_work(problem: CpProblem) -> LayoutWork:
    """Work of every rank and ring step of a problem's mesh, layout and mask (its heads do not
    matter); seq_len must be a multiple of `seq_divisor`."""
    seq_len, ulysses, ring, layout = problem.seq_len, problem.ulysses, problem.ring, problem.layout
    _check_ring_layout(seq_len, ring, layout)
    divisor = seq_divisor(ulysses, ring, layout)
    if seq_len % divisor:
        raise CpbenchError(
            f"seq_len ({seq_len}) must be divisible by {divisor} for the {layout} layout on a "
            f"{ulysses} x {ring} mesh"
        )
    mask = problem.mask
    if mask.plain and layout in GLOBAL_LAYOUTS:  # one causal or full sequence: closed forms
        return LayoutWork(seq_len, ulysses, ring, layout, mask.causal, None, mask)
    steps = masked_step_pairs(mask, seq_len, ulysses, ring, layout)
    return LayoutWork(
        seq_len,
        ulysses,
        ring,
        layout,
        mask.causal,
        steps,
        mask.for_length(seq_len) if mask.has_documents else mask,
        pack(mask, seq_len, ulysses, ring, layout).seq_len,
        mask_pairs(mask, seq_len),
    )


# ----------------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class FlopsBreakdown:
    """Global and per-rank attention FLOPs of one layer under a layout."""

    shape: AttentionShape
    """The global problem."""
    work: LayoutWork
    """Pairs per rank and step it is computed from."""
    pair_flops: int
    """Forward FLOPs per pair on one rank: 4*B*(h/U)*d_h."""

    def global_flops(self, phase: str = "forward") -> float:
        """All ranks together, the mask's pairs only (padding excluded); equals
        `attention_flops` for causal or full attention."""
        per_pair = flops_per_pair(self.shape, 1) * phase_factor(phase)
        return float(self.work.useful_total * per_pair)

    def run_flops(self, phase: str = "forward") -> float:
        """All ranks together as run (padding included): the sum of `rank_flops`."""
        return float(self.work.total * flops_per_pair(self.shape, 1) * phase_factor(phase))

    def rank_flops(self, phase: str = "forward") -> tuple[float, ...]:
        """FLOPs of each global rank p = j*U + u."""
        factor = self.pair_flops * phase_factor(phase)
        u = self.work.ulysses
        return tuple(
            float(self.work.ring_rank_pairs[p // u] * factor) for p in range(self.work.world)
        )

    def slowest_rank_flops(self, phase: str = "forward") -> float:
        """FLOPs of the busiest rank, which sets the step time."""
        return max(self.rank_flops(phase))


def flops_breakdown(problem: CpProblem) -> FlopsBreakdown:
    """FLOPs per rank and step of a problem (CpbenchError with the rule when it cannot run)."""
    shape = problem.require_feasible().shape
    return FlopsBreakdown(shape, layout_work(problem), flops_per_pair(shape, problem.ulysses))
