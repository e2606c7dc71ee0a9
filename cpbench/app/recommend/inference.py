"""Application service of `cpbench recommend --inference`: the ranked prefill schemes or decode
degrees, pass-KV against pass-Q, KV capacity, serving settings.
The model and the output: docs/inference.md."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cpbench.app.recommend.inference_settings import ServingSetting, serving_settings
from cpbench.app.recommend.report import JSON_SCHEMA_VERSION, attributes
from cpbench.app.recommend.types import DEFAULT_HARDWARE, Uncertainty
from cpbench.app.recommend.uncertainty import profile_uncertainty
from cpbench.config.documents import global_batch
from cpbench.config.inference import ulysses_rule
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.inference import PREFILL_SCHEMES, PrefillScheme
from cpbench.model.inference_cost import (
    DecodePrice,
    KvCapacity,
    PrefillPrice,
    check_heads,
    cp_pays_above,
    fastest_prefill,
    kv_capacity,
    pass_kv_hidden_above,
    pass_kv_pass_q_crossover,
    price_decode,
    price_prefill,
    ring_message_ratio,
)
from cpbench.model.ties import ratio_tied
from cpbench.units import GIB

INFERENCE_TIME_CONVENTION = (
    "times are modelled attention time of one layer for the whole batch on the slowest rank "
    "(TTFT: the prefill's attention; decode: one step, one new token per sequence); compute = "
    "kernel time; exposed comm = communication not hidden behind a kernel; T/P = new tokens / "
    "cached tokens"
)
MEMORY_CONVENTION = (
    "KV bytes per rank = ceil(N / W) tokens x 2 (K, V) x KV heads x head dim x dtype bytes x "
    "layers x sequences; GiB = 2^30 bytes; the budget is the device memory (or "
    "--kv-memory-gib), weights and activations not subtracted"
)


@dataclass(frozen=True)
class InferenceRequest:
    """What `cpbench recommend --inference` is asked."""

    heads: int
    """H: query heads of the model (after TP, when TP splits them)."""
    kv_heads: int
    """H_kv: KV heads."""
    prompt_len: int
    """T: new tokens of the turn (query positions P..P+T-1)."""
    cached_len: int = 0
    """P: tokens already in the KV cache (0: a fresh prompt)."""
    decode_batch: int | None = None
    """B: sequences decoding together; set, the decode step is ranked instead of the prefill
    (each sequence's cache holds P + T tokens)."""
    head_dim: int = 128
    """D: head dimension."""
    batch: int = 1
    """Prefill requests of the same P and T priced together."""
    gpus: int = 8
    """GPUs available: CP degrees that divide it are ranked (the rest serve as replicas)."""
    gpus_per_node: int | None = None
    """Devices per node; None = the hardware profile's."""
    hardware: str | None = None
    """Profile name or TOML path; None = h100-sxm."""
    dtype: str = "bfloat16"
    """Activation and KV-cache dtype."""
    kernel: str = "auto"
    """Attention kernel whose efficiency curve prices the kernels."""
    layers: int | None = None
    """Attention layers (for KV capacity and the longest context); None: per layer only."""
    kv_memory_gib: float | None = None
    """Memory per GPU the KV cache may use, GiB; None = the profile's device memory."""
    top: int = 10
    """Feasible candidates to list (0 = all)."""

    def check(self) -> None:
        """CpbenchError naming the value and the rule for input that cannot be priced."""
        rules = (
            (self.prompt_len >= 1, f"--prompt-len (new tokens T) must be >= 1, got {self.prompt_len}"),
            (self.cached_len >= 0, f"--cached-len (cached tokens P) must be >= 0, got {self.cached_len}"),
            (self.decode_batch is None or self.decode_batch >= 1,
             f"--decode-batch must be >= 1 sequences, got {self.decode_batch}"),
            (self.gpus >= 1, f"--gpus must be >= 1, got {self.gpus}"),
            (self.batch >= 1, f"--batch must be >= 1, got {self.batch}"),
            (self.layers is None or self.layers >= 1, f"--layers must be >= 1, got {self.layers}"),
            (self.kv_memory_gib is None or self.kv_memory_gib > 0,
             f"--kv-memory-gib must be > 0, got {self.kv_memory_gib}"),
            (self.top >= 0, f"--top must be >= 0, got {self.top}"),
            (self.gpus_per_node is None or self.gpus_per_node >= 1,
             f"--gpus-per-node must be >= 1, got {self.gpus_per_node}"),
        )  # fmt: skip
        for ok, message in rules:
            if not ok:
                raise CpbenchError(message)

    @property
    def decode(self) -> bool:
        return self.decode_batch is not None


def degrees(gpus: int) -> tuple[int, ...]:
    """The CP degrees ranked: every divisor of the GPUs (the rest run data-parallel replicas)."""
    return tuple(d for d in range(1, gpus + 1) if gpus % d == 0)


def _profile(request: InferenceRequest) -> HardwareProfile:
    profile = load_profile(request.hardware or DEFAULT_HARDWARE)
    if request.gpus_per_node is not None and request.gpus_per_node != profile.devices_per_node:
        profile = replace(profile, devices_per_node=request.gpus_per_node)
    return profile


def _problem(request: InferenceRequest) -> CpProblem:
    """The request's attention problem: its context (P + T), heads, dtype and the batch priced
    (the decode batch when decoding); the pricing reads no mesh from it."""
    batch = request.decode_batch if request.decode_batch is not None else request.batch
    problem = CpProblem(
        seq_len=request.cached_len + request.prompt_len,
        heads=request.heads,
        kv_heads=request.kv_heads,
        head_dim=request.head_dim,
        batch=batch,
        dtype=canonical_dtype(request.dtype),
    )
    check_heads(problem)
    return problem


@dataclass(frozen=True)
class RankedPrice:
    """A priced scheme (or decode degree) at its place in the ranking."""

    price: PrefillPrice | DecodePrice
    """What the model prices it at."""
    rank: int
    """1 = the fastest."""
    tied: bool = False
    """Whether its time ties the leader's (within the prior's ratio sigma)."""
    tokens_per_s: float | None = None
    """Decode tokens per second over `--layers` layers (attention only); None without them."""

    @property
    def label(self) -> str:
        """`1 GPU`, the prefill scheme, or `sharded cache`."""
        if self.price.world == 1:
            return "1 GPU"
        return self.price.scheme if isinstance(self.price, PrefillPrice) else "sharded cache"

    @property
    def bytes_per_rank(self) -> int:
        """Bytes a rank sends per layer."""
        return sum(self.price.bytes_sent.values())


@dataclass(frozen=True)
class Refused:
    """A scheme and degree that cannot serve the request, with the rule."""

    scheme: str
    """The prefill scheme, or `decode`."""
    world: int
    """W: the CP degree."""
    rule: str
    """Why (the heads, or the KV cache against the budget)."""


@dataclass(frozen=True)
class RingVerdict:
    """Which of pass-KV / pass-Q wins on the widest ring, and the numbers that say why."""

    kv: PrefillPrice
    q: PrefillPrice
    cached_len: int
    """P."""
    prompt_len: int
    """T."""
    overlap: float
    """The profile's overlap of a hop with a kernel."""
    crossover_ratio: float | None
    """T/P where the two cost the same on this mesh (None without a cache)."""
    hidden_above_tokens: float
    """T above which pass-KV's hop hides behind its step (bandwidths only)."""
    message_ratio: float
    """2 H_kv / H: pass-KV's hops carry fewer bytes when T / (T + P) reaches it."""

    @property
    def world(self) -> int:
        return self.kv.world

    @property
    def winner(self) -> PrefillScheme:
        return "pass_kv" if self.kv.total_s <= self.q.total_s else "pass_q"

    @property
    def speedup(self) -> float:
        kv, q = self.kv.total_s, self.q.total_s
        return max(kv, q) / min(kv, q)

    @property
    def hop_bytes(self) -> tuple[int, int, int]:
        """Bytes of a pass-KV hop, of a pass-Q hop and of pass-Q's tail (outputs and LSEs)."""
        kv, q, hops = self.kv.bytes_sent, self.q.bytes_sent, self.world - 1
        tail = q.get("a2a_out", 0) + q.get("a2a_lse", 0)
        return kv.get("p2p_kv", 0) // hops, q.get("p2p_q", 0) // hops, tail

    @property
    def turn_ratio(self) -> float | None:
        return self.prompt_len / self.cached_len if self.cached_len else None


@dataclass(frozen=True)
class InferenceRecommendation:
    """The answer of `recommend --inference` (`inference_report` is its `--json`)."""

    request: InferenceRequest
    profile: HardwareProfile
    """The profile priced on (with `--gpus-per-node`)."""
    uncertainty: Uncertainty
    """The prior's sigma (ties are called on its ratio sigma)."""
    capacity: tuple[KvCapacity, ...]
    """The KV cache per rank of every degree."""
    ranked: tuple[RankedPrice, ...]
    """Every feasible candidate, fastest first."""
    rejected: tuple[Refused, ...]
    """The candidates that cannot serve the request."""
    verdict: RingVerdict | None
    """pass-KV against pass-Q (prefill on more than one GPU)."""
    settings: tuple[ServingSetting, ...]
    """vLLM and SGLang for the winner."""
    cp_pays_above: dict[int, int | None] = field(default_factory=dict)
    """Prefill: per CP degree > 1, the shortest prompt (on the request's cache) whose fastest
    scheme's TTFT is below one GPU's (`inference_cost.cp_pays_above`); None: never below 4M."""

    @property
    def listed(self) -> tuple[RankedPrice, ...]:
        """The first `top` ranked (all for 0)."""
        return self.ranked if self.request.top == 0 else self.ranked[: self.request.top]

    @property
    def tied_with_leader(self) -> list[str]:
        """`label W<world>` of each listed candidate that ties the leader."""
        return [f"{r.label} W{r.price.world}" for r in self.listed[1:] if r.tied]

    @property
    def ratio_sigma(self) -> float:
        return self.uncertainty.ratio_sigma

    def instead(self, setting: ServingSetting) -> RankedPrice | None:
        """The candidate a setting runs instead of the winner (its scheme on the winner's
        degree), if ranked."""
        if setting.runs_instead is None or not self.ranked:
            return None
        world = self.ranked[0].price.world
        return next((r for r in self.ranked if isinstance(r.price, PrefillPrice)
                     and r.price.scheme == setting.runs_instead and r.price.world == world),
                    None)  # fmt: skip


def recommend_inference(request: InferenceRequest) -> InferenceRecommendation:
    """The serving recommendation (see the module docstring)."""
    request.check()
    shape = _problem(request)
    profile = _profile(request)
    uncertainty = profile_uncertainty(profile, None)
    context = request.cached_len + request.prompt_len
    budget = (request.kv_memory_gib or profile.memory.capacity_gib) * GIB
    layers = request.layers or 1
    capacity = {w: kv_capacity(context, shape, w, layers, budget) for w in degrees(request.gpus)}
    rejected: list[Refused] = []
    priced: list[PrefillPrice | DecodePrice] = []
    for w, fit in capacity.items():
        schemes = PREFILL_SCHEMES if w > 1 else PREFILL_SCHEMES[:1]
        for scheme in (None,) if request.decode else schemes:
            rule = ulysses_rule(shape.heads, shape.kv_heads, w) if scheme == "ulysses" else None
            if rule is None:
                rule = _memory_rule(request, fit, context)
            if rule is not None:
                rejected.append(Refused(scheme or "decode", w, rule))
            elif scheme is None:
                priced.append(price_decode(context, shape, w, profile, request.kernel))
            else:
                priced.append(price_prefill(scheme, request.cached_len, request.prompt_len,
                                            shape, w, profile, request.kernel))  # fmt: skip
    priced.sort(key=lambda c: (c.total_s, c.world))
    lead = priced[0].total_s if priced else 0.0
    layers_decoded = request.layers if request.decode else None
    ranked = tuple(
        RankedPrice(c, i, ratio_tied(lead, c.total_s, uncertainty.ratio_sigma),
                    shape.batch / (c.total_s * layers_decoded) if layers_decoded else None)
        for i, c in enumerate(priced, 1)
    )  # fmt: skip
    ring_world = request.gpus if request.gpus > 1 and not request.decode else None
    verdict = _ring_verdict(request, shape, ring_world, profile) if ring_world else None
    winner = ranked[0].price if ranked else None
    settings = serving_settings(
        request.decode, getattr(winner, "scheme", "decode"), winner.world, request.gpus, shape,
        request.cached_len,
    ) if winner else ()  # fmt: skip
    pays = {} if request.decode else {
        w: cp_pays_above(shape, w, profile, request.cached_len, request.kernel)
        for w in capacity if w > 1
    }  # fmt: skip
    return InferenceRecommendation(request, profile, uncertainty, tuple(capacity.values()),
                                   ranked, tuple(rejected), verdict, settings, pays)  # fmt: skip


def _memory_rule(request: InferenceRequest, fit: KvCapacity, tokens: int) -> str | None:
    """Why a degree cannot hold the KV cache (with `--layers`: the cache of every layer against
    the budget per rank), or None when it fits or no layer count was given."""
    if not request.layers or fit.bytes_per_rank <= fit.budget_bytes:
        return None
    return (
        f"the KV cache of {tokens} tokens over {request.layers} layers needs "
        f"{fit.bytes_per_rank / GIB:.1f} GiB per rank on {fit.world} GPUs, more than "
        f"the {fit.budget_bytes / GIB:.1f} GiB budget"
    )


def _ring_verdict(request: InferenceRequest, shape: CpProblem, world: int,
                  profile: HardwareProfile) -> RingVerdict:  # fmt: skip
    """Which of pass-KV / pass-Q wins on `world` ranks, and the numbers that say why."""
    p, t, kernel = request.cached_len, request.prompt_len, request.kernel
    kv = price_prefill("pass_kv", p, t, shape, world, profile, kernel)
    q = price_prefill("pass_q", p, t, shape, world, profile, kernel)
    crossover = pass_kv_pass_q_crossover(p, shape, world, profile, kernel) if p >= 1 else None
    hidden = pass_kv_hidden_above(shape, world, profile, p + t, kernel)
    return RingVerdict(kv, q, p, t, profile.overlap, crossover, hidden, ring_message_ratio(shape))


# ------------------------------------------------------- a distribution of prompt lengths

PROMPT_SAMPLE_TOKENS = 1 << 22
"""Prompt tokens a `--prompt-lens` distribution is drawn to (about 1,000 requests at a mean of
4,096; a file's lengths are read until they hold as many, explicit lengths are all taken)."""


@dataclass(frozen=True)
class PolicyRange:
    """Consecutive prompt lengths the serving policy gives one CP degree."""

    low: int
    """Shortest prompt of the range (tokens)."""
    high: int
    """Longest prompt of the range."""
    world: int
    """The degree: the least modelled TTFT of every degree that holds these prompts."""
    schemes: tuple[str, ...]
    """The fastest prefill scheme(s) on it over the range (`1 GPU` on one)."""
    requests: int
    """Requests of the sample in the range."""
    share: float
    """requests / all requests."""
    mean_ttft_s: float
    """Their mean modelled TTFT on the degree."""


@dataclass(frozen=True)
class ServingPolicy:
    """The answer of `recommend --inference --prompt-lens`: each request on the CP degree of
    the least modelled TTFT (`fastest_prefill`), against static CP on every degree."""

    request: InferenceRequest
    """The request's options (prompt_len: the longest prompt of the sample)."""
    profile: HardwareProfile
    source: str
    """The length source as given."""
    seed: int
    prompts: tuple[int, ...]
    """The requests' prompt lengths (new tokens T on `cached_len`), in drawn order."""
    ranges: tuple[PolicyRange, ...]
    """The policy: prompt-length ranges and their degree, shortest first."""
    mean_ttft_s: float
    """Mean modelled TTFT of the policy over the requests."""
    static_ttft_s: dict[int, float | None]
    """Mean TTFT of static CP at each degree (None: it cannot hold every request's cache)."""
    cp_pays_above: dict[int, int | None]
    """Per CP degree > 1, the prompt above which CP's prefill beats one GPU's."""

    @property
    def widest(self) -> int:
        """The mesh's CP degree: every GPU of the request."""
        return self.request.gpus


def serving_policy(request: InferenceRequest, source: str, seed: int = 0) -> ServingPolicy:
    """The serving policy of a distribution of prompt lengths (see `ServingPolicy`); the
    request's prompt_len is replaced by the sample's longest. CpbenchError (exit 2) when the
    source gives no valid length or a prompt no degree can hold."""
    if request.decode:
        raise CpbenchError("--prompt-lens ranks the prefill of each request: leave out "
                           "--decode-batch")
    prompts = global_batch(source, PROMPT_SAMPLE_TOKENS, seed)
    request = replace(request, prompt_len=max(prompts))
    request.check()
    shape = _problem(request)
    profile = _profile(request)
    budget = (request.kv_memory_gib or profile.memory.capacity_gib) * GIB
    cached, layers = request.cached_len, request.layers or 1
    holds = {w: kv_capacity(cached, shape, w, layers, budget).longest_context
             for w in degrees(request.gpus)}  # fmt: skip
    widest = max(holds, key=lambda w: holds[w])
    if cached + request.prompt_len > holds[widest]:
        raise CpbenchError(
            f"prompt length {request.prompt_len:,} from {source.strip()!r} (on {cached:,} "
            f"cached) does not fit: the KV cache of {layers} layer(s) holds at most "
            f"{holds[widest]:,} tokens per sequence on {widest} GPUs of "
            f"{budget / GIB:.1f} GiB: give shorter prompts (max=) or more --kv-memory-gib"
        )
    times: dict[int, dict[int, PrefillPrice]] = {}  # prompt -> degree -> fastest scheme
    for t in sorted(set(prompts)):
        held = (w for w, longest in holds.items() if cached + t <= longest)
        priced = ((w, fastest_prefill(cached, t, shape, w, profile, request.kernel)) for w in held)
        times[t] = {w: best for w, best in priced if best is not None}
    chosen = {t: min(row.values(), key=lambda p: (p.total_s, p.world)) for t, row in times.items()}
    count = Counter(prompts)
    ranges = []
    for world, run in itertools.groupby(times, key=lambda t: chosen[t].world):
        group = list(run)
        n = sum(count[t] for t in group)
        ranges.append(PolicyRange(
            group[0], group[-1], world, tuple(dict.fromkeys(_scheme_label(chosen[t])
                                                           for t in group)),
            n, n / len(prompts), sum(count[t] * chosen[t].total_s for t in group) / n,
        ))  # fmt: skip
    static = {
        w: (statistics.fmean(times[t][w].total_s for t in prompts)
            if all(w in times[t] for t in times) else None)
        for w in holds
    }  # fmt: skip
    pays = {w: cp_pays_above(shape, w, profile, cached, request.kernel) for w in holds if w > 1}
    policy_mean = statistics.fmean(chosen[t].total_s for t in prompts)
    return ServingPolicy(request, profile, source, seed, prompts, tuple(ranges), policy_mean,
                         static, pays)  # fmt: skip


def _scheme_label(price: PrefillPrice) -> str:
    return "1 GPU" if price.world == 1 else price.scheme


def serving_policy_report(policy: ServingPolicy) -> dict[str, Any]:
    """The `--json` answer of `recommend --inference --prompt-lens`."""
    q, prompts = policy.request, policy.prompts
    inputs = {k: v for k, v in asdict(q).items() if k not in ("prompt_len", "decode_batch", "top")}
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "inputs": inputs | {
            "mode": "prefill_policy", "prompt_lens": policy.source, "seed": policy.seed,
            "hardware": policy.profile.name, "gpus_per_node": policy.profile.devices_per_node,
        },
        "prompts": {
            "requests": len(prompts), "mean": statistics.fmean(prompts),
            "median": statistics.median(prompts), "min": min(prompts), "max": max(prompts),
            "sample_tokens": PROMPT_SAMPLE_TOKENS,
        },
        "policy": [asdict(r) | {"schemes": list(r.schemes)} for r in policy.ranges],
        "mean_ttft_s": {
            "policy": policy.mean_ttft_s,
            "static_cp": policy.static_ttft_s.get(policy.widest),
            "no_cp": policy.static_ttft_s.get(1),
        },
        "static_cp_degree": policy.widest,
        "static_ttft_s": {str(w): t for w, t in policy.static_ttft_s.items()},
        "cp_pays_above": {str(w): t for w, t in policy.cp_pays_above.items()} or None,
        "conventions": {"time": INFERENCE_TIME_CONVENTION, "memory": MEMORY_CONVENTION},
    }


