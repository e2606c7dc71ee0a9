"""Hardware profiles: what the cost model needs to know about a system. Pure Python.

A profile describes one kind of device and the two link tiers between devices:

- compute: peak dense TFLOP/s per dtype (vendor datasheet) and an attention-kernel efficiency
  curve over the kernel's sequence length (the `L/R` tokens of a ring shard that one kernel
  call works on): achieved attention FLOP/s = peak x efficiency(L/R);
- memory: capacity per device (HBM, or the share of RAM for a CPU rank) and its bandwidth
  (the ring's fp32 merges and gradient accumulations are memory-bound);
- links: `intra_node` (NVLink, PCIe, loopback) and `inter_node` (InfiniBand/RoCE per NIC), each
  with a latency and a bus bandwidth for all-to-all and for send/recv separately, in nccl-tests
  terms (`busbw`): an all-to-all call of `size` bytes over `n` ranks takes
  `latency + size*(n-1)/n / busbw` = `latency + bytes a rank sends / busbw`; a send/recv of a
  message of `size` bytes (each rank sends to its next and receives from its previous, the ring
  pattern of nccl-tests' sendrecv_perf) takes `latency + size / busbw`. `devices_per_nic`
  ranks share one inter-node NIC, so each gets `busbw / devices_per_nic` when all send at once;
- overheads: a fixed time per ring step and kernel call (launches, the online-softmax merge),
  and the overlap efficiency of a ring step (fraction of the shorter of compute and
  communication that is hidden behind the longer).

Built-in profiles are TOML files in `cpbench/data/hardware/`; every number carries its source.
A user file with the same layout is accepted wherever a name is (`--hardware PATH`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from cpbench.errors import CpbenchError
from cpbench.model.formulas import DTYPES, CollectiveKind, canonical_dtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LinkTier = Literal["intra_node", "inter_node"]
LINK_TIERS: tuple[str, ...] = get_args(LinkTier)
COLLECTIVE_KINDS: tuple[str, ...] = ("all_to_all", "send_recv")
PROFILE_SCHEMA_VERSION = 1
GIB = 1024**3
GB = 1e9
"""nccl-tests reports GB/s with GB = 1e9 bytes."""

_DATA_PACKAGE = "cpbench"
_DATA_FOLDER = ("data", "hardware")


# ------------------------------------------------------------------------------ dataclasses


@dataclass(frozen=True)
class LinkCost:
    """Latency and bus bandwidth of one collective kind on one link tier."""

    latency_s: float
    """alpha: fixed time per call (per ring exchange), seconds."""
    busbw: float
    """nccl-tests bus bandwidth, bytes/s (all-to-all: algbw x (n-1)/n; send/recv: algbw)."""
    source: str = ""
    """Where the numbers come from (datasheet, nccl-tests figure, estimate, calibration)."""

    def seconds(self, bytes_sent: float, calls: int = 1, sharing: int = 1) -> float:
        """Time of `calls` calls that send `bytes_sent` bytes per rank in all.

        `bytes_sent` excludes a rank's own all-to-all part (formulas.py's counting), which is
        exactly what busbw divides; `sharing` ranks share the link (a NIC), each getting
        `busbw / sharing`.
        """
        if calls <= 0 and bytes_sent <= 0:
            return 0.0
        return calls * self.latency_s + bytes_sent * sharing / self.busbw


@dataclass(frozen=True)
class LinkTierProfile:
    """One link tier: inside a node or across nodes."""

    tier: LinkTier
    """intra_node or inter_node."""
    name: str
    """The technology, e.g. 'NVLink 4 + NVSwitch' or 'InfiniBand NDR 400 Gb/s per NIC'."""
    all_to_all: LinkCost
    """Latency and busbw of an all-to-all on this tier."""
    send_recv: LinkCost
    """Latency and busbw of a ring send/recv on this tier."""
    devices_per_nic: int = 1
    """Ranks sharing one endpoint of the tier (a NIC across nodes; 1 inside a node)."""

    def cost(self, kind: CollectiveKind) -> LinkCost:
        """The LinkCost of a collective kind."""
        if kind == "all_to_all":
            return self.all_to_all
        if kind == "send_recv":
            return self.send_recv
        raise CpbenchError(f"collective kind {kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")

    def effective_busbw(self, kind: CollectiveKind) -> float:
        """Bytes/s one rank gets when every rank of the node uses the tier at once."""
        return self.cost(kind).busbw / self.devices_per_nic


@dataclass(frozen=True)
class EfficiencyCurve:
    """Attention-kernel efficiency (achieved / peak FLOP/s) over the kernel's sequence length.

    Interpolated linearly in log2(sequence length) between the points, constant outside them.
    """

    seq_lens: tuple[int, ...]
    """Kernel sequence lengths (L/R tokens of a ring shard), strictly increasing."""
    values: tuple[float, ...]
    """Efficiency at each length, in (0, 1]."""
    source: str = ""
    """Where the curve comes from."""

    def at(self, seq_len: float) -> float:
        """Efficiency at a kernel sequence length."""
        if seq_len <= self.seq_lens[0]:
            return self.values[0]
        if seq_len >= self.seq_lens[-1]:
            return self.values[-1]
        x = math.log2(seq_len)
        for i in range(1, len(self.seq_lens)):
            if seq_len <= self.seq_lens[i]:
                x0, x1 = math.log2(self.seq_lens[i - 1]), math.log2(self.seq_lens[i])
                y0, y1 = self.values[i - 1], self.values[i]
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return self.values[-1]  # unreachable


@dataclass(frozen=True)
class CalibrationInfo:
    """How a calibrated profile was fitted (absent from datasheet profiles)."""

    prior: str
    """Name of the profile the fit started from."""
    points: int
    """Measured configurations used."""
    residual: float
    """Root-mean-square relative error of the fitted step times on those points."""
    files: tuple[str, ...] = ()
    """Results files the measurements came from."""


@dataclass(frozen=True)
class HardwareProfile:
    """Everything the cost model needs about a system; see the module docstring."""

    name: str
    """Short identifier, e.g. h100-sxm."""
    description: str
    """One line: device, node, links."""
    devices_per_node: int
    """Devices (ranks) in a node: the default of --gpus-per-node."""
    memory_gib: float
    """Memory capacity per device in GiB."""
    memory_source: str
    """Where the capacity comes from."""
    memory_bandwidth: float
    """Device memory bandwidth in bytes/s (the ring's fp32 merges and accumulations are
    memory-bound)."""
    peak_tflops: dict[str, float]
    """Peak dense TFLOP/s per canonical dtype name."""
    peak_source: str
    """Where the peaks come from."""
    efficiency: EfficiencyCurve
    """Attention-kernel efficiency over the kernel sequence length."""
    step_overhead_s: float
    """Fixed time per ring step and kernel call (launch, merge, bookkeeping), seconds."""
    overlap: float
    """Fraction of min(compute, comm) of a ring step hidden behind the longer one (0..1)."""
    overheads_source: str
    """Where the overhead and overlap numbers come from."""
    intra_node: LinkTierProfile
    """Links between devices of one node."""
    inter_node: LinkTierProfile
    """Links between nodes (per NIC)."""
    compute_slots_per_node: int | None = None
    """Ranks of a node that can compute at full speed at once (CPU cores); None = every rank.
    More ranks than slots share them."""
    calibration: CalibrationInfo | None = None
    """Set on profiles fitted to measurements."""
    origin: str = field(default="built-in", compare=False)
    """Where it was loaded from: 'built-in' or a file path."""

    @property
    def memory_bytes(self) -> float:
        """Memory capacity per device in bytes."""
        return self.memory_gib * GIB

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s of a dtype."""
        key = canonical_dtype(dtype)
        if key not in self.peak_tflops:
            known = ", ".join(sorted(self.peak_tflops))
            raise CpbenchError(
                f"hardware profile {self.name!r} has no peak TFLOP/s for {key} (it has {known})"
            )
        return self.peak_tflops[key] * 1e12

    def attention_flops_per_s(self, dtype: str, kernel_seq_len: float) -> float:
        """Achieved attention FLOP/s: peak(dtype) x efficiency(kernel sequence length)."""
        return self.peak_flops(dtype) * self.efficiency.at(kernel_seq_len)

    def link(self, tier: LinkTier) -> LinkTierProfile:
        """The profile of a link tier."""
        if tier == "intra_node":
            return self.intra_node
        if tier == "inter_node":
            return self.inter_node
        raise CpbenchError(f"link tier {tier!r} is not one of {', '.join(LINK_TIERS)}")


