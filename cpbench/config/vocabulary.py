"""The one vocabulary: every option literal of a configuration, and its tuple of values. Pure
Python (no torch): the CLI, the scenarios, the model and the kernels all take their option
values from here, so that each concept is spelled once."""

from __future__ import annotations

from typing import Literal, get_args

from cpbench.errors import CpbenchError

Layout = Literal["contiguous", "zigzag", "striped", "doc_zigzag", "balanced"]
"""How the sequence is cut over the ring (cpbench/config/geometry.py defines each): the global
layouts contiguous, zigzag (2R chunks, rank j holds j and 2R-1-j) and striped (token i on rank
i mod R); doc_zigzag (every document cut into 2R chunks and zigzagged, documents padded to a
multiple of 2R); balanced (blocks assigned by cpbench so that the mask-aware work per rank is
equal, no padding)."""
Mask = Literal["causal", "full", "document", "sliding_window", "document_sliding_window"]
"""The attention mask kinds (cpbench/config/masks.py: MaskSpec)."""
Dtype = Literal["float32", "bfloat16", "float16"]
Backend = Literal["auto", "sdpa", "naive", "flash_attn", "flash_attn3", "cudnn", "efficient"]
"""The local attention kernel (cpbench/attention/kernels): auto picks the fastest usable one;
sdpa is PyTorch's fused flash op (CPU or CUDA fp16/bf16), naive the einsum reference,
flash_attn flash-attn 2, flash_attn3 FlashAttention-3 (Hopper), cudnn cuDNN attention,
efficient PyTorch's memory-efficient op (CUDA, also float32)."""
KernelFamily = Literal["flash_attn", "flash_attn3", "cudnn", "cuda_sdpa", "cpu_sdpa", "einsum"]
"""An attention-kernel family the profiles give efficiency curves for: FlashAttention-2
(flash-attn 2.x), FlashAttention-3 (flash-attn's Hopper build), cuDNN's fused attention,
PyTorch's CUDA SDPA op (FA2 code vendored in PyTorch), PyTorch's CPU SDPA op, and the einsum
kernel that materialises the scores."""
KERNEL_FAMILIES: tuple[KernelFamily, ...] = get_args(KernelFamily)
KERNEL_ALIASES: dict[str, KernelFamily] = {
    "naive": "einsum",
    "fa2": "flash_attn",
    "flash_attn2": "flash_attn",
    "flash_attn_2": "flash_attn",
    "fa3": "flash_attn3",
    "flash_attn_3": "flash_attn3",
    "flash_attn_interface": "flash_attn3",
    "cudnn_attention": "cudnn",
    "cudnn_sdpa": "cudnn",
    "efficient": "cuda_sdpa",  # memory-efficient SDPA (fp32 on CUDA): no published curve;
    # an estimate by the closest family (PyTorch's CUDA SDPA)
}
"""Kernel names (`--kernel`, a record's `config.kernel`) that name a family under another
spelling; `sdpa` is `cuda_sdpa` or `cpu_sdpa` by the profile's device, `auto` its default."""
KERNEL_NAMES: tuple[str, ...] = ("auto", "sdpa", *KERNEL_FAMILIES, *KERNEL_ALIASES)
"""Every kernel name `HardwareProfile.kernel_for` resolves."""
Phase = Literal["fwd", "fwd+bwd"]
"""What a training step runs: the forward pass, or forward plus backward."""
InferencePhase = Literal["prefill", "decode"]
"""What an inference step runs (forward only, `cpbench.config.inference.InferenceStep`):
prefill, T new tokens on P cached ones (time to first token), or decode, 1 to 8 new queries
over a KV cache sharded by sequence (inter-token latency)."""
ScenarioPhase = Literal["fwd", "fwd+bwd", "prefill", "decode"]
"""A scenario's `phase` axis: a training `Phase` or an `InferencePhase`."""
PrefillScheme = Literal["pass_kv", "pass_q", "all_gather", "ulysses"]
"""How the ranks exchange data in a prefill with a cached prefix (`cpbench.model.inference`):
the ring passes K/V, the ring passes the queries (and the partial outputs go home), one
all-gather of K/V, or Ulysses' all-to-all to a head split."""
CacheLayout = Literal["contiguous", "interleaved"]
"""How a decode's KV cache is sharded by sequence: contiguous (rank r holds the r-th of
`split_sizes(N, W)`) or interleaved (rank r holds positions r, r + W, r + 2W, ...: the cache
grows evenly over the ranks, one token each in turn)."""
NewTokenLayout = Literal["contiguous", "zigzag"]
"""How a prefill's T new tokens are sharded over the W ranks: contiguous (rank r holds the r-th
of `split_sizes(T, W)`: the last rank's queries see the most new keys) or zigzag (the training
`Layout` of that name applied to the new tokens: 2W chunks `split_sizes(T, 2W)`, rank r holds
chunks r and 2W - 1 - r: Meta's load-balanced sharding, arXiv:2411.01783 §3.2, vLLM's head-tail
split)."""
DecodeMerge = Literal["all_gather", "all_to_all"]
"""How a decode step merges the ranks' partial outputs: all_gather (every rank gathers every
partial output and LSE and merges the whole output) or all_to_all (back to a head split,
Helix-style: rank r receives heads r H / W .. (r + 1) H / W of every rank's partial output and
LSE and merges those heads of every query; W must divide H)."""
Device = Literal["cpu", "cuda"]
ScenarioDevice = Literal["auto", "cpu", "cuda"]
Scheme = Literal["single", "ring", "ulysses", "usp", "allgather", "usp_allgather"]
"""What a U x R mesh runs: single (one rank), ulysses (R = 1), and on the ring axis (R > 1)
ring / usp when its ranks pass K/V point to point (`CpComm` p2p), allgather / usp_allgather
when they all-gather it (U = 1 / U > 1)."""
CpComm = Literal["p2p", "all_gather"]
"""How the ranks of the ring axis (R > 1) exchange K/V: p2p, the ring (K/V hop to the next
neighbour while a step computes; dK/dV travel with them); all_gather, the Llama 3 scheme
(every rank all-gathers the group's K/V in head strides, computes its queries against them,
and reduce-scatters dK/dV to the owners; `cpbench/attention/allgather.py`)."""

