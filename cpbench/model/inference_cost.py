"""The serving cost model: TTFT of a prefill with a cached prefix, decode latency, KV capacity.

The model, its conventions and sources: docs/inference.md, "The model". Pure math."""

from __future__ import annotations

from dataclasses import dataclass, field

from scipy.optimize import brentq

from cpbench.config.problem import CpProblem
from cpbench.errors import CpbenchError
from cpbench.model.flops import flops_per_pair
from cpbench.model.hardware.profile import HardwareProfile, LinkTier, LinkTierProfile
from cpbench.model.inference import (
    DEFAULT_NEW_TOKEN_LAYOUT,
    PREFILL_SCHEMES,
    DecodeMerge,
    NewTokenLayout,
    PrefillCase,
    PrefillScheme,
    check_decode_merge,
    decode_bytes,
    kv_cache_bytes_per_rank,
    longest_context,
    prefill_bytes,
    prefill_pairs_per_rank,
    split_sizes,
)
from cpbench.model.topology import group_link


def check_heads(problem: CpProblem) -> None:
    """CpbenchError showing the arithmetic when the query heads do not group over the KV heads."""
    if problem.heads % problem.kv_heads:
        raise CpbenchError(
            f"heads ({problem.heads}) must be a multiple of kv_heads ({problem.kv_heads}): "
            f"{problem.heads} % {problem.kv_heads} = {problem.heads % problem.kv_heads}"
        )


def overlapped(compute_s: float, comm_s: float, overlap: float) -> float:
    """A step whose communication runs during its kernel: the longer of the two plus the part
    of the shorter one that is not hidden (`1 - overlap` of it)."""
    return max(compute_s, comm_s) + (1.0 - overlap) * min(compute_s, comm_s)


@dataclass(frozen=True)
class PrefillPrice:
    """The modelled TTFT of one prefill scheme at one degree, with its parts."""

    scheme: PrefillScheme
    """How the ranks exchange data."""
    world: int
    """W: ranks (the CP degree)."""
    tier: LinkTier
    """The link tier the group crosses."""
    total_s: float
    """Modelled attention time of the prefill (one layer, the whole batch, slowest rank)."""
    compute_s: float
    """Kernel time of the slowest rank (every step's kernel, summed)."""
    exposed_comm_s: float
    """Communication not hidden behind a kernel (includes the unhidden 1 - overlap share)."""
    overhead_s: float
    """Fixed per-kernel / per-step overheads."""
    step_s: float = 0.0
    """Ring schemes: one step's kernel time (0 otherwise)."""
    hop_s: float = 0.0
    """Ring schemes: one hop's send/recv time (latency included; 0 otherwise)."""
    tail_s: float = 0.0
    """pass_q: the all-to-all of partial outputs and LSEs after the ring (0 otherwise)."""
    kernel_efficiency: float = 0.0
    """The efficiency curve's value the kernels ran at (achieved / peak FLOP/s)."""
    bytes_sent: dict[str, int] = field(default_factory=dict)
    """Bytes one rank sends, by collective tag (`prefill_bytes`)."""
    head_sharded_cache_s: float | None = None
    """ulysses with a cache (P > 0): the TTFT were the cache kept head-sharded, as a TP-style
    server keeps it (only the new tokens' Q, K/V and outputs travel); the scheme as priced (and
    as cpbench runs it) re-shards the sequence-sharded cache every turn."""


def _case(problem: CpProblem, cached_len: int, new_tokens: int, scheme: PrefillScheme,
          world: int, layout: NewTokenLayout) -> PrefillCase:  # fmt: skip
    """The prefill of the problem's heads, dtype and batch on the scheme's mesh of `world`."""
    ulysses, ring = (world, 1) if scheme == "ulysses" else (1, world)
    mesh = CpProblem(
        seq_len=cached_len + new_tokens,
        heads=problem.heads,
        kv_heads=problem.kv_heads,
        head_dim=problem.head_dim,
        batch=problem.batch,
        dtype=problem.dtype,
        ulysses=ulysses,
        ring=ring,
    )
    return PrefillCase(mesh, cached_len, new_tokens, scheme, new_token_layout=layout)