# ---------------------------------------------------------------------------------- JSON


def inference_report(rec: InferenceRecommendation) -> dict[str, Any]:
    """The `--json` answer of `recommend --inference`."""
    q, u, listed = rec.request, rec.uncertainty, rec.listed
    tied = rec.tied_with_leader
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "inputs": asdict(q) | {
            "mode": "decode" if q.decode else "prefill",
            "hardware": rec.profile.name,
            "gpus_per_node": rec.profile.devices_per_node,
            "context_len": q.cached_len + q.prompt_len,
            "turn_ratio": q.prompt_len / q.cached_len if q.cached_len else None,
        },
        "conventions": {"time": INFERENCE_TIME_CONVENTION, "memory": MEMORY_CONVENTION},
        "uncertainty": attributes(u, "kind sigma", ratio_sigma=rec.ratio_sigma, source=u.source),
        "capacity": [asdict(c) | {"layers": q.layers or 1} for c in rec.capacity],
        "candidates": [_ranked_json(r) for r in listed],
        "feasible": len(rec.ranked),
        "rejected": [asdict(x) for x in rec.rejected],
        "ring_verdict": _verdict_json(rec.verdict) if rec.verdict else None,
        "winner_scheme": getattr(rec.ranked[0].price, "scheme", None) if rec.ranked else None,
        "tie": {"tied_with_leader": tied, "clear": not tied} if listed else None,
        "settings": [_setting_json(rec, s) for s in rec.settings],
        "cp_pays_above": {str(w): t for w, t in rec.cp_pays_above.items()} or None,
    }