# ------------------------------------------------------------------------------- built-ins


def _data_dir() -> Any:
    return resources.files(_DATA_PACKAGE).joinpath(*_DATA_FOLDER)


def builtin_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with cpbench, sorted."""
    folder = _data_dir()
    return tuple(
        sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))
    )


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A built-in profile by name, or a TOML file by path; CpbenchError naming the choices."""
    text = str(name_or_path)
    names = builtin_profiles()
    if text in names:
        resource = _data_dir().joinpath(f"{text}.toml")
        return profile_from_toml(resource.read_text(encoding="utf-8"), origin="built-in")
    path = Path(text).expanduser()
    if path.is_file():
        try:
            content = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CpbenchError(f"cannot read hardware profile {text}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise CpbenchError(
                f"hardware profile {text} is not UTF-8 text (byte {exc.start}): a TOML file expected"
            ) from None
        return profile_from_toml(content, origin=str(path))
    raise CpbenchError(
        f"hardware {text!r} is neither a built-in profile ({', '.join(names)}) "
        f"nor an existing TOML file"
    )


def profile_from_toml(content: str, origin: str = "<string>") -> HardwareProfile:
    """Parse and validate a profile from TOML text."""
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"hardware profile {origin} is not valid TOML: {exc}") from None
    return profile_from_dict(data, origin)


