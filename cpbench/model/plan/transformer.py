"""A dense decoder-only transformer as the plan sees it: sizes, parameter counts, presets, and
loading from TOML or an offline Hugging Face `config.json`: docs/plan.md, "Models". Pure Python."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, ValidationError

from cpbench.config.file_schema import MESSAGE, RULE, FileModel, rule
from cpbench.config.problem import check_choice, check_positive_int
from cpbench.errors import CpbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FfnType = Literal["swiglu", "gelu"]
"""The MLP: swiglu (gate and up projections, SiLU(gate) * up, down projection: 3 matrices of
hidden x ffn_hidden) or gelu (up, GeLU, down: 2 matrices)."""
FFN_TYPES: tuple[FfnType, ...] = get_args(FfnType)


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer (pre-norm, RMSNorm or LayerNorm weights only)."""

    name: str
    """Short name, e.g. llama3-8b."""
    hidden: int
    """h: hidden size (model width)."""
    layers: int
    """Transformer layers."""
    heads: int
    """a: query heads."""
    kv_heads: int
    """a_kv: key/value heads (GQA when < heads)."""
    head_dim: int
    """d_h: channels per head (heads x head_dim may differ from hidden)."""
    ffn_hidden: int
    """f: MLP inner size (intermediate_size)."""
    ffn_type: FfnType
    """swiglu or gelu."""
    vocab: int
    """v: vocabulary size (rows of the embedding matrix)."""
    tied_embeddings: bool = False
    """Whether the output projection shares the embedding matrix."""
    qkv_bias: bool = False
    """Whether the Q/K/V projections have biases (Qwen2)."""
    dropout: bool = False
    """Whether attention and residual dropout are on (GPT-3-style training; the presets have
    none: their attention_dropout is 0.0). Dropout masks cost 1 byte per element."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab"):
            check_positive_int(f"model {self.name}: {key}", getattr(self, key))
        if self.heads % self.kv_heads:
            raise CpbenchError(
                f"model {self.name}: heads ({self.heads}) must be a multiple of kv_heads "
                f"({self.kv_heads}) (GQA groups query heads evenly over KV heads)"
            )
        check_choice(f"model {self.name}: ffn_type", self.ffn_type, FFN_TYPES)

    # ----------------------------------------------------------------------- parameters
    @property
    def q_width(self) -> int:
        """a x d_h: width of Q (and of the attention output)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """a_kv x d_h: width of K (and of V)."""
        return self.kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        """hidden x ffn_hidden matrices of the MLP: 3 (swiglu), 2 (gelu)."""
        return 3 if self.ffn_type == "swiglu" else 2

    @property
    def attention_weights(self) -> int:
        """Q/K/V and output projection matrices of one layer: h(a d_h + 2 a_kv d_h) + a d_h h."""
        return self.hidden * (self.q_width + 2 * self.kv_width) + self.q_width * self.hidden

    @property
    def attention_params(self) -> int:
        """`attention_weights` and the Q/K/V biases."""
        return self.attention_weights + (self.q_width + 2 * self.kv_width if self.qkv_bias else 0)

    @property
    def mlp_params(self) -> int:
        """MLP of one layer: 3 h f (swiglu) or 2 h f (gelu)."""
        return self.ffn_matrices * self.hidden * self.ffn_hidden

    @property
    def norm_params_per_layer(self) -> int:
        """The two norm weight vectors of one layer: 2 h."""
        return 2 * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer."""
        return self.attention_params + self.mlp_params + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        """The input embedding: v h."""
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection's own parameters: v h, or 0 when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """Every parameter: embedding + layers + final norm + output projection."""
        return (
            self.embedding_params
            + self.layers * self.layer_params
            + self.hidden
            + self.head_params
        )

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token (what 6N counts): the layers' linear
        weights and the output projection (v h, tied or not); not the embedding lookup, the
        norms or the biases."""
        return self.layers * (self.attention_weights + self.mlp_params) + self.vocab * self.hidden

    def describe(self) -> str:
        """One line: sizes and parameter count."""
        gqa = f", {self.kv_heads} KV heads" if self.kv_heads != self.heads else ""
        return (
            f"{self.name}: {self.total_params / 1e9:.2f} B parameters, {self.layers} layers, "
            f"hidden {self.hidden}, {self.heads} heads{gqa}, head dim {self.head_dim}, "
            f"{self.ffn_type} MLP {self.ffn_hidden}, vocab {self.vocab}"
            + (", tied embeddings" if self.tied_embeddings else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """The description as plain data (the keys a model TOML takes)."""
        return asdict(self)


# ------------------------------------------------------------------------------- loading

PositiveInt = Annotated[int, Field(gt=0), rule("must be a positive integer")]


class ModelFile(FileModel):
    """A model TOML: the keys of `ModelSpec` at the top level."""

    name: str = ""
    """Short name (default: the file's stem)."""
    hidden: PositiveInt
    """Hidden size."""
    layers: PositiveInt
    """Transformer layers."""
    heads: PositiveInt
    """Query heads."""
    kv_heads: PositiveInt | None = None
    """KV heads (default: heads, MHA)."""
    head_dim: PositiveInt | None = None
    """Channels per head (default: hidden / heads)."""
    ffn_hidden: PositiveInt
    """MLP inner size."""
    ffn_type: Annotated[FfnType, rule(f"must be one of {', '.join(FFN_TYPES)}")] = "swiglu"
    """swiglu or gelu."""
    vocab: PositiveInt
    """Vocabulary size."""
    tied_embeddings: Annotated[bool, rule("must be true or false")] = False
    """Output projection tied to the embedding."""
    qkv_bias: Annotated[bool, rule("must be true or false")] = False
    """Biases on Q/K/V."""
    dropout: Annotated[bool, rule("must be true or false")] = False
    """Attention and residual dropout on."""
    source: str = ""
    """Where the numbers come from."""


def _file_error(exc: ValidationError, origin: str) -> CpbenchError:
    error = exc.errors()[0]
    key = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = ", ".join(ModelFile.model_fields)
        text = f"is not a model key; allowed: {allowed}"
    elif kind == RULE:
        text = f"{ctx['rule']}, got {error['input']!r}"
    elif kind == MESSAGE:
        text = str(ctx["message"])
    elif kind == "missing":
        text = "is required"
    else:
        text = f"{error['msg']}, got {error['input']!r}"
    return CpbenchError(f"model file {origin}: {key} {text}")


def _default_head_dim(hidden: int, heads: int, origin: str) -> int:
    if hidden % heads:
        raise CpbenchError(
            f"model file {origin}: hidden ({hidden}) is not a multiple of heads ({heads}): "
            f"give head_dim"
        )
    return hidden // heads


def model_from_toml_dict(data: dict[str, Any], origin: str, stem: str = "model") -> ModelSpec:
    """A ModelSpec from a parsed model TOML; CpbenchError naming the key and the rule."""
    try:
        spec = ModelFile.model_validate(data)
    except ValidationError as exc:
        raise _file_error(exc, origin) from None
    return ModelSpec(
        **spec.model_dump(exclude={"name", "kv_heads", "head_dim", "source"}),
        name=spec.name or stem,
        kv_heads=spec.kv_heads or spec.heads,
        head_dim=spec.head_dim or _default_head_dim(spec.hidden, spec.heads, origin),
        source=spec.source or origin,
    )


class PresetsFile(FileModel):
    """`cpbench/data/models/presets.toml`: the shipped architectures and their other spellings."""

    aliases: dict[str, str]
    """Other spelling (matched case-insensitively) -> preset name."""
    models: dict[str, dict[str, Any]]
    """Preset name -> its model TOML table (`ModelFile`)."""


def _load_presets() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    origin = "cpbench/data/models/presets.toml"
    text = (resources.files("cpbench") / "data" / "models" / "presets.toml").read_text("utf-8")
    try:
        presets = PresetsFile.model_validate(tomllib.loads(text))
    except ValidationError as exc:
        raise _file_error(exc, origin) from None
    models = {name: model_from_toml_dict(t, origin, name) for name, t in presets.models.items()}
    return models, presets.aliases


PRESETS, ALIASES = _load_presets()
"""The shipped architectures by name, and other spellings of their names."""


GATED_ACTIVATIONS = ("silu", "swish", "swiglu")
"""`hidden_act` values of a gated (SwiGLU) MLP in Llama, Mistral and Qwen2 configs."""
HF_REQUIRED = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"
)


def model_from_hf_config(data: dict[str, Any], origin: str, stem: str = "model") -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json` dict (Llama, Mistral, Qwen2 layouts)."""
    missing = [k for k in HF_REQUIRED if k not in data]
    if missing:
        raise CpbenchError(
            f"Hugging Face config {origin} lacks {', '.join(missing)} (a decoder-only config "
            f"of the Llama / Mistral / Qwen2 layout expected)"
        )
    for key in (*HF_REQUIRED, "num_key_value_heads", "head_dim"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise CpbenchError(
                f"Hugging Face config {origin}: {key} must be a positive integer, got {value!r}"
            )
    hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
    act = str(data.get("hidden_act", "silu")).lower()
    architectures = [str(a) for a in data.get("architectures") or []]
    qwen2 = any(a.startswith("Qwen2") for a in architectures)
    return ModelSpec(
        name=str(data.get("_name_or_path") or stem),
        hidden=hidden,
        layers=int(data["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or _default_head_dim(hidden, heads, origin)),
        ffn_hidden=int(data["intermediate_size"]),
        ffn_type="swiglu" if act in GATED_ACTIVATIONS else "gelu",
        vocab=int(data["vocab_size"]),
        tied_embeddings=bool(data.get("tie_word_embeddings", True)),  # transformers' default
        qkv_bias=bool(data.get("attention_bias", qwen2)),
        dropout=float(data.get("attention_dropout", 0.0) or 0.0) > 0,
        source=f"Hugging Face config {origin}",
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name (case-insensitive, aliases accepted), a model TOML (`.toml`) or a Hugging
    Face `config.json` (any other file, parsed as JSON); CpbenchError naming the choices."""
    text = str(name_or_path).strip()
    key = text.lower()
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(text).expanduser()
    if not path.is_file():
        raise CpbenchError(
            f"model {text!r} is neither a preset ({', '.join(PRESETS)}) nor an existing file "
            f"(a model TOML or a Hugging Face config.json)"
        )
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CpbenchError(f"cannot read model file {path}: {exc}") from None
    stem = path.parent.name if path.name == "config.json" else path.stem
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(content)
        except tomllib.TOMLDecodeError as exc:
            raise CpbenchError(f"model file {path} is not valid TOML: {exc}") from None
        return model_from_toml_dict(data, str(path), stem)
    try:
        parsed = json.loads(content)
    except json.JSONDecodeError as exc:
        raise CpbenchError(f"model file {path} is not valid JSON ({exc}): a .toml model file or "
                           f"a Hugging Face config.json expected") from None
    if not isinstance(parsed, dict):
        raise CpbenchError(f"model file {path}: a JSON object expected, got {type(parsed).__name__}")
    return model_from_hf_config(parsed, str(path), stem)