def _ranked_json(r: RankedPrice) -> dict[str, Any]:
    more = {} if r.tokens_per_s is None else {"tokens_per_s": r.tokens_per_s}
    return asdict(r.price) | attributes(r, "rank label bytes_per_rank") | more | {"tied": r.tied}


def _verdict_json(v: RingVerdict) -> dict[str, Any]:
    kv, q = v.kv, v.q
    kv_hop, q_hop, q_tail = v.hop_bytes
    return {
        **attributes(v, "world", tier=kv.tier, winner=v.winner, pass_kv_s=kv.total_s),
        "pass_q_s": q.total_s,
        "speedup": v.speedup,
        "step_s": kv.step_s,
        "kv_hop_s": kv.hop_s,
        "q_hop_s": q.hop_s,
        "q_tail_s": q.tail_s,
        "kv_exposed_s": kv.exposed_comm_s,
        "q_exposed_s": q.exposed_comm_s,
        "kv_hop_bytes": kv_hop,
        "q_hop_bytes": q_hop,
        "q_tail_bytes": q_tail,
        **attributes(v, "overlap turn_ratio crossover_ratio"),
        "crossover_tokens": None if v.crossover_ratio is None else v.crossover_ratio * v.cached_len,
        **attributes(v, "hidden_above_tokens message_ratio"),
        "new_share": v.prompt_len / (v.prompt_len + v.cached_len),
    }


def _setting_json(rec: InferenceRecommendation, s: ServingSetting) -> dict[str, Any]:
    row = {key: value for key, value in asdict(s).items() if value is not None}  # runs_instead
    instead, winner = rec.instead(s), rec.ranked[0] if rec.ranked else None
    if instead is not None and winner is not None:
        slower = instead.price.total_s / winner.price.total_s
        row["instead"] = attributes(instead.price, "scheme world", rank=instead.rank,
                                    total_s=instead.price.total_s, slower=slower)  # fmt: skip
    return row
