"""The typed report `cpbench probe` returns (`cpbench.app.probe.run.probe_report`; its --json
is `ProbeReport.model_dump(mode="json")`): seconds, bytes, bytes/s with GB = 1e9 bytes."""

from __future__ import annotations

from cpbench.app.schema import ReportModel, Versioned
from cpbench.config.vocabulary import Backend, Device, Dtype, Phase
from cpbench.model.formulas import CollectiveKind


class Settings(ReportModel):
    """What was probed (`cpbench.app.probe.plan.ProbeSettings` less its run-only knobs)."""

    world_size: int
    device: Device
    heads: int
    kv_heads: int
    head_dim: int
    seq_lens: list[int]
    dtype: Dtype
    batch: int
    phase: Phase
    kernel: Backend
    budget_s: float


class Prior(ReportModel):
    """The profile the probe started from, and why that one."""

    name: str
    reason: str


class CommRow(ReportModel):
    """One timed collective: the median per call of the max over ranks."""

    kind: CollectiveKind
    mesh: str
    group_size: int
    size_bytes: int
    """nccl-tests' size: what a rank hands in per call."""
    bytes_sent: int | float
    """What a rank puts on the wire per call (size x (n-1)/n for an all-to-all)."""
    origin: str
    """The configurations' messages of this size (or `small (latency)`)."""
    time_s: float
    repetitions: int
    algbw_GBps: float
    busbw_GBps: float
    tier: str
    """The interconnect tier the group spans."""


class LinkRow(ReportModel):
    """One fitted link line (latency + bytes / busbw) against the prior's."""

    tier: str
    kind: CollectiveKind
    points: int
    latency_us: float
    busbw_GBps: float
    prior_latency_us: float
    prior_busbw_GBps: float
    residual: float


class KernelShape(ReportModel):
    """One timed kernel shape (the ring's diagonal block of the meshes listed)."""

    seq_len: int
    """L/R."""
    heads: int
    kv_heads: int
    meshes: list[str]
    time_s: float
    repetitions: int
    flops: float
    tflops: float
    efficiency: float


class Curve(ReportModel):
    """The efficiency curve written to the profile."""

    seq_len: list[int]
    efficiency: list[float]


class Kernel(ReportModel):
    """The local attention kernel's measurements and the curve they make."""

    family: str
    """The efficiency family the curve was written to."""
    ranks_at_once: int
    peak_tflops: float | None
    """The prior's peak in the probed dtype."""
    flops_convention: str
    shapes: list[KernelShape]
    curve: Curve


class ProbeReport(Versioned):
    """Everything `cpbench probe` measured and the profile it made (its --json is
    `model_dump(mode="json")`)."""

    machine: str
    """'<host>, <world> x <device>'."""
    date: str
    """When (UTC)."""
    wall_s: float
    """Seconds of the whole probe (rank start-up included)."""
    measure_s: float
    """Seconds of the measurement task alone."""
    settings: Settings
    prior: Prior
    meshes: list[str]
    """Every 'UxR' mesh measured."""
    comm: list[CommRow]
    links: list[LinkRow]
    kernel: Kernel
    profile: str
    profile_toml: str
    output: str | None
    """Where the profile was written (None: nowhere)."""
    notes: list[str]
    """What was clipped or left out."""
