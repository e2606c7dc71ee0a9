"""Context-parallel prefill and decode in pure math: token shards, bytes per rank, the KV cache.

The sharding (zigzag new tokens, a contiguous cache) and each scheme's hops: docs/inference.md."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from cpbench.config.inference import (
    InferenceStep,
    decode_rule,
    prefill_rule,
    ulysses_kv_heads,
)
from cpbench.config.problem import CpProblem, check_choice
from cpbench.config.vocabulary import (  # the literals live in the one vocabulary
    CACHE_LAYOUTS,
    DECODE_MERGES,
    NEW_TOKEN_LAYOUTS,
    PREFILL_SCHEMES,
    CacheLayout,
    DecodeMerge,
    NewTokenLayout,
    PrefillScheme,
    dtype_bytes,
)
from cpbench.errors import CpbenchError
from cpbench.model.formulas import FP32_BYTES

LSE_BYTES = FP32_BYTES
"""The LSE travels in fp32 (natural log), whatever the inputs' dtype."""


def check_scheme(scheme: str) -> PrefillScheme:
    """`scheme` as a `PrefillScheme`; CpbenchError naming it when it is none."""
    return check_choice("prefill scheme", scheme, PREFILL_SCHEMES)


def split_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Sizes of `n` tokens split into `parts` contiguous shards: the first `n mod parts`
    shards get `n // parts + 1`, the rest `n // parts` (torch.tensor_split's rule)."""
    if parts < 1 or n < 0:
        raise CpbenchError(f"cannot split {n} tokens over {parts} ranks (need n >= 0, ranks >= 1)")
    base, extra = divmod(n, parts)
    return tuple(base + (1 if r < extra else 0) for r in range(parts))


def split_starts(n: int, parts: int) -> tuple[int, ...]:
    """Start offset of each shard of `split_sizes(n, parts)` (and n at the end)."""
    return tuple(accumulate(split_sizes(n, parts), initial=0))


DEFAULT_NEW_TOKEN_LAYOUT: NewTokenLayout = "zigzag"
"""The layout of a prefill that names none: the one the serving cost model prices."""

Segment = tuple[int, int]
"""(start, length) of a run of new tokens, as offsets into the T new tokens (position P +
start is its first)."""


def check_new_token_layout(layout: str) -> NewTokenLayout:
    """`layout` as a `NewTokenLayout`; CpbenchError naming it when it is none."""
    return check_choice("new-token layout", layout, NEW_TOKEN_LAYOUTS)


def new_token_segments(
    new_tokens: int, world: int, layout: NewTokenLayout
) -> tuple[tuple[Segment, ...], ...]:
    """Per rank, the runs of new tokens it holds, in increasing position (empty runs left
    out): contiguous, the r-th of `split_sizes(T, W)`; zigzag, chunks r and 2W - 1 - r of
    `split_sizes(T, 2W)` (T = 5, W = 2: chunks 2, 1, 1, 1; rank 0 holds offsets 0-1 and 4,
    rank 1 offsets 2 and 3). A rank holds its runs' tokens in this order."""
    the_layout = check_new_token_layout(layout)
    parts = world if the_layout == "contiguous" else 2 * world
    sizes, starts = split_sizes(new_tokens, parts), split_starts(new_tokens, parts)
    chunks = [(r,) if the_layout == "contiguous" else (r, 2 * world - 1 - r) for r in range(world)]
    return tuple(tuple((starts[c], sizes[c]) for c in mine if sizes[c]) for mine in chunks)


def new_token_counts(new_tokens: int, world: int, layout: NewTokenLayout) -> tuple[int, ...]:
    """New tokens each rank holds (`new_token_segments` summed)."""
    return tuple(sum(n for _, n in runs) for runs in new_token_segments(new_tokens, world, layout))


def new_token_offsets(new_tokens: int, world: int, layout: NewTokenLayout) -> tuple[int, ...]:
    """The new-token offsets rank by rank, each rank's in its held order: the permutation that
    takes the T new tokens to the concatenation of the ranks' shards."""
    return tuple(
        start + i
        for runs in new_token_segments(new_tokens, world, layout)
        for start, n in runs
        for i in range(n)
    )


@dataclass(frozen=True)
class PrefillCase:
    """One prefill of `new_tokens` on `cached_len` cached tokens with a scheme, on the
    problem's heads, dtype and mesh (its `seq_len` is P + T, its mesh U x R: U = W for
    ulysses, R = W for the ring schemes)."""

    problem: CpProblem
    """Heads, KV heads, head dim, batch, dtype, mesh (seq_len = cached_len + new_tokens)."""
    cached_len: int
    """P: cached tokens (key positions 0..P-1)."""
    new_tokens: int
    """T: new tokens (query positions P..P+T-1), at least 1."""
    scheme: PrefillScheme
    """How the ranks exchange data (`PREFILL_SCHEMES`)."""
    seed: int = 0
    """Seed of the global inputs (verify)."""
    new_token_layout: NewTokenLayout = DEFAULT_NEW_TOKEN_LAYOUT
    """How the new tokens are sharded over the ranks (`NEW_TOKEN_LAYOUTS`; the cache is
    always contiguous)."""

    def __post_init__(self) -> None:
        check_scheme(self.scheme)
        check_new_token_layout(self.new_token_layout)
        rule = prefill_rule(self.problem, self.cached_len, self.new_tokens, self.scheme)
        if rule is not None:
            raise CpbenchError(rule)

    @property
    def world(self) -> int:
        """W: ranks."""
        return self.problem.ulysses * self.problem.ring

    @property
    def label(self) -> str:
        p = self.problem
        return (
            f"prefill {self.scheme} {self.new_token_layout} W{self.world} P{self.cached_len} "
            f"T{self.new_tokens} "
            f"h{p.heads}/{p.kv_heads} d{p.head_dim} b{p.batch} {p.dtype}"
        )

    @property
    def q_block(self) -> int:
        """Query rows of the padded block that travels (the largest new-token shard)."""
        return max(new_token_counts(self.new_tokens, self.world, self.new_token_layout))

    @property
    def kv_block(self) -> int:
        """Tokens of the padded K/V chunk (the most cache + new tokens a rank holds)."""
        return kv_block(self.cached_len, self.new_tokens, self.world, self.new_token_layout)


def kv_block(cached_len: int, new_tokens: int, world: int, layout: NewTokenLayout) -> int:
    """Tokens of the padded K/V chunk that travels: the most cache + new tokens one rank
    holds (its cache shard followed by its new tokens)."""
    cache = split_sizes(cached_len, world)
    new = new_token_counts(new_tokens, world, layout)
    return max(c + n for c, n in zip(cache, new, strict=True))


def prefill_bytes(case: PrefillCase) -> dict[str, int]:
    """Bytes one rank sends per collective tag in the forward (the tags `ByteCounter` records:
    p2p_kv, p2p_q, a2a_out, a2a_lse, allgather_kv, a2a_q, a2a_kv). All-to-all counts what a
    rank hands in less its own 1/W share; an all-gather counts the W - 1 chunks that reach it."""
    p, w, e = case.problem, case.world, case.problem.bytes_per_element
    if w == 1:
        return {}
    b, h, hkv, d = p.batch, p.heads, p.kv_heads, p.head_dim
    kv_chunk = b * case.kv_block * 2 * hkv * d * e
    q_block = b * case.q_block * h * d * e
    if case.scheme == "pass_kv":
        return {"p2p_kv": (w - 1) * kv_chunk}
    if case.scheme == "all_gather":
        return {"allgather_kv": (w - 1) * kv_chunk}
    if case.scheme == "pass_q":
        lse = b * h * case.q_block * LSE_BYTES
        return {"p2p_q": (w - 1) * q_block, "a2a_out": (w - 1) * q_block, "a2a_lse": (w - 1) * lse}
    # ulysses: every rank hands in its whole (padded) shard, W-th of it stays home
    kv = ulysses_kv_heads(hkv, w)
    kv_shard = b * case.kv_block * 2 * kv * d * e
    return {
        "a2a_q": q_block * (w - 1) // w,
        "a2a_kv": kv_shard * (w - 1) // w,
        "a2a_out": q_block * (w - 1) // w,
    }


def check_cache_layout(layout: str) -> CacheLayout:
    """`layout` as a `CacheLayout`; CpbenchError naming it when it is none."""
    return check_choice("cache layout", layout, CACHE_LAYOUTS)


def cache_shard_len(total: int, world: int, rank: int, layout: CacheLayout) -> int:
    """Cached tokens rank `rank` holds of `total` (contiguous: `split_sizes`; interleaved:
    the positions p < total with p mod W = rank)."""
    if layout == "contiguous":
        return split_sizes(total, world)[rank]
    return max(0, (total - rank + world - 1) // world)


def cache_visible(total: int, world: int, rank: int, layout: CacheLayout, position: int) -> int:
    """How many of rank `rank`'s cached keys a query at `position` sees (causal: key
    positions <= position). Local keys are in increasing position, so they are a prefix."""
    held = cache_shard_len(total, world, rank, layout)
    if layout == "contiguous":
        start = split_starts(total, world)[rank]
        return min(held, max(0, position + 1 - start))
    return min(held, 0 if position < rank else (position - rank) // world + 1)


def kv_cache_bytes_per_rank(
    total: int, world: int, kv_heads: int, head_dim: int, dtype: str, batch: int = 1
) -> int:
    """KV-cache bytes (one layer) of the rank holding the most of `total` tokens: ceil(N / W)
    tokens x 2 (K and V) x KV heads x head dim x element bytes x batch (both layouts put
    ceil(N / W) on rank 0)."""
    return batch * -(-total // world) * 2 * kv_heads * head_dim * dtype_bytes(dtype)


def prefill_kv_bytes_per_rank(case: PrefillCase) -> int:
    """K/V bytes (one layer) of the rank holding the most before a prefill's exchange: its
    cache shard (`split_sizes(P, W)`) plus its new-token shard (`new_token_counts` by the
    case's layout), x 2 (K and V) x KV heads x head dim x element bytes x batch. Not always
    ceil((P + T) / W): P = T = 3 on 2 ranks, contiguous, puts 2 + 2 tokens on rank 0."""
    p = case.problem
    return p.batch * case.kv_block * 2 * p.kv_heads * p.head_dim * p.bytes_per_element


def longest_context(
    memory_bytes: float, world: int, kv_heads: int, head_dim: int, dtype: str, layers: int,
    batch: int = 1,
) -> int:  # fmt: skip
    """The most tokens per sequence whose KV cache over `layers` layers and `batch` sequences
    fits `memory_bytes` per rank when sharded over `world` ranks (by sequence)."""
    per_token = 2 * kv_heads * head_dim * dtype_bytes(dtype) * layers * batch
    return int(memory_bytes // per_token) * world


def check_decode_merge(merge: str, heads: int, world: int) -> DecodeMerge:
    """`merge` as a `DecodeMerge`; CpbenchError naming the rule when it is none, or when an
    all_to_all merge cannot split the heads over the ranks."""
    known = check_choice("decode merge", merge, DECODE_MERGES)
    if known == "all_to_all" and heads % world:
        raise CpbenchError(
            f"the all_to_all decode merge splits {heads} heads over {world} ranks: "
            f"{heads} % {world} = {heads % world}, must be 0"
        )
    return known


def decode_bytes(
    new_tokens: int,
    world: int,
    heads: int,
    head_dim: int,
    dtype: str,
    batch: int = 1,
    merge: DecodeMerge = "all_gather",
) -> dict[str, int]:
    """Bytes one rank sends in a decode step over a sequence-sharded cache (the queries are on
    every rank already): all_gather, every rank's partial output (inputs' dtype) and LSE
    (fp32) for the T new queries reach it from the W - 1 others; all_to_all, a rank hands its
    whole partial output and LSE into all_to_all_single and keeps its own 1/W (its heads), so
    (W - 1) / W of each is sent (the boundary's count)."""
    check_decode_merge(merge, heads, world)
    if world == 1:
        return {}
    out = batch * new_tokens * heads * head_dim * dtype_bytes(dtype)
    lse = batch * heads * new_tokens * LSE_BYTES
    if merge == "all_to_all":
        return {"a2a_out": out * (world - 1) // world, "a2a_lse": lse * (world - 1) // world}
    return {"allgather_out": (world - 1) * out, "allgather_lse": (world - 1) * lse}


@dataclass(frozen=True)
class DecodeCase:
    """One decode step of `new_tokens` queries over a cache of cached_len + new_tokens keys
    sharded by sequence over the problem's ring of W ranks (U = 1)."""

    problem: CpProblem
    """Heads, KV heads, head dim, batch, dtype, mesh (seq_len = cached_len + new_tokens)."""
    cached_len: int
    """P: tokens cached before this step."""
    new_tokens: int
    """T: 1 to 8 new queries (their K/V appended to the cache)."""
    layout: CacheLayout
    """How the cache is sharded (`CACHE_LAYOUTS`)."""
    seed: int = 0
    """Seed of the global inputs (verify)."""
    merge: DecodeMerge = "all_gather"
    """How the partial outputs are merged (`DECODE_MERGES`; all_to_all ends in a head split)."""

    def __post_init__(self) -> None:
        check_cache_layout(self.layout)
        check_decode_merge(self.merge, self.problem.heads, self.problem.ring)
        rule = decode_rule(self.problem, self.cached_len, self.new_tokens)
        if rule is not None:
            raise CpbenchError(rule)

    @property
    def label(self) -> str:
        p = self.problem
        return (
            f"decode {self.layout} {self.merge} W{p.ring} P{self.cached_len} T{self.new_tokens} "
            f"h{p.heads}/{p.kv_heads} d{p.head_dim} b{p.batch} {p.dtype}"
        )


def prefill_pairs_per_rank(
    cached_len: int, new_tokens: int, world: int, layout: NewTokenLayout = "contiguous"
) -> tuple[int, ...]:
    """Visible query-key pairs each rank computes in a ring prefill (pass-KV and pass-Q alike:
    rank r's new-token queries against every cache key, and causally against the new keys up
    to their own position), with the new tokens sharded by `layout` (`new_token_segments`; the
    default, contiguous, is the formula's first meaning: pass the case's layout). A query at
    new offset o sees P + o + 1 keys, so a run of n from offset s sees n P + n s + n (n + 1) / 2.
    They sum to T P + T (T + 1) / 2 for every layout; contiguous shards give the last rank the
    most (its queries see the most new keys), so the ring's time is the max, not the mean
    (`prefill_imbalance`); zigzag shards pair an early chunk with a late one and even it
    out. FLOPs: 4 B H D per pair."""
    return tuple(
        sum(n * cached_len + n * s + n * (n + 1) // 2 for s, n in runs)
        for runs in new_token_segments(new_tokens, world, layout)
    )


def prefill_imbalance(
    cached_len: int, new_tokens: int, world: int, layout: NewTokenLayout = "contiguous"
) -> float:
    """max / mean of `prefill_pairs_per_rank`: 1 is balanced; T << P tends to 1 (the cache
    part is the same for every query); contiguous, T = P = 8, W = 2: 58 / 50; zigzag, the
    same: 50 / 50."""
    pairs = prefill_pairs_per_rank(cached_len, new_tokens, world, layout)
    return max(pairs) / (sum(pairs) / world)


def inference_case(problem: CpProblem, step: InferenceStep, seed: int = 0) -> PrefillCase | DecodeCase:
    """The model's case of a step on a problem (its heads, head dim, batch, dtype and mesh;
    its seq_len must be P + T): `PrefillCase` or `DecodeCase`, whose rules apply
    (`cpbench.config.inference.prefill_rule` / `decode_rule`)."""
    base = CpProblem(**problem.problem_fields())  # the cases hold the bare problem
    if step.phase == "prefill" and step.scheme is not None:
        return PrefillCase(base, step.cached_len, step.new_tokens, step.scheme, seed)
    if step.phase == "decode" and step.cache_layout is not None:
        return DecodeCase(base, step.cached_len, step.new_tokens, step.cache_layout, seed)
    raise CpbenchError(f"inference step {step} names no scheme or cache layout")  # unreachable