LAYOUTS: tuple[Layout, ...] = get_args(Layout)
GLOBAL_LAYOUTS: tuple[Layout, ...] = ("contiguous", "zigzag", "striped")
"""The layouts defined over the whole sequence, blind to documents."""
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
BACKENDS: tuple[Backend, ...] = get_args(Backend)
PHASES: tuple[Phase, ...] = get_args(Phase)
INFERENCE_PHASES: tuple[InferencePhase, ...] = get_args(InferencePhase)
SCENARIO_PHASES: tuple[ScenarioPhase, ...] = get_args(ScenarioPhase)
PREFILL_SCHEMES: tuple[PrefillScheme, ...] = get_args(PrefillScheme)
CACHE_LAYOUTS: tuple[CacheLayout, ...] = get_args(CacheLayout)
NEW_TOKEN_LAYOUTS: tuple[NewTokenLayout, ...] = get_args(NewTokenLayout)
DECODE_MERGES: tuple[DecodeMerge, ...] = get_args(DecodeMerge)
DEVICES: tuple[Device, ...] = get_args(Device)
SCENARIO_DEVICES: tuple[ScenarioDevice, ...] = get_args(ScenarioDevice)
CP_COMMS: tuple[CpComm, ...] = get_args(CpComm)
DEFAULT_CP_COMM: CpComm = "p2p"
"""The ring axis of a configuration that names none: today's ring."""
CpCommChoice = Literal["both", "p2p", "all_gather"]
"""A `--cp-comm` option that may take both ways of the ring axis (verify, recommend)."""
CP_COMM_CHOICES: dict[str, tuple[CpComm, ...]] = {
    "both": CP_COMMS,
    "p2p": ("p2p",),
    "all_gather": ("all_gather",),
}
"""The `CpComm`s of each `CpCommChoice`."""

CliDevice = ScenarioDevice
"""A `--device` option: auto picks cuda when a GPU is visible."""
DEFAULT_DTYPE: dict[str, Dtype] = {"cpu": "float32", "cuda": "bfloat16"}
"""Dtype of a configuration that names none, per device."""

# The words of a step: `Phase` is what a step runs (fwd, or fwd+bwd: training); `Pass` is one
# direction (forward or backward); `Passes` a pass or both summed, as the model totals them;
# `PassKey` a pass as the results record spells its keys (fwd, bwd).
Pass = Literal["forward", "backward"]
"""One pass of a step, as the analytic model (cpbench/model) counts bytes, FLOPs and time."""
Passes = Literal["forward", "backward", "forward_backward"]
"""A pass, or both together (forward_backward: the sum of the two, what a training step runs)."""
PassKey = Literal["fwd", "bwd"]
"""A pass as the results record's keys spell it (`comm.analytic_bytes["bwd"]`)."""

PASSES: tuple[Pass, ...] = get_args(Pass)
PASS_TOTALS: tuple[Passes, ...] = get_args(Passes)
PHASE_PASSES: dict[Phase, Passes] = {"fwd": "forward", "fwd+bwd": "forward_backward"}
"""The passes of each `Phase`."""
STEP_PASSES: tuple[Passes, ...] = tuple(PHASE_PASSES.values())
"""What a step can run: forward, or forward_backward (what a memory peak covers)."""
PASS_KEYS: dict[PassKey, Pass] = {"fwd": "forward", "bwd": "backward"}
"""The pass each record key names."""

HalfDtype = Literal["bfloat16", "float16"]
"""The 16-bit `Dtype`s: what flash-attn (and the libraries built on it) take."""
HALF_DTYPES: tuple[HalfDtype, ...] = get_args(HalfDtype)
YUNCHANG_RING_IMPL_TYPES: dict[str, str] = {
    "contiguous": "basic",
    "zigzag": "zigzag",
    "striped": "strip",
}
"""yunchang's `ring_impl_type` for each `Layout` (its name for the same token order)."""

Split = Literal["stratified", "random"]
"""How `cpbench validate --holdout` splits measurements into calibration and test halves."""
SPLITS: tuple[Split, ...] = get_args(Split)

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_ALIASES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def canonical_dtype(name: str) -> Dtype:
    """The canonical dtype name for `name` (`bf16` -> `bfloat16`); CpbenchError if unknown."""
    key = str(name).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    for dtype in DTYPES:
        if dtype == key:
            return dtype
    allowed = ", ".join([*DTYPES, *DTYPE_ALIASES])
    raise CpbenchError(f"dtype {name!r} is not supported; use one of {allowed}")


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name (aliases accepted)."""
    return DTYPE_BYTES[canonical_dtype(name)]