# ------------------------------------------------------------------------------- validation

_TOP_KEYS = {
    "schema_version",
    "name",
    "description",
    "devices_per_node",
    "compute_slots_per_node",
    "memory",
    "peak_tflops",
    "kernel_efficiency",
    "overheads",
    "links",
    "calibration",
}


class _Reader:
    """Typed access to a TOML table with messages that name the file and the key."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, key: str, rule: str) -> CpbenchError:
        return CpbenchError(f"hardware profile {self.origin}: {key} {rule}")

    def table(self, data: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
        value = data.get(key)
        if not isinstance(value, Mapping):
            raise self.fail(f"{prefix}{key}", "must be a table")
        return value

    def string(
        self, data: Mapping[str, Any], key: str, prefix: str = "", default: Any = None
    ) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{prefix}{key}", f"must be a string, got {value!r}")
        return value

    def positive(
        self, data: Mapping[str, Any], key: str, prefix: str = "", upper: float | None = None
    ) -> float:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.fail(f"{prefix}{key}", f"must be a positive number, got {value!r}")
        if upper is not None and value > upper:
            raise self.fail(f"{prefix}{key}", f"must be at most {upper}, got {value!r}")
        return float(value)

    def positive_int(
        self, data: Mapping[str, Any], key: str, prefix: str = "", default: Any = None
    ) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(f"{prefix}{key}", f"must be a positive integer, got {value!r}")
        return value

    def known_keys(self, data: Mapping[str, Any], allowed: set[str], where: str) -> None:
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise self.fail(
                where or "(top level)",
                f"has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}",
            )


def profile_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> HardwareProfile:
    """Validate a parsed profile; CpbenchError naming the key and the rule on any problem."""
    r = _Reader(origin)
    r.known_keys(data, _TOP_KEYS, "")
    version = data.get("schema_version", PROFILE_SCHEMA_VERSION)
    if version != PROFILE_SCHEMA_VERSION:
        raise r.fail("schema_version", f"must be {PROFILE_SCHEMA_VERSION}, got {version!r}")
    memory = r.table(data, "memory")
    r.known_keys(memory, {"capacity_gib", "bandwidth_GBps", "source"}, "[memory]")
    overheads = r.table(data, "overheads")
    r.known_keys(overheads, {"step_overhead_us", "overlap", "source"}, "[overheads]")
    overlap = overheads.get("overlap")
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0 <= overlap <= 1:
        raise r.fail("overheads.overlap", f"must be a number in [0, 1], got {overlap!r}")
    step_us = overheads.get("step_overhead_us")
    if isinstance(step_us, bool) or not isinstance(step_us, (int, float)) or step_us < 0:
        raise r.fail("overheads.step_overhead_us", f"must be a number >= 0, got {step_us!r}")
    peaks, peak_source = _read_peaks(r, r.table(data, "peak_tflops"))
    links = r.table(data, "links")
    r.known_keys(links, set(LINK_TIERS), "[links]")
    return HardwareProfile(
        name=r.string(data, "name"),
        description=r.string(data, "description", default=""),
        devices_per_node=r.positive_int(data, "devices_per_node"),
        memory_gib=r.positive(memory, "capacity_gib", "memory."),
        memory_source=r.string(memory, "source", "memory.", default=""),
        memory_bandwidth=r.positive(memory, "bandwidth_GBps", "memory.") * GB,
        peak_tflops=peaks,
        peak_source=peak_source,
        efficiency=_read_curve(r, r.table(data, "kernel_efficiency")),
        step_overhead_s=float(step_us) * 1e-6,
        overlap=float(overlap),
        overheads_source=r.string(overheads, "source", "overheads.", default=""),
        intra_node=_read_tier(r, links, "intra_node"),
        inter_node=_read_tier(r, links, "inter_node"),
        compute_slots_per_node=(
            r.positive_int(data, "compute_slots_per_node")
            if "compute_slots_per_node" in data
            else None
        ),
        calibration=_read_calibration(r, data.get("calibration")),
        origin=origin,
    )


def _read_peaks(r: _Reader, table: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    peaks: dict[str, float] = {}
    for key in table:
        if key == "source":
            continue
        if key not in DTYPES:
            raise r.fail(
                f"peak_tflops.{key}", f"is not a dtype; use {', '.join(DTYPES)} (and source)"
            )
        peaks[key] = r.positive(table, key, "peak_tflops.")
    if not peaks:
        raise r.fail("peak_tflops", f"needs at least one of {', '.join(DTYPES)}")
    return peaks, r.string(table, "source", "peak_tflops.", default="")


def _read_curve(r: _Reader, table: Mapping[str, Any]) -> EfficiencyCurve:
    r.known_keys(table, {"seq_len", "efficiency", "source"}, "[kernel_efficiency]")
    lens, values = table.get("seq_len"), table.get("efficiency")
    if not isinstance(lens, list) or not isinstance(values, list) or not lens:
        raise r.fail("kernel_efficiency", "needs non-empty lists seq_len and efficiency")
    if len(lens) != len(values):
        raise r.fail(
            "kernel_efficiency",
            f"seq_len ({len(lens)} values) and efficiency ({len(values)} values) differ in length",
        )
    for n in lens:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise r.fail("kernel_efficiency.seq_len", f"must hold positive integers, got {n!r}")
    if any(b <= a for a, b in zip(lens, lens[1:], strict=False)):
        raise r.fail("kernel_efficiency.seq_len", f"must be strictly increasing, got {lens}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise r.fail("kernel_efficiency.efficiency", f"must hold numbers in (0, 1], got {v!r}")
    source = r.string(table, "source", "kernel_efficiency.", default="")
    return EfficiencyCurve(tuple(lens), tuple(float(v) for v in values), source)


def _read_tier(r: _Reader, links: Mapping[str, Any], tier: str) -> LinkTierProfile:
    prefix = f"links.{tier}."
    table = r.table(links, tier, "links.")
    r.known_keys(table, {"name", "devices_per_nic", *COLLECTIVE_KINDS}, f"[links.{tier}]")
    costs = {}
    for kind in COLLECTIVE_KINDS:
        cost = r.table(table, kind, prefix)
        where = f"{prefix}{kind}."
        r.known_keys(cost, {"latency_us", "busbw_GBps", "source"}, f"[{prefix}{kind}]")
        latency = cost.get("latency_us")
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
            raise r.fail(f"{where}latency_us", f"must be a number >= 0, got {latency!r}")
        costs[kind] = LinkCost(
            float(latency) * 1e-6,
            r.positive(cost, "busbw_GBps", where) * GB,
            r.string(cost, "source", where, default=""),
        )
    return LinkTierProfile(
        tier,  # type: ignore[arg-type]
        r.string(table, "name", prefix, default=tier),
        costs["all_to_all"],
        costs["send_recv"],
        r.positive_int(table, "devices_per_nic", prefix, default=1),
    )


def _read_calibration(r: _Reader, table: Any) -> CalibrationInfo | None:
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise r.fail("calibration", "must be a table")
    r.known_keys(table, {"prior", "points", "residual", "files"}, "[calibration]")
    files = table.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise r.fail("calibration.files", f"must be a list of strings, got {files!r}")
    residual = table.get("residual")
    if isinstance(residual, bool) or not isinstance(residual, (int, float)) or residual < 0:
        raise r.fail("calibration.residual", f"must be a number >= 0, got {residual!r}")
    return CalibrationInfo(
        r.string(table, "prior", "calibration."),
        r.positive_int(table, "points", "calibration."),
        float(residual),
        tuple(files),
    )


# ---------------------------------------------------------------------------------- writing


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _toml_float(value: float) -> str:
    return repr(float(f"{value:.6g}"))


def profile_to_toml(profile: HardwareProfile, header: str = "") -> str:
    """The profile as TOML that `load_profile` reads back (numbers rounded to 6 digits)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [
        f"schema_version = {PROFILE_SCHEMA_VERSION}",
        f"name = {_toml_string(profile.name)}",
        f"description = {_toml_string(profile.description)}",
        f"devices_per_node = {profile.devices_per_node}",
        *(
            [f"compute_slots_per_node = {profile.compute_slots_per_node}"]
            if profile.compute_slots_per_node is not None
            else []
        ),
        "",
        "[memory]",
        f"capacity_gib = {_toml_float(profile.memory_gib)}",
        f"bandwidth_GBps = {_toml_float(profile.memory_bandwidth / GB)}",
        f"source = {_toml_string(profile.memory_source)}",
        "",
        "[peak_tflops]",
        *(f"{k} = {_toml_float(v)}" for k, v in sorted(profile.peak_tflops.items())),
        f"source = {_toml_string(profile.peak_source)}",
        "",
        "[kernel_efficiency]",
        f"seq_len = [{', '.join(str(n) for n in profile.efficiency.seq_lens)}]",
        f"efficiency = [{', '.join(_toml_float(v) for v in profile.efficiency.values)}]",
        f"source = {_toml_string(profile.efficiency.source)}",
        "",
        "[overheads]",
        f"step_overhead_us = {_toml_float(profile.step_overhead_s * 1e6)}",
        f"overlap = {_toml_float(profile.overlap)}",
        f"source = {_toml_string(profile.overheads_source)}",
    ]
    for tier in (profile.intra_node, profile.inter_node):
        lines += ["", f"[links.{tier.tier}]", f"name = {_toml_string(tier.name)}"]
        lines.append(f"devices_per_nic = {tier.devices_per_nic}")
        for kind in COLLECTIVE_KINDS:
            cost = tier.cost(kind)  # type: ignore[arg-type]
            lines += [
                "",
                f"[links.{tier.tier}.{kind}]",
                f"latency_us = {_toml_float(cost.latency_s * 1e6)}",
                f"busbw_GBps = {_toml_float(cost.busbw / GB)}",
                f"source = {_toml_string(cost.source)}",
            ]
    if profile.calibration is not None:
        c = profile.calibration
        lines += [
            "",
            "[calibration]",
            f"prior = {_toml_string(c.prior)}",
            f"points = {c.points}",
            f"residual = {_toml_float(c.residual)}",
            f"files = [{', '.join(_toml_string(f) for f in c.files)}]",
        ]
    return "\n".join(lines) + "\n"


