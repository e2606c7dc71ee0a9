"""Every command-line option, declared once: one `typer.Option` per option name (its flags and
its help), and the `Annotated` aliases the commands' parameters use (a name taken as a single
value, an optional one or a repeatable list shares its one declaration). The help of an option
that is a field of a configuration type is that field's docstring; so are the defaults the
commands share with it (`DEFAULTS`). `tests/test_cli_options.py` checks that no option is
declared anywhere else and that every command gives one name one help and one type."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.models import OptionInfo

from cpbench.config.bench import BenchConfig
from cpbench.config.impls import IMPL_HELP, Impl
from cpbench.config.inference import STEP_OPTIONS, InferenceStep, Workload
from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.config.vocabulary import (
    CACHE_LAYOUTS,
    PREFILL_SCHEMES,
    Backend,
    CacheLayout,
    CliDevice,
    CpComm,
    CpCommChoice,
    Dtype,
    Layout,
    Phase,
    PrefillScheme,
    ScenarioPhase,
    Split,
)


@cache
def _module_classes(module: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of a module's source, by name (each module parsed once)."""
    tree = ast.parse(inspect.getsource(sys.modules[module]))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under the fields of `cls` (its own, not its bases')."""
    node = _module_classes(cls.__module__)[cls.__name__]
    docs: dict[str, str] = {}
    for field, doc in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            docs[field.target.id] = doc.value.value
    return docs


def field_help(cls: type, name: str) -> str:
    """The docstring of field `name` of dataclass `cls` (or the nearest base that documents it),
    as one line of help: code references such as (`LAYOUTS`) left out."""
    for klass in cls.__mro__:
        doc = _attribute_docs(klass).get(name) if dataclasses.is_dataclass(klass) else None
        if doc is not None:
            text = re.sub(r" ?\(`[^`]*`\)|`[^`]*`; ", "", " ".join(doc.split()))
            return text.replace("`", "")
    raise KeyError(f"{cls.__name__}.{name} has no docstring")


DEFAULTS: Mapping[str, Any] = {
    f.name: f.default
    for f in dataclasses.fields(BenchConfig)
    if f.default is not dataclasses.MISSING
}
"""The defaults of a benchmark point's fields (batch, dtype, causal, ulysses, ring, layout,
cp_comm, phase, kernel, impl, ...): the default of each option that is one of them."""
DEFAULT_DEVICE: CliDevice = "auto"
"""`--device`'s default: cuda when torch sees a GPU, else cpu."""
DEFAULT_SCHEME: PrefillScheme = PREFILL_SCHEMES[0]
DEFAULT_CACHE_LAYOUT: CacheLayout = CACHE_LAYOUTS[0]


def _option(*decls: str, help: str, **kwargs: Any) -> Any:  # noqa: A002 - typer's name
    """The one declaration of an option (also registered in `OPTIONS` by its first flag)."""
    info = typer.Option(*decls, help=help, **kwargs)
    name = next(d for d in decls if d.startswith("--")).split("/")[0]
    assert name not in OPTIONS, f"{name} declared twice"
    OPTIONS[name] = info
    return info


OPTIONS: dict[str, OptionInfo] = {}
"""Every option's declaration by its first flag (`--seq-len`)."""

# ---------------------------------------------------------------- the attention problem

SEQ_LEN = _option("--seq-len", help=field_help(CpProblem, "seq_len"))
SeqLen = Annotated[int, SEQ_LEN]
SeqLenOrNone = Annotated[int | None, SEQ_LEN]
SeqLens = Annotated[list[int] | None, SEQ_LEN]
Batch = Annotated[int, _option("--batch", help=field_help(CpProblem, "batch"))]
HEADS = _option("--heads", help=field_help(CpProblem, "heads"))
Heads = Annotated[int, HEADS]
HeadsOrNone = Annotated[int | None, HEADS]
KV_HEADS = _option("--kv-heads", help=field_help(CpProblem, "kv_heads"))
KvHeads = Annotated[int, KV_HEADS]
KvHeadsOrNone = Annotated[int | None, KV_HEADS]
HEAD_DIM = _option("--head-dim", help=field_help(CpProblem, "head_dim"))
HeadDim = Annotated[int, HEAD_DIM]
HeadDimOrNone = Annotated[int | None, HEAD_DIM]
DTYPE = _option(
    "--dtype",
    help="Element type of Q, K, V, the output and the exchanges (recommend and plan also take "
    "bf16, fp16, fp32).",
)
DtypeName = Annotated[str, DTYPE]
DtypeChoice = Annotated[Dtype, DTYPE]
DtypeOrNone = Annotated[Dtype | None, DTYPE]
Dtypes = Annotated[list[str] | None, DTYPE]
Causal = Annotated[bool, _option("--causal/--no-causal", help=field_help(CpProblem, "causal"))]
Documents = Annotated[str | None, _option(
    "--documents",
    help=field_help(CpProblem, "documents")
    + " Given as lengths (512,1024,...), a file of lengths (JSON list or one per line) or a "
    "distribution (lognormal:mean=1024,max=8192, powerlaw:alpha=1.5,min=64, "
    "uniform:min=64,max=4096; drawn with --seed) packed into --seq-len.",
)]
Lengths = Annotated[str | None, _option(
    "--lengths",
    help="recommend: dynamic CP for a batch of whole sequences of these lengths (a "
    "distribution such as lognormal:mean=1024,sigma=1.5,min=128,max=8192 drawn with --seed to "
    "--step-tokens, a file: one per line, a JSON list or a CSV length column, or 512,9000,...): "
    "static CP, Megatron's dynamic-CP rule and cpbench's scheduler ranked by predicted step "
    "(docs/dynamic-cp.md). plan: documents of these lengths packed into each --seq-len "
    "sequence, attention priced under their document mask.",
)]
TokensPerRank = Annotated[int, _option(
    "--tokens-per-rank",
    help="--lengths: the most tokens a GPU holds in a micro-batch (Megatron's "
    "--max-seqlen-per-dp-cp-rank); a sequence of s tokens needs ceil(s / this) GPUs.",
)]
StaticCp = Annotated[int | None, _option(
    "--static-cp",
    help="--lengths: the static policy's CP degree (default: the power of two holding the "
    "longest sequence).",
)]
StepTokens = Annotated[int | None, _option(
    "--step-tokens",
    help="--lengths: the step's token budget, what a distribution is drawn to and a file read "
    "to (default: 8 micro-batches of --gpus x --tokens-per-rank).",
)]
WindowOption = Annotated[int | None, _option("--window", help=field_help(CpProblem, "window"))]
Ulysses = Annotated[int, _option("--ulysses", help=field_help(CpProblem, "ulysses"))]
Ring = Annotated[int, _option("--ring", help=field_help(CpProblem, "ring"))]
LAYOUT = _option("--layout", help=field_help(MeshCandidate, "layout"))
LayoutChoice = Annotated[Layout, LAYOUT]
Layouts = Annotated[list[str] | None, LAYOUT]
CP_COMM = _option(
    "--cp-comm",
    help=field_help(CpProblem, "cp_comm")
    + " both: each ring-axis candidate (recommend) or case (verify) both ways; recommend's "
    "default: both, or with --results the ways the results measured.",
)
CpCommOne = Annotated[CpComm, CP_COMM]
CpCommBoth = Annotated[CpCommChoice, CP_COMM]
CpCommOrNone = Annotated[CpCommChoice | None, CP_COMM]
HEADS_K_STRIDE = _option("--heads-k-stride", help=field_help(CpProblem, "heads_k_stride"))
HeadsKStride = Annotated[int | None, HEADS_K_STRIDE]

# ---------------------------------------------------------------- the step

PHASE = _option(
    "--phase",
    help=field_help(MeshCandidate, "phase")
    + " run also takes prefill or decode: an inference step of --new-tokens on --cached-len "
    "cached tokens on ulysses x ring ranks, the mesh its scheme's.",
)
PhaseChoice = Annotated[Phase, PHASE]
StepPhase = Annotated[ScenarioPhase, PHASE]
KERNEL = _option(
    "--kernel",
    "--backend",
    help=field_help(BenchConfig, "kernel")
    + " recommend and plan price the kernel families too (flash_attn3, cudnn, ...); "
    "--backend: the old name.",
)
KernelName = Annotated[str, KERNEL]
KernelChoice = Annotated[Backend, KERNEL]
IMPL = _option(
    "--impl",
    help=field_help(BenchConfig, "impl").rstrip(".")
    + ": "
    + "; ".join(f"{name}: {text}" for name, text in IMPL_HELP.items())
    + ". External libraries are optional extras (cpbench[ring], [usp], [te]); verify lists the "
    "cases one cannot run as skipped.",
)
ImplChoice = Annotated[Impl, IMPL]
Impls = Annotated[list[str] | None, IMPL]
CachedLen = Annotated[int, _option("--cached-len", help=field_help(InferenceStep, "cached_len"))]
NEW_TOKENS = _option("--new-tokens", help=field_help(InferenceStep, "new_tokens"))
NewTokens = Annotated[int | None, NEW_TOKENS]
SCHEME = _option("--scheme", help=field_help(InferenceStep, "scheme"))
SchemeOption = Annotated[PrefillScheme, SCHEME]
CACHE_LAYOUT = _option("--cache-layout", help=field_help(InferenceStep, "cache_layout"))
CacheLayoutChoice = Annotated[CacheLayout, CACHE_LAYOUT]
Inference = Annotated[bool, _option(
    "--inference/--no-inference",
    help="Inference instead of training. recommend ranks a serving request: prefill schemes "
    "(pass-KV, pass-Q, all-gather, Ulysses) and CP degrees by TTFT, or with --decode-batch the "
    "sharded-cache decode by per-token latency; the pass-KV / pass-Q crossover, KV capacity, "
    "vLLM / SGLang settings. verify also checks prefill with a cached prefix (P = 0, T = 1, "
    "uneven shards, GQA) and decode steps of 1-8 tokens over contiguous and interleaved KV "
    "caches: outputs against the float64 reference, bytes sent against the analytic model.",
)]
PromptLen = Annotated[int | None, _option(
    "--prompt-len", help="--inference: new tokens T of the turn (the prompt, or its new part)."
)]
DecodeBatch = Annotated[int | None, _option(
    "--decode-batch",
    help="--inference: rank the decode step of this many sequences, each with P + T cached "
    "tokens, instead of the prefill.",
)]
LAYERS = _option("--layers", help="--inference: attention layers (KV capacity; tokens/s).")
Layers = Annotated[int | None, LAYERS]
KvMemoryGib = Annotated[float | None, _option(
    "--kv-memory-gib",
    help="--inference: GiB per GPU the KV cache may use (default: the device memory).",
)]

# ---------------------------------------------------------------- where and how it runs

DEVICE = _option("--device", help="Where the ranks run: cpu (gloo), cuda (nccl) or auto (cuda "
                 "when torch sees a GPU).")  # fmt: skip
DeviceOption = Annotated[CliDevice, DEVICE]
WORLD_SIZE = _option(
    "--world-size",
    help="Ranks (GPUs, or CPU processes). Default: sweep the scenario's; verify every GPU, 4 on "
    "CPU, the launched world under torchrun; efficiency 2 and 4 (repeat for several).",
)
WorldSizeOption = Annotated[int, WORLD_SIZE]
WorldSizeOrNone = Annotated[int | None, WORLD_SIZE]
WorldSizes = Annotated[list[int] | None, WORLD_SIZE]
Threads = Annotated[int, _option("--threads", help="CPU threads per rank.")]
WARMUP = _option("--warmup", help="Untimed steps first (of each case, in efficiency).")
Warmup = Annotated[int, WARMUP]
Iters = Annotated[int, _option("--iters", help="Timed iterations at least.")]
Rounds = Annotated[int, _option("--rounds", help="Interleaved timed rounds (best-of-N).")]
BUDGET = _option("--budget", help="Seconds of measurement (rank start-up excluded).")
Budget = Annotated[float, BUDGET]
BudgetOrNone = Annotated[float | None, BUDGET]
TIMEOUT = _option(
    "--timeout",
    help="Seconds before a configuration (sweep, run; sweep's default: the scenario's) or one "
    "pool task (efficiency) is abandoned.",
)
Timeout = Annotated[float, TIMEOUT]
TimeoutOrNone = Annotated[float | None, TIMEOUT]
PrecisionOption = Annotated[str | None, _option(
    "--precision",
    help="Target relative width of each median's 95% interval, e.g. 0.05 (5%), or 'off' for a "
    "fixed count of iters (default: the scenario's, 0.05).",
)]
RESUME = _option("--resume/--no-resume", help="Skip configurations already in --out.")
Resume = Annotated[bool, RESUME]
Yes = Annotated[bool, _option(
    "--yes",
    "-y",
    help="Start without asking: a sweep run from a terminal asks before more than 1,000 "
    "configurations (a run outside a terminal never asks).",
)]
SeparateTies = Annotated[bool, _option(
    "--separate-ties",
    help="Re-measure the tied leaders of each group interleaved (A B A B) to separate them; a "
    "group's records are written when its block of points ends.",
)]
Masks = Annotated[bool, _option(
    "--masks/--no-masks",
    help="Also check the packed-document and sliding-window masks (every scheme x layout x "
    "mask x GQA case; --no-masks: causal and full only).",
)]
Profile = Annotated[bool, _option(
    "--profile",
    help="Instead: profile --rounds steps of a ring case and of a Ulysses case (first world "
    "size and dtype) with torch.profiler and show each one's median step.",
)]

# ---------------------------------------------------------------- files and output

JSON = _option("--json", help="One JSON document on stdout instead of the tables.")
Json = Annotated[bool, JSON]
Out = Annotated[Path | None, _option(
    "--out",
    help="JSONL results file to write (sweep's default: results/<name>-<time>.jsonl); "
    "efficiency also writes its JSON document there.",
)]
OUTPUT = _option(
    "-o",
    "--output",
    help="File to write: the fitted or probed profile (TOML), the report page (HTML, parent "
    "folders created).",
)
Output = Annotated[str, OUTPUT]
OutputOrNone = Annotated[str | None, OUTPUT]
Name = Annotated[str | None, _option(
    "--name",
    help="Name of the written profile (default: PRIOR-calibrated, PRIOR-probe).",
)]
Title = Annotated[str | None, _option("--title", help="Page title (default: the scenario names).")]
Open = Annotated[bool, _option("--open", help="Open the written page in the default web browser.")]
Results = Annotated[list[str] | None, _option(
    "--results",
    help="JSONL results of `cpbench sweep` (repeatable): calibrate the profile on them; "
    "configurations they measured are ranked by measurement.",
)]
WriteScenario = Annotated[str | None, _option(
    "--write-scenario",
    metavar="PATH",
    help="Write a scenario TOML for `cpbench sweep` that measures exactly the tied leaders at "
    "this shape (a clear winner: it and the runner-up).",
)]
OracleOrNone = Annotated[Path | None, _option(
    "--oracle",
    metavar="FILE",
    help="Replay instead of measuring: each candidate's step time is this file's row for it "
    "(a cpbench results JSONL, or a CSV in the columns of cpbench/data/published/*.csv).",
)]
MaxRuns = Annotated[int | None, _option("--max-runs", help="Measure at most this many candidates.")]
Explain = Annotated[bool, _option(
    "--explain",
    help="Every column, the full explanation and each framework's caveats (default: what fits "
    "one screen).",
)]
Compare = Annotated[bool, _option(
    "--compare",
    help="Compare exactly two files, BEFORE AFTER: the change per configuration (matched by "
    "record id) as a table and a bar chart.",
)]
Threshold = Annotated[float, _option(
    "--threshold",
    help="A configuration significantly slower (95% intervals apart) by more than this "
    "relative change at the medians is a regression: exit 1.",
)]

# ---------------------------------------------------------------- the machine and the model

Hardware = Annotated[str | None, _option(
    "--hardware",
    help="Hardware profile: a built-in name (h100-sxm, h200-sxm, a100-80gb, l40s-pcie, "
    "cpu-local) or a TOML file (e.g. written by `cpbench calibrate` or `cpbench probe`). "
    "Default: h100-sxm, cpu-local for CPU results; report: inferred from the records' device "
    "names; probe: the built-in profile matching the device, whose measured numbers it replaces.",
)]
Gpus = Annotated[int, _option("--gpus", help="GPUs in total (the world size).")]
GpusPerNode = Annotated[int | None, _option(
    "--gpus-per-node", help="GPUs per node (default: the hardware profile's, 8 for GPUs)."
)]
TP = _option("--tp", help="Tensor-parallel size (splits the heads first; plan: default search).")
Tp = Annotated[int, TP]
TpOrNone = Annotated[int | None, TP]
PP = _option("--pp", help="Pipeline-parallel size (plan: default search).")
Pp = Annotated[int, PP]
PpOrNone = Annotated[int | None, PP]
CP = _option(
    "--cp",
    help="Context-parallel size U x R (recommend's default: gpus / (TP x PP), DP = 1; plan: "
    "default search).",
)
CpOrNone = Annotated[int | None, CP]
GradAccum = Annotated[int, _option(
    "--grad-accum", help="Micro-batches per optimizer step (global batch formula)."
)]
Top = Annotated[int, _option(
    "--top",
    help="Candidates (recommend), or plans and memory rejections (plan), to rank and list; 0 = "
    "all (plan then prices every plan that fits, which takes minutes past a few hundred GPUs).",
)]
Seed = Annotated[int, _option(
    "--seed", help="Seed of the random draws: the inputs, a --documents distribution, the "
    "holdout split.",
)]  # fmt: skip
MODEL = _option(
    "--model",
    help="Model: a preset (llama3-8b, llama3-70b, llama3.1-405b, qwen2.5-7b, qwen2.5-72b, "
    "mistral-7b), a model TOML of the same keys, or a Hugging Face config.json (read "
    "offline); report adds its whole-model plan at --seq-len (default 131072) on --gpus.",
)
Model = Annotated[str, MODEL]
ModelOrNone = Annotated[str | None, MODEL]
RecomputeOption = Annotated[str | None, _option(
    "--recompute", help="Activation recompute: none, selective or full (default: search them)."
)]
Zero = Annotated[int, _option(
    "--zero",
    help="ZeRO stage over DP x CP: 0, 1 (Megatron's distributed optimizer), 2, 3 (FSDP).",
)]
MicroBatch = Annotated[int, _option("--micro-batch", help="Sequences per micro-batch.")]
GlobalBatch = Annotated[int | None, _option(
    "--global-batch", help="Sequences per optimizer step (default: one per GPU)."
)]
MatmulEfficiencyOption = Annotated[float | None, _option(
    "--matmul-efficiency",
    help="GEMM efficiency (achieved / peak) instead of the profile's estimate.",
)]
ReserveGib = Annotated[float | None, _option(
    "--reserve-gib", help="Memory kept free per GPU, GiB (default: 2 on a GPU, 0 on CPU)."
)]
FrameworkOption = Annotated[str, _option(
    "--framework",
    help="Price the attention the framework runs: cpbench (own schemes), torchtitan (PyTorch "
    "context_parallel: ring, all-gather K/V, SDPA), megatron (TransformerEngine: p2p / a2a / "
    "a2a+p2p, cuDNN), deepspeed (Ulysses).",
)]
AttentionFactor = Annotated[float | None, _option(
    "--attention-factor",
    help="Measured attention time of the framework / the cost model's (from a `cpbench sweep` "
    "over the impl axis); default: the framework's prior.",
)]
Linears = Annotated[str, _option(
    "--linears",
    help="Precision of the linear layers: bf16 or fp8 (attention stays in --dtype).",
)]
FabricOption = Annotated[str | None, _option(
    "--fabric",
    help="How the nodes are wired: hgx-rail (8-GPU nodes, 400 Gb/s per GPU, rail-optimised), "
    "roce-clos (not rail-optimised), nvl72 (72-GPU NVLink domains); default: the hardware "
    "profile's inter-node link.",
)]
MemoryMarginOption = Annotated[str, _option(
    "--memory-margin",
    help="What a plan must fit: capacity (tensors + --reserve-gib within the device memory) or "
    "safe (tensors within 80% of it: Fujii et al. 2024 saw no OOM below that over 454 runs).",
)]
MaxSeqLen = Annotated[bool, _option(
    "--max-seq-len",
    help="Rank the plans by the longest sequence each holds under the safe margin (then by "
    "step time) instead of by step time.",
)]
Exhaustive = Annotated[bool, _option(
    "--exhaustive/--no-exhaustive",
    help="Price every plan that fits instead of pruning the ones whose lower bound cannot rank "
    "(the same answer, slower; for checking).",
)]

# ---------------------------------------------------------------- validation

Holdout = Annotated[bool, _option(
    "--holdout", help="Calibrate on part of the configurations, predict the held-out rest."
)]
HoldoutFraction = Annotated[float, _option(
    "--holdout-fraction",
    help="Share of the configurations held out (a value other than 0.5 implies --holdout).",
)]
SPLIT = _option("--split", help="Holdout split: stratified by U x R mesh, or random.")
SplitChoice = Annotated[Split, SPLIT]
CalibrateFirst = Annotated[bool, _option(
    "--calibrate", help="Calibrate on all the results first (in-sample check of the fit)."
)]
Published = Annotated[bool, _option(
    "--published",
    help="Score the model on the shipped published measurements (per machine: the prior alone "
    "and leave-one-group-out calibrated; sources per row).",
)]

# ---------------------------------------------------------------- the program


def _print_version(value: bool) -> None:
    if value:
        from cpbench import __version__  # noqa: PLC0415

        print(f"cpbench {__version__}")
        raise typer.Exit(0)


Version = Annotated[bool, _option(
    "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
)]

# ---------------------------------------------------------------- the step kind's options


def flag(name: str, default: object) -> str:
    """How option `name` (a parameter's name) given a value other than its `default` is
    spelled: --seq-len, --no-causal."""
    info = OPTIONS["--" + name.replace("_", "-")]
    # typer.Option's first argument is its default: under `Annotated` typer reads it as a flag
    first = info.default if isinstance(info.default, str) else (info.param_decls or ("",))[0]
    decls = first.split("/")
    return decls[-1] if default is True and len(decls) > 1 else decls[0]


def other_kind_given(
    command: Callable[..., Any], values: Mapping[str, object], kind: Workload,
    also: tuple[str, ...] = (),
) -> list[str]:  # fmt: skip
    """The flags of `command`'s options of the other kind of step than `kind` (`STEP_OPTIONS`,
    and `also` for a training step's options) that `values` gives a value of their own (not
    the default), in the command's order: options a step of `kind` has no use for."""
    other = STEP_OPTIONS["inference" if kind == "training" else "training"]
    other += also if kind == "inference" else ()
    given = []
    for name, parameter in inspect.signature(command).parameters.items():
        value = values[name]
        if name in other and value != parameter.default and value not in ([], ()):
            given.append(flag(name, parameter.default))
    return given


# ------------------------------------------- length distributions in serving (issue 37, item 4)

PromptLens = Annotated[str | None, _option(
    "--prompt-lens",
    help="--inference: a distribution of request prompt lengths (lognormal:mean=4096,sigma=1.5,"
    "min=128,max=65536 drawn with --seed, a file of lengths, or 512,9000,...): the serving "
    "policy giving each request the CP degree of the least predicted TTFT, against static CP "
    "and no CP (docs/dynamic-cp.md).",
)]