def price_prefill(
    scheme: PrefillScheme,
    cached_len: int,
    new_tokens: int,
    problem: CpProblem,
    world: int,
    profile: HardwareProfile,
    kernel: str = "auto",
    new_token_layout: NewTokenLayout = DEFAULT_NEW_TOKEN_LAYOUT,
) -> PrefillPrice:
    """The modelled TTFT of `scheme` on `world` ranks (see docs/inference.md; the new
    tokens sharded by `new_token_layout`, balanced unless told: what serving runs); CpbenchError
    naming the rule when the scheme cannot run there (Ulysses: heads not divisible)."""
    if world < 1:
        raise CpbenchError(f"the CP degree must be >= 1, got {world}")
    check_heads(problem)
    case = _case(problem, cached_len, new_tokens, scheme, world, new_token_layout)
    tier_name, tier = group_link(profile, world)
    overhead = profile.step_overhead_s
    per_pair = flops_per_pair(problem.shape)
    busiest = max(prefill_pairs_per_rank(cached_len, new_tokens, world, case.new_token_layout))
    sent = prefill_bytes(case)
    if world > 1 and scheme in ("pass_kv", "pass_q"):
        return _ring_price(scheme, case, tier_name, tier, profile, problem, kernel, busiest, sent)
    keys = cached_len + new_tokens
    eff = _efficiency(profile, problem, kernel, keys)
    rate = profile.peak_flops(problem.dtype) * eff
    if world == 1:
        compute = busiest * per_pair / rate
        return PrefillPrice(scheme, 1, tier_name, compute + overhead, compute, 0.0, overhead,
                            kernel_efficiency=eff)  # fmt: skip
    if scheme == "all_gather":
        compute = busiest * per_pair / rate
        gather = tier.all_to_all.seconds(sent["allgather_kv"])
        own = compute * case.kv_block / max(1, keys)  # the own chunk's share of the keys
        first = overlapped(own, gather, profile.overlap)
        total = first + (compute - own) + 2 * overhead
        return PrefillPrice(scheme, world, tier_name, total, compute, first - own, 2 * overhead,
                            kernel_efficiency=eff, bytes_sent=sent)  # fmt: skip
    # ulysses: the whole causal prefill on H / W heads, all-to-alls exposed
    pairs = new_tokens * cached_len + new_tokens * (new_tokens + 1) // 2
    compute = pairs * per_pair / world / rate

    def exchange(sent: dict[str, int]) -> float:
        return tier.all_to_all.seconds(sent["a2a_q"] + sent["a2a_kv"], calls=2) + (
            tier.all_to_all.seconds(sent["a2a_out"])
        )

    comm = exchange(sent)
    head_sharded = None
    if cached_len:  # the same prefill with only the new tokens' K/V in the exchange
        fresh = prefill_bytes(_case(problem, 0, new_tokens, scheme, world, new_token_layout))
        head_sharded = compute + exchange(fresh) + overhead
    return PrefillPrice(scheme, world, tier_name, compute + comm + overhead, compute, comm,
                        overhead, kernel_efficiency=eff, bytes_sent=sent,
                        head_sharded_cache_s=head_sharded)  # fmt: skip


def _efficiency(
    profile: HardwareProfile, problem: CpProblem, kernel: str, kernel_keys: float
) -> float:
    return profile.curve(profile.kernel_for(kernel, problem.dtype)).at(kernel_keys)


def _ring_price(
    scheme: PrefillScheme,
    case: PrefillCase,
    tier_name: LinkTier,
    tier: LinkTierProfile,
    profile: HardwareProfile,
    problem: CpProblem,
    kernel: str,
    busiest: int,
    sent: dict[str, int],
) -> PrefillPrice:
    w = case.world
    eff = _efficiency(profile, problem, kernel, case.kv_block)
    step = busiest * flops_per_pair(problem.shape) / w / (profile.peak_flops(problem.dtype) * eff)
    hop_tag = "p2p_kv" if scheme == "pass_kv" else "p2p_q"
    hop = tier.send_recv.seconds(sent[hop_tag] / (w - 1))
    ring = (w - 1) * overlapped(step, hop, profile.overlap) + step
    tail = 0.0
    if scheme == "pass_q":
        tail = tier.all_to_all.seconds(sent["a2a_out"] + sent["a2a_lse"], calls=2)
    overhead = w * profile.step_overhead_s
    compute = w * step
    return PrefillPrice(
        scheme, w, tier_name, ring + tail + overhead, compute, ring - compute + tail, overhead,
        step_s=step, hop_s=hop, tail_s=tail, kernel_efficiency=eff, bytes_sent=sent,
    )  # fmt: skip


