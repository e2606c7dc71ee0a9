"""Scenarios: TOML files that describe a sweep, and the benchmark points they expand to.

A scenario holds run settings (world size, device, warm-up, iterations, timeout) and an `[axes]`
table; `Scenario.expand` takes the product of the axes and pairs every point (`BenchConfig`)
with its `Feasibility`. Infeasible points are kept: the sweep records them as `skipped` with the
rule that rejects them. Mistakes in the file itself (unknown keys, wrong types, a mesh that does
not multiply to the world size) raise `CpbenchError` naming the file, the key and the rule.

```toml
name = "example"
world_size = 4              # or "auto": all local GPUs on cuda, 4 ranks on cpu
device = "cpu"              # auto | cpu | cuda

[axes]
seq_len = [1024, 2048]
heads = 8
kv_heads = [8, 2]           # or gqa_ratio = [1, 4]
head_dim = 64
mesh = "all"                # or ["4x1", "2x2"] or [[4, 1], [2, 2]]
layout = ["zigzag", "contiguous"]
impl = ["cpbench", "torch_cp"]   # optional: external implementations (cpbench.impls)
```

Pure Python (no torch), so the CLI can list and validate scenarios without importing torch.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from cpbench.config.bench import BenchConfig, _check_positive_int, _is_int, factorizations
from cpbench.config.constraints import Feasibility
from cpbench.config.impls import DEFAULT_IMPL, IMPLS
from cpbench.config.vocabulary import (
    BACKENDS,
    DEFAULT_DTYPE,
    DEVICES,
    DTYPES,
    LAYOUTS,
    PHASES,
    SCENARIO_DEVICES,
    Backend,
    Device,
    Dtype,
    Layout,
    Phase,
    ScenarioDevice,
)
from cpbench.errors import CpbenchError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

BUILTIN = "<builtin>"
"""`Scenario.source` of a scenario shipped inside the package (`cpbench/data/*.toml`)."""
CPU_WORLD_SIZE = 4
"""Ranks that `world_size = "auto"` gives on the CPU (gloo)."""

TOP_LEVEL_KEYS: tuple[str, ...] = (
    "name",
    "description",
    "world_size",
    "device",
    "warmup",
    "iters",
    "timeout",
    "check_max_seq_len",
    "nodes",
    "axes",
)
AXIS_KEYS: tuple[str, ...] = (
    "seq_len",
    "batch",
    "heads",
    "kv_heads",
    "gqa_ratio",
    "head_dim",
    "dtype",
    "causal",
    "mesh",
    "layout",
    "kv_replication",
    "backend",
    "phase",
    "impl",
)
_MESH_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


# --------------------------------------------------------------------------------------------
# Scenario
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A sweep: run settings and the axes whose product gives the benchmark points."""

    name: str
    """Short name, used in results records and file names."""
    description: str
    """One or two sentences: what the sweep studies."""
    source: str
    """File the scenario came from, or "<builtin>" for one shipped in the package."""
    world_size: int | Literal["auto"]
    """Ranks; "auto" = all local GPUs on cuda, 4 on cpu (see `resolve`)."""
    device: ScenarioDevice
    """cpu, cuda, or auto (cuda when a GPU is visible)."""
    warmup: int
    """Untimed iterations before timing (>= 0)."""
    iters: int
    """Timed iterations (>= 1)."""
    timeout: float
    """Seconds one configuration may take before it is recorded as `timeout`."""
    check_max_seq_len: int
    """The reference check runs at min(seq_len, this), rounded down to a valid multiple."""
    nodes: int
    """Hosts the ranks span (torchrun --nnodes); world_size must be a multiple of it."""
    seq_len: tuple[int, ...]
    """Axis: global sequence lengths."""
    batch: tuple[int, ...]
    """Axis: batch sizes."""
    heads: tuple[int, ...]
    """Axis: query heads."""
    kv_heads: tuple[int, ...] | None
    """Axis: KV heads; None when gqa_ratio is given instead."""
    gqa_ratio: tuple[int, ...] | None
    """Axis: query heads per KV head (kv_heads = heads // ratio); None when kv_heads is given."""
    head_dim: tuple[int, ...]
    """Axis: channels per head."""
    dtype: tuple[Dtype, ...] | None
    """Axis: element types; None = float32 on cpu, bfloat16 on cuda."""
    causal: tuple[bool, ...]
    """Axis: causal mask or not."""
    mesh: tuple[tuple[int, int], ...] | Literal["all"]
    """Axis: (U, R) pairs, or "all" = every factorisation of the world size."""
    layout: tuple[Layout, ...]
    """Axis: sequence layouts."""
    kv_replication: tuple[int | None, ...]
    """Axis: KV replication requested (None = automatic, 1 = off)."""
    backend: tuple[Backend, ...]
    """Axis: local attention kernels."""
    phase: tuple[Phase, ...]
    """Axis: timed phases."""
    impl: tuple[str, ...] = (DEFAULT_IMPL,)
    """Axis: implementations (cpbench's own and external libraries, `cpbench.impls`)."""

    def resolve(self, device: str = "auto", gpu_count: int = 0) -> tuple[Device, int]:
        """The device and world size to run with.

        `device` is the command line's choice ("auto" defers to the scenario's own, and an
        "auto" there means cuda when `gpu_count` > 0). A world size of "auto" is `gpu_count`
        on cuda and 4 on cpu. Whether the node has enough GPUs is left to the caller (under
        torchrun the ranks span several nodes)."""
        if device not in SCENARIO_DEVICES:
            raise CpbenchError(f"device {device!r} is not one of {', '.join(SCENARIO_DEVICES)}")
        chosen = device if device != "auto" else self.device
        if chosen == "auto":
            chosen = "cuda" if gpu_count > 0 else "cpu"
        if chosen == "cuda" and gpu_count <= 0:
            raise CpbenchError(f"{self.source}: device 'cuda' requested but no GPU is visible")
        if self.world_size != "auto":
            world = self.world_size
        else:
            world = gpu_count if chosen == "cuda" else CPU_WORLD_SIZE
        return chosen, world  # type: ignore[return-value]

    def meshes(self, world_size: int) -> list[tuple[int, int]]:
        """The (U, R) pairs of the mesh axis for a world size; raises if one does not fit."""
        if self.mesh == "all":
            return factorizations(world_size)
        for u, r in self.mesh:
            if u * r != world_size:
                raise CpbenchError(
                    f"{self.source}: key 'mesh': \"{u}x{r}\" gives ulysses ({u}) x ring ({r}) "
                    f"= {u * r} != world_size ({world_size})"
                )
        return list(self.mesh)

    def expand(self, device: str, world_size: int) -> list[tuple[BenchConfig, Feasibility]]:
        """Every point of the axes' product, in a fixed order (mesh varies fastest, the impl
        next), each with its feasibility; infeasible points are kept. The feasibility is
        cpbench's mesh and shape rules; what an external impl supports on top of them is
        checked when the sweep runs (`cpbench.impls.skip_reason`).

        `world_size` is normally the one `resolve` gives; a different one (a command-line
        override) is accepted as long as every listed mesh multiplies to it."""
        if device not in DEVICES:
            raise CpbenchError(f"device {device!r} is not one of {', '.join(DEVICES)}")
        _check_positive_int("world_size", world_size)
        meshes = self.meshes(world_size)
        dtypes = self.dtype if self.dtype is not None else (DEFAULT_DTYPE[device],)
        head_pairs = [
            (h, kv)
            for h in self.heads
            for kv in (
                self.kv_heads if self.kv_heads is not None else [h // g for g in self.gqa_ratio]  # type: ignore[union-attr]
            )
        ]
        out = []
        for (
            seq_len,
            batch,
            (heads, kv_heads),
            head_dim,
            dtype,
            causal,
            layout,
            kv_replication,
            backend,
            phase,
            impl,
            (ulysses, ring),
        ) in itertools.product(
            self.seq_len,
            self.batch,
            head_pairs,
            self.head_dim,
            dtypes,
            self.causal,
            self.layout,
            self.kv_replication,
            self.backend,
            self.phase,
            self.impl,
            meshes,
        ):
            config = BenchConfig(
                seq_len=seq_len,
                batch=batch,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                dtype=dtype,
                causal=causal,
                ulysses=ulysses,
                ring=ring,
                layout=layout,
                kv_replication=kv_replication,
                backend=backend,
                phase=phase,
                device=device,  # type: ignore[arg-type]
                world_size=world_size,
                nodes=self.nodes,
                impl=impl,
            )
            out.append((config, config.feasibility()))
        return out


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


class _Reader:
    """Validates values of one file, with messages `<file>: key '<key>': <value> <rule>`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, message: str) -> CpbenchError:
        return CpbenchError(f"{self.source}: key '{key}': {message}")

    def int_(self, key: str, value: object, minimum: int = 1) -> int:
        if not _is_int(value):
            raise self.error(key, f"{value!r} is not an integer")
        if value < minimum:  # type: ignore[operator]
            rule = "positive" if minimum == 1 else f">= {minimum}"
            raise self.error(key, f"{value!r} must be {rule}")
        return value  # type: ignore[return-value]

    def str_(self, key: str, value: object) -> str:
        if not isinstance(value, str):
            raise self.error(key, f"{value!r} is not a string")
        return value

    def choice(self, key: str, value: object, allowed: Iterable[str]) -> str:
        allowed = tuple(allowed)
        if not isinstance(value, str) or value not in allowed:
            raise self.error(key, f"{value!r} is not one of {', '.join(allowed)}")
        return value

    def bool_(self, key: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, f"{value!r} is not true or false")
        return value

    def axis(self, key: str, value: object, item: Callable[[str, object], Any]) -> tuple:
        """A list of values (a scalar means a list of one), each read by `item`; no repeats."""
        values = value if isinstance(value, list) else [value]
        if not values:
            raise self.error(key, "the list is empty; give at least one value")
        parsed = tuple(item(key, v) for v in values)
        for i, v in enumerate(parsed):
            if v in parsed[:i]:
                raise self.error(key, f"{values[i]!r} is repeated in {values!r}")
        return parsed

    def mesh_entry(self, key: str, value: object) -> tuple[int, int]:
        if isinstance(value, str):
            match = _MESH_RE.match(value)
            if not match:
                raise self.error(
                    key, f'"{value}" is not a mesh; write "UxR" such as "4x2", or [4, 2]'
                )
            pair: list[object] = [int(match.group(1)), int(match.group(2))]
        elif isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value):
            pair = value
        else:
            raise self.error(
                key,
                f'{value!r} is not a mesh; write "UxR" such as "4x2", [4, 2], or "all"',
            )
        u, r = pair
        if u <= 0 or r <= 0:  # type: ignore[operator]
            raise self.error(key, f"{value!r}: ulysses and ring degrees must be positive")
        return u, r  # type: ignore[return-value]

    def kv_replication(self, key: str, value: object) -> int | None:
        if value == "auto":
            return None
        if value == "off":
            return 1
        if _is_int(value) and value >= 1:  # type: ignore[operator]
            return value  # type: ignore[return-value]
        raise self.error(key, f'{value!r} is not "auto", "off" or a positive integer')


def parse_scenario(data: dict, source: str) -> Scenario:
    """Build and validate a scenario from a parsed TOML document; `source` names the file in
    error messages."""
    if not isinstance(data, dict):
        raise CpbenchError(f"{source}: expected a TOML table, got {type(data).__name__}")
    rd = _Reader(source)
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            hint = " (axis keys go in the [axes] table)" if key in AXIS_KEYS else ""
            raise CpbenchError(
                f"{source}: unknown key {key!r}{hint}; allowed keys: {', '.join(TOP_LEVEL_KEYS)}"
            )
    axes = data.get("axes")
    if axes is None:
        raise CpbenchError(f"{source}: missing the [axes] table (seq_len, heads, ...)")
    if not isinstance(axes, dict):
        raise rd.error("axes", f"{axes!r} is not a table; write an [axes] section")
    for key in axes:
        if key not in AXIS_KEYS:
            raise CpbenchError(
                f"{source}: unknown key {key!r} in [axes]; allowed keys: {', '.join(AXIS_KEYS)}"
            )
    for key in ("seq_len", "heads"):
        if key not in axes:
            raise CpbenchError(f"{source}: key '{key}' is required in [axes]")

    default_name = Path(source).stem if source != BUILTIN else "unnamed"
    name = rd.str_("name", data.get("name", default_name))
    if not name.strip():
        raise rd.error("name", "must not be empty")
    description = rd.str_("description", data.get("description", ""))
    world_size: int | Literal["auto"]
    raw_world = data.get("world_size", "auto")
    world_size = "auto" if raw_world == "auto" else rd.int_("world_size", raw_world)
    device = rd.choice("device", data.get("device", "auto"), SCENARIO_DEVICES)
    warmup = rd.int_("warmup", data.get("warmup", 3), minimum=0)
    iters = rd.int_("iters", data.get("iters", 10))
    timeout = data.get("timeout", 300)
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise rd.error("timeout", f"{timeout!r} must be a positive, finite number of seconds")
    check_max = rd.int_("check_max_seq_len", data.get("check_max_seq_len", 4096))
    nodes = rd.int_("nodes", data.get("nodes", 1))
    if nodes > 1 and world_size == "auto":
        raise rd.error("world_size", f'"auto" is for one node; with nodes = {nodes} give a number')
    if world_size != "auto" and world_size % nodes != 0:
        raise rd.error("world_size", f"{world_size} is not a multiple of nodes ({nodes})")

    def axis(key: str, default: object, item: Callable[[str, object], Any]) -> tuple:
        return rd.axis(key, axes.get(key, default), item)

    seq_len = axis("seq_len", None, rd.int_)
    batch = axis("batch", 1, rd.int_)
    heads = axis("heads", None, rd.int_)
    head_dim = axis("head_dim", 128, rd.int_)
    kv_heads: tuple[int, ...] | None = None
    gqa_ratio: tuple[int, ...] | None = None
    if "kv_heads" in axes and "gqa_ratio" in axes:
        raise CpbenchError(
            f"{source}: keys 'kv_heads' = {axes['kv_heads']!r} and 'gqa_ratio' = "
            f"{axes['gqa_ratio']!r} are both given; use exactly one of them"
        )
    if "gqa_ratio" in axes:
        gqa_ratio = axis("gqa_ratio", None, rd.int_)
        for g in gqa_ratio:
            for h in heads:
                if h % g:
                    raise rd.error("gqa_ratio", f"{g} does not divide heads ({h})")
    elif "kv_heads" not in axes:
        gqa_ratio = (1,)  # neither given: MHA, kv_heads = heads
    else:
        kv_heads = axis("kv_heads", None, rd.int_)
        for kv in kv_heads:
            for h in heads:
                if h % kv:
                    raise rd.error(
                        "kv_heads", f"{kv} does not divide heads ({h}): GQA groups must be even"
                    )
    dtype = axis("dtype", None, lambda k, v: rd.choice(k, v, DTYPES)) if "dtype" in axes else None
    causal = axis("causal", True, rd.bool_)
    raw_mesh = axes.get("mesh", "all")
    mesh: tuple[tuple[int, int], ...] | Literal["all"]
    if raw_mesh == "all":
        mesh = "all"
    else:
        mesh = rd.axis("mesh", raw_mesh, rd.mesh_entry)
    layout = axis("layout", "zigzag", lambda k, v: rd.choice(k, v, LAYOUTS))
    kv_replication = axis("kv_replication", "auto", rd.kv_replication)
    backend = axis("backend", "auto", lambda k, v: rd.choice(k, v, BACKENDS))
    phase = axis("phase", "fwd+bwd", lambda k, v: rd.choice(k, v, PHASES))
    impl = axis("impl", DEFAULT_IMPL, lambda k, v: rd.choice(k, v, IMPLS))

    scenario = Scenario(
        name=name,
        description=description,
        source=source,
        world_size=world_size,
        device=device,  # type: ignore[arg-type]
        warmup=warmup,
        iters=iters,
        timeout=float(timeout),
        check_max_seq_len=check_max,
        nodes=nodes,
        seq_len=seq_len,
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        gqa_ratio=gqa_ratio,
        head_dim=head_dim,
        dtype=dtype,
        causal=causal,
        mesh=mesh,
        layout=layout,
        kv_replication=kv_replication,
        backend=backend,
        phase=phase,
        impl=impl,
    )
    if world_size != "auto":
        scenario.meshes(world_size)  # a mesh that does not fit is an error in the file
    return scenario


def _builtin_dir() -> Any:
    return resources.files("cpbench") / "data"


def available_scenarios() -> list[str]:
    """Names `load_scenario` accepts: built-in ones, then those in ./scenarios."""
    names = sorted(
        p.name[: -len(".toml")] for p in _builtin_dir().iterdir() if p.name.endswith(".toml")
    )
    local = Path("scenarios")
    if local.is_dir():
        names += sorted(p.stem for p in local.glob("*.toml") if p.stem not in names)
    return names


def _parse_text(text: str, source: str) -> Scenario:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"{source}: invalid TOML: {exc}") from None
    return parse_scenario(data, source)


def load_scenario(name_or_path: str) -> Scenario:
    """Load a scenario from a .toml path, or by name: the package's built-in
    `cpbench/data/<name>.toml` first, then `scenarios/<name>.toml` under the current directory."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or "/" in name_or_path or path.is_file():
        if not path.is_file():
            raise CpbenchError(f"{name_or_path}: no such scenario file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CpbenchError(f"{name_or_path}: cannot read: {exc}") from None
        return _parse_text(text, name_or_path)
    builtin = _builtin_dir() / f"{name_or_path}.toml"
    if builtin.is_file():
        return _parse_text(builtin.read_text(encoding="utf-8"), BUILTIN)
    local = Path("scenarios") / f"{name_or_path}.toml"
    if local.is_file():
        return _parse_text(local.read_text(encoding="utf-8"), str(local))
    raise CpbenchError(
        f"unknown scenario {name_or_path!r}; available: {', '.join(available_scenarios())} "
        f"(or give a path to a .toml file)"
    )


def default_scenario(device: str) -> Scenario:
    """The built-in sweep for a machine: cpu-smoke on cpu, gpu-node on cuda."""
    if device not in DEVICES:
        raise CpbenchError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    return load_scenario("cpu-smoke" if device == "cpu" else "gpu-node")