def save_profile(profile: HardwareProfile, path: str | Path, header: str = "") -> Path:
    """Write the profile as TOML; CpbenchError when the file cannot be written."""
    target = Path(path).expanduser()
    try:
        target.write_text(profile_to_toml(profile, header), encoding="utf-8")
    except OSError as exc:
        raise CpbenchError(f"cannot write hardware profile {target}: {exc.strerror}") from None
    return target


def with_link_cost(
    profile: HardwareProfile, tier: LinkTier, kind: CollectiveKind, cost: LinkCost
) -> HardwareProfile:
    """A copy of the profile with one (tier, kind) LinkCost replaced."""
    link = profile.link(tier)
    new_link = replace(link, **{kind: cost})
    return replace(profile, **{tier: new_link})


def scaled_bandwidth(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """A copy with every busbw multiplied by `factor` (what-if and tests)."""
    if factor <= 0:
        raise CpbenchError(f"bandwidth factor must be positive, got {factor}")
    result = profile
    for tier in LINK_TIERS:
        for kind in COLLECTIVE_KINDS:
            cost = result.link(tier).cost(kind)  # type: ignore[arg-type]
            result = with_link_cost(
                result,
                tier,
                kind,
                replace(cost, busbw=cost.busbw * factor),  # type: ignore[arg-type]
            )
    return result
