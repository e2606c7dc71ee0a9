"""`cpbench plan` against published end-to-end training runs. Pure Python.

The rows, the peak scale and what is compared: docs/plan.md, "Against published runs"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from scipy.optimize import brentq

from cpbench.config.problem import check_choice
from cpbench.errors import CpbenchError
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.hardware.transforms import with_table
from cpbench.model.plan.memory import CUDA_RESERVE_GIB, SAFE_MEMORY_FRACTION, check_recompute
from cpbench.model.plan.search import Plan, SearchSpace, search
from cpbench.model.plan.step import matmul_efficiency
from cpbench.model.plan.transformer import load_model
from cpbench.reading import loads_toml
from cpbench.units import GIB

END_TO_END_TABLE = "cpbench/data/published/end_to_end.toml"
"""Where the published end-to-end rows live (in the package)."""


@dataclass(frozen=True)
class PublishedRow:
    """One published run as the TOML states it."""

    id: str
    role: str
    source: str
    machine: str
    settings: dict[str, Any]
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    memory_gib: float | None
    memory_counts: str
    assumes: str


@dataclass(frozen=True)
class RowCheck:
    """Predicted against published for one row."""

    row: PublishedRow
    peak_scale: float
    """The machine's peak scale used."""
    plan: Plan | None
    """The plan with the row's settings (None: it does not fit)."""
    rule: str
    """Why no plan (empty when one fits)."""
    capacity_gib: float
    """Device memory of the machine, GiB."""

    @property
    def predicted_tokens_per_s_per_gpu(self) -> float | None:
        """The plan's tokens/s/GPU."""
        return self.plan.time.tokens_per_s_per_gpu if self.plan else None

    @property
    def predicted_tflops_per_gpu(self) -> float | None:
        """The plan's model TFLOP/s per GPU (MFU convention)."""
        t = self.plan.time if self.plan else None
        return t.model_flops / t.total_s / t.world / 1e12 if t else None

    @property
    def tensor_gib(self) -> float | None:
        """Tensor total per rank, GiB (no runtime reserve)."""
        return self.plan.peak.tensor_total / GIB if self.plan else None

    @property
    def with_reserve_gib(self) -> float | None:
        """Tensor total + the runtime reserve, GiB."""
        return self.plan.peak.total / GIB if self.plan else None

    @property
    def tokens_error(self) -> float | None:
        """predicted / published tokens/s/GPU - 1."""
        pub, got = self.row.tokens_per_s_per_gpu, self.predicted_tokens_per_s_per_gpu
        return got / pub - 1 if pub and got is not None else None

    @property
    def tflops_error(self) -> float | None:
        """predicted / published TFLOP/s/GPU - 1."""
        pub, got = self.row.tflops_per_gpu, self.predicted_tflops_per_gpu
        return got / pub - 1 if pub and got is not None else None

    @property
    def fits(self) -> bool | None:
        """Whether the predicted total (with the reserve) fits the device memory."""
        return None if self.with_reserve_gib is None else self.with_reserve_gib <= self.capacity_gib

    @property
    def within_safe_margin(self) -> bool | None:
        """Whether the tensor total is within SAFE_MEMORY_FRACTION of the device memory."""
        if self.tensor_gib is None:
            return None
        return self.tensor_gib <= SAFE_MEMORY_FRACTION * self.capacity_gib


def load_rows(text: str | None = None) -> tuple[dict[str, dict[str, Any]], tuple[PublishedRow, ...]]:
    """The machines and rows of the shipped TOML (or of `text`)."""
    if text is None:
        text = (resources.files("cpbench") / "data" / "published" / "end_to_end.toml").read_text(
            encoding="utf-8")
    data = loads_toml(text, END_TO_END_TABLE)
    machines = data.get("machine", {})
    rows = []
    for raw in data.get("row", []):
        raw = dict(raw)
        keys = ("id", "role", "source", "machine")
        missing = [k for k in keys if k not in raw]
        if missing:
            raise CpbenchError(f"published row {raw.get('id', '?')} lacks {', '.join(missing)}")
        check_choice(f"published row {raw['id']}: machine", raw["machine"], tuple(machines))
        check_choice(f"published row {raw['id']}: role", raw["role"], ("calibrate", "validate"))
        head = {k: raw.pop(k) for k in keys}
        published = {k: raw.pop(k, None) for k in ("tokens_per_s_per_gpu", "tflops_per_gpu",
                                                     "memory_gib")}
        memory_counts = str(raw.pop("memory_counts", raw.pop("tflops_counts", "")))
        assumes = str(raw.pop("assumes", ""))
        rows.append(PublishedRow(**head, settings=raw, **published, memory_counts=memory_counts,
                                 assumes=assumes))
    return machines, tuple(rows)