def pass_kv_pass_q_crossover(
    cached_len: int,
    problem: CpProblem,
    world: int,
    profile: HardwareProfile,
    kernel: str = "auto",
    new_token_layout: NewTokenLayout = DEFAULT_NEW_TOKEN_LAYOUT,
) -> float | None:
    """The T/P at which pass-KV and pass-Q take the same modelled TTFT (`price_prefill`) on
    `cached_len` cached tokens: pass-Q wins below it, pass-KV above. Searched over T/P in
    [1/4096, 64] with scipy's brentq on the time gap; None when one scheme wins over the whole
    range (`ring_winner_everywhere` says which)."""
    if cached_len < 1:
        raise CpbenchError(f"the crossover in T/P needs cached_len >= 1, got {cached_len}")
    if world < 2:
        raise CpbenchError(f"the crossover needs a ring of >= 2 ranks, got {world}")

    def gap(ratio: float) -> float:
        t = max(1, round(ratio * cached_len))
        kv, q = (
            price_prefill(s, cached_len, t, problem, world, profile, kernel, new_token_layout)
            for s in ("pass_kv", "pass_q")
        )
        return kv.total_s - q.total_s

    lo, hi = 1 / 4096, 64.0
    if gap(lo) * gap(hi) > 0:
        return None
    return float(brentq(gap, lo, hi, xtol=1e-6))


def pass_kv_hidden_above(problem: CpProblem, world: int, profile: HardwareProfile,
                         cached_len: int, kernel: str = "auto") -> float:  # fmt: skip
    """Meta's rule (arXiv:2411.01783 §3.3) on this profile: the new-token count T above which
    a pass-KV hop is shorter than the step it overlaps (its comm hides), from bandwidths
    alone (latency and padding left out): a step computes (T / W) x (P + T) / W pairs at C
    FLOP/s while a hop sends 2 H_kv D e (P + T) / W bytes at the send/recv busbw BW, so the
    hop hides when T >= W C 2 H_kv e / (4 H BW) = W C H_kv e / (2 H BW) (independent of P)."""
    tier = group_link(profile, world)[1]
    keys = cached_len / world
    rate = profile.peak_flops(problem.dtype) * _efficiency(profile, problem, kernel, keys)
    return (
        world
        * rate
        * problem.kv_heads
        * problem.bytes_per_element
        / (2 * problem.heads * tier.send_recv.busbw)
    )


def fastest_prefill(cached_len: int, new_tokens: int, problem: CpProblem, world: int,
                    profile: HardwareProfile, kernel: str = "auto") -> PrefillPrice | None:
    """The prefill scheme of the least modelled TTFT on `world` ranks (`price_prefill`; one
    rank runs no scheme), the first in `PREFILL_SCHEMES` order among equal times; None when
    no scheme can run there (Ulysses' heads rule is the only one that can refuse)."""
    best: PrefillPrice | None = None
    for scheme in PREFILL_SCHEMES if world > 1 else PREFILL_SCHEMES[:1]:
        try:
            price = price_prefill(scheme, cached_len, new_tokens, problem, world, profile, kernel)
        except CpbenchError:  # a scheme this problem cannot run on `world` ranks
            continue
        if best is None or price.total_s < best.total_s:
            best = price
    return best


CP_PAYS_SEARCH_MAX = 1 << 22
"""The longest prompt `cp_pays_above` searches (4M tokens)."""


def cp_pays_above(problem: CpProblem, world: int, profile: HardwareProfile, cached_len: int = 0,
                  kernel: str = "auto") -> int | None:  # fmt: skip
    """The shortest prompt (new tokens on `cached_len` cached) whose fastest prefill scheme on
    `world` ranks has a lower modelled TTFT (`price_prefill`) than one rank: below it CP costs
    more than it saves (the crossover SGLang reports for static prefill CP). None when CP never
    pays up to `CP_PAYS_SEARCH_MAX` tokens. A doubling scan for the first prompt that pays,
    then a bisection (the gain grows with the prompt: compute grows as T^2, CP's costs as T)."""
    if world < 2:
        raise CpbenchError(f"CP needs >= 2 ranks, got {world}")

    def pays(tokens: int) -> bool:
        alone = price_prefill("pass_kv", cached_len, tokens, problem, 1, profile, kernel)
        best = fastest_prefill(cached_len, tokens, problem, world, profile, kernel)
        return best is not None and best.total_s < alone.total_s

    low, high = world - 1, world
    while not pays(high):
        if high >= CP_PAYS_SEARCH_MAX:
            return None
        low, high = high, min(2 * high, CP_PAYS_SEARCH_MAX)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if pays(middle) else (middle, high)
    return high


