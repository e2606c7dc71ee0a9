"""Application service of `cpbench recommend --inference`: the ranked prefill schemes or decode
degrees, pass-KV against pass-Q, KV capacity, serving settings (a JSON-serialisable dict).
The model and the output: docs/inference.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from cpbench.app.recommend.inference_settings import serving_settings
from cpbench.app.recommend.types import DEFAULT_HARDWARE
from cpbench.app.recommend.uncertainty import profile_uncertainty
from cpbench.config.inference import ulysses_rule
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.inference import PREFILL_SCHEMES, PrefillScheme
from cpbench.model.inference_cost import (
    DecodePrice,
    PrefillPrice,
    check_heads,
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
        )  # fmt: skip
        for ok, message in rules:
            if not ok:
                raise CpbenchError(message)
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise CpbenchError(f"--gpus-per-node must be >= 1, got {self.gpus_per_node}")

    @property
    def decode(self) -> bool:
        return self.decode_batch is not None


def degrees(gpus: int) -> tuple[int, ...]:
    """The CP degrees ranked: every divisor of the GPUs (the rest run data-parallel replicas)."""
    return tuple(d for d in range(1, gpus + 1) if gpus % d == 0)


def _profile(request: InferenceRequest) -> HardwareProfile:
    profile = load_profile(request.hardware or DEFAULT_HARDWARE)
    if request.gpus_per_node is not None and request.gpus_per_node != profile.devices_per_node:
        from dataclasses import replace  # noqa: PLC0415

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


def recommend_inference(request: InferenceRequest) -> dict[str, Any]:
    """The serving recommendation as a JSON-serialisable dict (see the module docstring)."""
    request.check()
    shape = _problem(request)
    profile = _profile(request)
    uncertainty = profile_uncertainty(profile, None)
    context = request.cached_len + request.prompt_len
    budget = (request.kv_memory_gib or profile.memory.capacity_gib) * GIB
    report: dict[str, Any] = {
        "inputs": {
            **asdict(request),
            "mode": "decode" if request.decode else "prefill",
            "hardware": profile.name,
            "gpus_per_node": profile.devices_per_node,
            "context_len": context,
            "turn_ratio": request.prompt_len / request.cached_len if request.cached_len else None,
        },
        "conventions": {"time": INFERENCE_TIME_CONVENTION, "memory": MEMORY_CONVENTION},
        "uncertainty": {
            "kind": uncertainty.kind,
            "sigma": uncertainty.sigma,
            "ratio_sigma": uncertainty.split.ratio_sigma
            if uncertainty.split
            else uncertainty.sigma,
            "source": uncertainty.source,
        },
    }
    layers = request.layers or 1
    capacity = [
        asdict(kv_capacity(context, shape, w, layers, budget)) | {"layers": layers}
        for w in degrees(request.gpus)
    ]
    report["capacity"] = capacity
    if request.decode:
        report |= _decode_ranking(request, shape, profile, capacity)
    else:
        report |= _prefill_ranking(request, shape, profile, capacity)
    _call_ties(report, uncertainty.split.ratio_sigma if uncertainty.split else None)
    every = report.pop("every_candidate")
    winner = every[0] if every else None
    report["settings"] = serving_settings(
        request.decode, winner, request.gpus, shape, request.cached_len
    )
    for row in report["settings"]:
        instead = row.get("runs_instead")
        if instead is None or winner is None:
            continue
        same = [c for c in every if c["scheme"] == instead and c["world"] == winner["world"]]
        if same:
            row["instead"] = {k: same[0][k] for k in ("scheme", "world", "rank", "total_s")}
            row["instead"]["slower"] = same[0]["total_s"] / winner["total_s"]
    return report


def _prefill_ranking(
    request: InferenceRequest,
    shape: CpProblem,
    profile: HardwareProfile,
    capacity: list[dict[str, Any]],
) -> dict[str, Any]:
    p, t = request.cached_len, request.prompt_len
    fits = {c["world"]: c for c in capacity}
    priced: list[PrefillPrice] = []
    rejected: list[dict[str, Any]] = []
    for w in degrees(request.gpus):
        for scheme in PREFILL_SCHEMES if w > 1 else PREFILL_SCHEMES[:1]:
            rule = (
                ulysses_rule(shape.heads, shape.kv_heads, w) if scheme == "ulysses" else None
            )
            if rule is None:
                rule = _memory_rule(request, fits[w], p + t)
            if rule is not None:
                rejected.append({"scheme": scheme, "world": w, "rule": rule})
                continue
            priced.append(price_prefill(scheme, p, t, shape, w, profile, request.kernel))
    priced.sort(key=lambda c: (c.total_s, c.world))
    candidates = [_prefill_dict(c, i + 1) for i, c in enumerate(priced)]
    ring_world = max(w for w in degrees(request.gpus)) if request.gpus > 1 else None
    verdict = (
        _ring_verdict(p, t, shape, ring_world, profile, request.kernel) if ring_world else None
    )
    shown = candidates if request.top == 0 else candidates[: request.top]
    return {
        "candidates": shown,
        "every_candidate": candidates,
        "feasible": len(candidates),
        "rejected": rejected,
        "ring_verdict": verdict,
        "winner_scheme": candidates[0]["scheme"] if candidates else None,
    }


def _memory_rule(request: InferenceRequest, fit: dict[str, Any], tokens: int) -> str | None:
    """Why a degree cannot hold the KV cache (with `--layers`: the cache of every layer against
    the budget per rank), or None when it fits or no layer count was given."""
    if not request.layers or fit["bytes_per_rank"] <= fit["budget_bytes"]:
        return None
    return (
        f"the KV cache of {tokens} tokens over {request.layers} layers needs "
        f"{fit['bytes_per_rank'] / GIB:.1f} GiB per rank on {fit['world']} GPUs, more than "
        f"the {fit['budget_bytes'] / GIB:.1f} GiB budget"
    )


def _prefill_dict(c: PrefillPrice, rank: int) -> dict[str, Any]:
    d = asdict(c)
    d["rank"] = rank
    d["label"] = "1 GPU" if c.world == 1 else c.scheme
    d["bytes_per_rank"] = sum(c.bytes_sent.values())
    return d


def _ring_verdict(p: int, t: int, shape: CpProblem, world: int,
                  profile: HardwareProfile, kernel: str) -> dict[str, Any]:  # fmt: skip
    """Which of pass-KV / pass-Q wins on `world` ranks, and the numbers that say why."""
    kv = price_prefill("pass_kv", p, t, shape, world, profile, kernel)
    q = price_prefill("pass_q", p, t, shape, world, profile, kernel)
    winner: PrefillScheme = "pass_kv" if kv.total_s <= q.total_s else "pass_q"
    crossover = pass_kv_pass_q_crossover(p, shape, world, profile, kernel) if p >= 1 else None
    return {
        "world": world,
        "tier": kv.tier,
        "winner": winner,
        "pass_kv_s": kv.total_s,
        "pass_q_s": q.total_s,
        "speedup": max(kv.total_s, q.total_s) / min(kv.total_s, q.total_s),
        "step_s": kv.step_s,
        "kv_hop_s": kv.hop_s,
        "q_hop_s": q.hop_s,
        "q_tail_s": q.tail_s,
        "kv_exposed_s": kv.exposed_comm_s,
        "q_exposed_s": q.exposed_comm_s,
        "kv_hop_bytes": kv.bytes_sent.get("p2p_kv", 0) // (world - 1),
        "q_hop_bytes": q.bytes_sent.get("p2p_q", 0) // (world - 1),
        "q_tail_bytes": q.bytes_sent.get("a2a_out", 0) + q.bytes_sent.get("a2a_lse", 0),
        "overlap": profile.overlap,
        "turn_ratio": t / p if p else None,
        "crossover_ratio": crossover,
        "crossover_tokens": None if crossover is None else crossover * p,
        "hidden_above_tokens": pass_kv_hidden_above(shape, world, profile, p + t, kernel),
        "message_ratio": ring_message_ratio(shape),
        "new_share": t / (t + p),
    }


def _decode_ranking(request: InferenceRequest, shape: CpProblem, profile: HardwareProfile,
                    capacity: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    context = request.cached_len + request.prompt_len
    fits = {c["world"]: c for c in capacity}
    priced: list[DecodePrice] = []
    rejected: list[dict[str, Any]] = []
    for w in degrees(request.gpus):
        rule = _memory_rule(request, fits[w], context)
        if rule is not None:
            rejected.append({"scheme": "decode", "world": w, "rule": rule})
            continue
        priced.append(price_decode(context, shape, w, profile, request.kernel))
    priced.sort(key=lambda c: (c.total_s, c.world))
    candidates = []
    for i, c in enumerate(priced):
        d = asdict(c)
        d["rank"] = i + 1
        d["label"] = "1 GPU" if c.world == 1 else "sharded cache"
        d["bytes_per_rank"] = sum(c.bytes_sent.values())
        if request.layers:
            d["tokens_per_s"] = shape.batch / (c.total_s * request.layers)
        candidates.append(d)
    shown = candidates if request.top == 0 else candidates[: request.top]
    return {"candidates": shown, "every_candidate": candidates, "feasible": len(candidates),
            "rejected": rejected, "ring_verdict": None, "winner_scheme": None}  # fmt: skip


def _call_ties(report: dict[str, Any], sigma: float | None) -> None:
    """Mark the candidates whose time ties the leader's (`ratio_tied` on the prior's ratio
    sigma: the interval of their ratio contains 1)."""
    rows = report["candidates"]
    if not rows:
        report["tie"] = None
        return
    lead = rows[0]["total_s"]
    for r in rows:
        t = r["total_s"]
        r["tied"] = math.isclose(t, lead) if sigma is None else ratio_tied(lead, t, sigma)
    names = [f"{r['label']} W{r['world']}" for r in rows[1:] if r["tied"]]
    report["tie"] = {"tied_with_leader": names, "clear": not names}