def machine_profile(machine: dict[str, Any], peak_scale: float) -> HardwareProfile:
    """The machine's profile: its hardware with the stated memory and bandwidth and every peak
    scaled."""
    profile = load_profile(machine["hardware"])
    memory: dict[str, Any] = {}
    if "memory_gib" in machine:
        memory["capacity_gib"] = float(machine["memory_gib"])
    if "memory_bandwidth_GBps" in machine:
        memory["bandwidth"] = float(machine["memory_bandwidth_GBps"]) * 1e9
    peaks = {k: v * peak_scale for k, v in profile.peak_tflops.items()}
    profile = with_table(with_table(profile, "memory", **memory), "peaks", **peaks)
    return replace(profile, name=f"{profile.name} x{peak_scale:.3f} peak")


UNBOUNDED_MEMORY_GIB = 1e9
"""Device memory the row's plan is searched with: the published run ran, so its time is priced
whatever the memory model says; the memory is compared separately (`RowCheck.fits`)."""


def plan_row(row: PublishedRow, profile: HardwareProfile) -> tuple[Plan | None, str]:
    """The fastest plan with the row's settings on a profile, its memory not enforced (None and
    the rule if no plan: a mesh or framework rule)."""
    s = row.settings
    model = load_model(s["model"])
    space = SearchSpace(
        model=model, profile=with_table(profile, "memory", capacity_gib=UNBOUNDED_MEMORY_GIB), gpus=s["gpus"], gpus_per_node=s["gpus_per_node"],
        seq_len=s["seq_len"], global_batch=s["global_batch"],
        efficiency=matmul_efficiency(profile), reserve_bytes=CUDA_RESERVE_GIB * GIB,
        micro_batch=s["micro_batch"], zero=s["zero"], recompute=check_recompute(s["recompute"]),
        tp=s["tp"], cp=s["cp"], pp=s["pp"], keep=1, framework=s["framework"],
        linears=s["linears"], uneven_pp=True,
    )
    found = search(space)
    if found.feasible:
        return found.feasible[0], ""
    memory = [r for r in found.rejected if r.kind == "memory"]
    return None, (memory[0].rule if memory else "; ".join(r.rule for r in found.rejected[:3]))


def peak_scale(machine: dict[str, Any], rows: tuple[PublishedRow, ...]) -> float:
    """The machine's stated peak scale, or the one that makes its calibration row's predicted
    tokens/s/GPU equal the published (brentq on [0.2, 1.5])."""
    if "peak_scale" in machine:
        return float(machine["peak_scale"])
    name = machine.get("calibrate")
    row = next((r for r in rows if r.id == name), None)
    if row is None or row.tokens_per_s_per_gpu is None:
        raise CpbenchError(f"machine needs peak_scale or a calibrate row with tokens/s, got "
                           f"{name!r}")
    target = float(row.tokens_per_s_per_gpu)

    def gap(scale: float) -> float:
        found, rule = plan_row(row, machine_profile(machine, scale))
        if found is None:
            raise CpbenchError(f"calibration row {row.id} has no plan: {rule}")
        return found.time.tokens_per_s_per_gpu - target

    return float(brentq(gap, 0.2, 1.5, xtol=1e-4))


def validate_end_to_end(text: str | None = None) -> tuple[RowCheck, ...]:
    """Predicted against published for every row (the calibration rows too, marked by role)."""
    machines, rows = load_rows(text)
    scales = {name: peak_scale(m, rows) for name, m in machines.items()}
    out = []
    for row in rows:
        profile = machine_profile(machines[row.machine], scales[row.machine])
        found, rule = plan_row(row, profile)
        out.append(RowCheck(row, scales[row.machine], found, rule, profile.memory_bytes / GIB))
    return tuple(out)


def end_to_end_json(checks: tuple[RowCheck, ...]) -> list[dict[str, Any]]:
    """The checks as JSON-serialisable rows."""
    out = []
    for c in checks:
        out.append({
            "id": c.row.id, "role": c.row.role, "source": c.row.source,
            "settings": c.row.settings, "assumes": c.row.assumes,
            "peak_scale": c.peak_scale,
            "plan": c.plan.par.label() if c.plan else None,
            "layout": c.plan.par.layout if c.plan else None,
            "rule": c.rule,
            "published_tokens_per_s_per_gpu": c.row.tokens_per_s_per_gpu,
            "predicted_tokens_per_s_per_gpu": c.predicted_tokens_per_s_per_gpu,
            "tokens_error": c.tokens_error,
            "published_tflops_per_gpu": c.row.tflops_per_gpu,
            "predicted_tflops_per_gpu": c.predicted_tflops_per_gpu,
            "tflops_error": c.tflops_error,
            "published_memory_gib": c.row.memory_gib,
            "published_memory_counts": c.row.memory_counts,
            "predicted_tensor_gib": c.tensor_gib,
            "predicted_with_reserve_gib": c.with_reserve_gib,
            "capacity_gib": c.capacity_gib,
            "fits": c.fits,
            "within_safe_memory_fraction": c.within_safe_margin,
        })
    return out