def ring_message_ratio(problem: CpProblem) -> float:
    """Meta's other test: pass-KV's hops carry fewer bytes than pass-Q's when
    T / (T + P) >= 2 H_kv / H (K and V of every key against the queries of the new tokens)."""
    return 2 * problem.kv_heads / problem.heads


@dataclass(frozen=True)
class DecodePrice:
    """The modelled per-token latency of a decode step over a cache sharded on W ranks."""

    world: int
    """W: ranks holding a shard of every sequence's cache."""
    tier: LinkTier
    """The link tier the group crosses."""
    total_s: float
    """Modelled attention time of one decode step (one layer, the whole decode batch)."""
    memory_s: float
    """Reading the rank's K/V shard from HBM at the profile's bandwidth."""
    compute_s: float
    """The kernel's FLOPs at the kernel rate (the step takes the longer of this and memory_s)."""
    comm_s: float
    """The all-gather of partial outputs and LSEs (exposed: the merge needs them)."""
    overhead_s: float
    """Fixed kernel overhead."""
    shard_bytes: int
    """K/V bytes one rank reads per step (one layer, the whole decode batch)."""
    bytes_sent: dict[str, int] = field(default_factory=dict)
    """Bytes one rank sends, by collective tag (`decode_bytes`)."""
    merge: DecodeMerge = "all_gather"
    """How the partial outputs were merged (all_to_all: to a head split)."""


def price_decode(context_len: int, problem: CpProblem, world: int,
                 profile: HardwareProfile, kernel: str = "auto",
                 merge: DecodeMerge = "all_gather") -> DecodePrice:  # fmt: skip
    """One decode step (one new token per sequence) over `context_len` cached tokens sharded
    by sequence on `world` ranks, merged by `merge`; see docs/inference.md."""
    if context_len < 1 or world < 1:
        raise CpbenchError(
            f"decode needs context_len >= 1 and world >= 1, got {context_len} and {world}"
        )
    the_merge = check_decode_merge(merge, problem.heads, world)
    tier_name, tier = group_link(profile, world)
    shard = kv_cache_bytes_per_rank(
        context_len, world, problem.kv_heads, problem.head_dim, problem.dtype, problem.batch
    )
    memory = shard / profile.memory_bandwidth
    keys = split_sizes(context_len, world)[0]
    rate = profile.peak_flops(problem.dtype) * _efficiency(profile, problem, kernel, keys)
    compute = flops_per_pair(problem.shape) * keys / rate
    sent = decode_bytes(
        1, world, problem.heads, problem.head_dim, problem.dtype, problem.batch, the_merge
    )
    comm = 0.0
    if sent:  # two calls (outputs, then LSEs) of the bytes a rank sends
        comm = tier.all_to_all.seconds(sum(sent.values()), calls=2)
    overhead = profile.step_overhead_s
    total = max(memory, compute) + comm + overhead
    return DecodePrice(world, tier_name, total, memory, compute, comm, overhead, shard, sent,
                       the_merge)  # fmt: skip


@dataclass(frozen=True)
class KvCapacity:
    """KV-cache memory per rank at W ranks and the longest context that fits."""

    world: int
    """W: ranks the cache is sharded over (by sequence)."""
    bytes_per_rank: int
    """K/V bytes the fullest rank holds for the request (every layer, the whole batch)."""
    budget_bytes: float
    """Memory per rank the cache may use."""
    longest_context: int
    """Most tokens per sequence whose cache (every layer, `batch` sequences) fits the budget
    on W ranks."""

    @property
    def fits(self) -> bool:
        return self.bytes_per_rank <= self.budget_bytes


def kv_capacity(context_len: int, problem: CpProblem, world: int, layers: int,
                budget_bytes: float) -> KvCapacity:  # fmt: skip
    """KV bytes per rank of `context_len` tokens over `layers` layers and `batch` sequences
    (ceil(N / W) tokens x 2 x H_kv x D x element bytes x layers x B) and the longest context
    per sequence that fits `budget_bytes` per rank (whole tokens per rank x W)."""
    if layers < 1:
        raise CpbenchError(f"layers must be >= 1, got {layers}")
    held = layers * kv_cache_bytes_per_rank(
        context_len, world, problem.kv_heads, problem.head_dim, problem.dtype, problem.batch
    )
    longest = longest_context(
        budget_bytes, world, problem.kv_heads, problem.head_dim, problem.dtype, layers,
        problem.batch,
    )  # fmt: skip
    return KvCapacity(world, held, budget_bytes, longest)
