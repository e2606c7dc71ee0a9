"""The typed reports of `cpbench calibrate` and `cpbench validate` (`cpbench.app.calibrate`;
their --json is `model_dump(mode="json")`). Data only; the model's fits and scores fill them."""

from __future__ import annotations

from typing import Any, Literal

from cpbench.app.schema import ReportModel, Versioned
from cpbench.config.vocabulary import Phase, Split


class PriorChoice(ReportModel):
    """The profile the fit or the scores started from, and why that one."""

    name: str
    reason: str
    warning: str | None
    """Why the choice may not describe the measured machine (None: no doubt)."""


class FitParameter(ReportModel):
    """One fitted parameter, in the unit of `unit` (empty: dimensionless)."""

    name: str
    unit: str
    prior: float
    fitted: float
    points: int
    prior_sd: float | None
    """The joint fit's prior sd of its log (None: a linear fit's parameter)."""
    posterior_sd: float | None
    status: str | None
    """determined, constrained or undetermined by the data (None: a linear fit's)."""
    misfit: str | None = None
    """The joint fit moved this physical parameter out of its range: the model's misfit."""


class Fit(ReportModel):
    """One fit (a link, the kernel curve, the joint fit) and its residual before and after."""

    target: str
    points: int
    residual_before: float
    residual_after: float
    parameters: list[FitParameter]


class CalibrationSummary(ReportModel):
    """A calibration: every fit, and the RMS relative step-time error before and after."""

    prior: str
    profile: str
    points: int
    residual_before: float
    residual: float
    fits: list[Fit]
    notes: list[str]


class CalibrationReport(CalibrationSummary, Versioned):
    """`cpbench calibrate`: the calibration, where its profile went and how the prior was
    chosen."""

    output: str | None
    prior_choice: PriorChoice
    warnings: list[str]


class ValidationRow(ReportModel):
    """Predicted vs measured step time of one configuration (error = predicted / measured -
    1); the compute-only and comm-only times where measured (None where not)."""

    id: str
    config: str
    ulysses: int
    ring: int
    layout: str
    seq_len: int
    phase: Phase
    measured_s: float
    predicted_s: float
    error: float
    measured_compute_only_s: float | None
    predicted_compute_only_s: float
    measured_comm_only_s: float | None
    predicted_comm_only_s: float


class ValidationGroup(ReportModel):
    """One comparable group (same problem, dtype, mask, phase, ranks): the model's pick against
    the measured fastest."""

    configurations: int
    chosen: str
    """The configuration(s) the model ranks fastest (ties joined by ` = `)."""
    best: str
    regret: float
    """Measured time of the pick / the measured fastest - 1."""
    spearman: float | None
    tie: bool | None = None
    """The pick's 95% interval overlaps the best's (the key is left out on a holdout)."""
    regret_within_noise: bool | None = None
    """The same as `tie`: a regret on a tie is noise."""

    omitted_when_none = ("tie", "regret_within_noise")


class ValidationReport(Versioned):
    """`cpbench validate` as given or calibrated first: predicted vs measured on every row."""

    mode: str
    """`as given` or `in-sample (calibrated on the same results)`."""
    profile: str
    rows: list[ValidationRow]
    n: int
    median_abs_error: float
    max_abs_error: float
    spearman: float | None
    regret: float | None
    regret_mean: float | None
    groups: list[ValidationGroup]
    groups_within_noise: int
    """Groups whose regret is a tie."""
    calibration: CalibrationSummary | None
    """The calibration first made (None: the profile as given)."""
    prior_choice: PriorChoice
    warnings: list[str]


class HoldoutReport(Versioned):
    """`cpbench validate --holdout`: calibrated on `train`, predicting the held-out rows."""

    mode: Literal["holdout"]
    profile: str
    """The prior."""
    n_train: int
    n_test: int
    median_abs_error: float
    max_abs_error: float
    spearman: float | None
    regret: float | None
    regret_mean: float | None
    groups: list[ValidationGroup]
    split: Split
    fraction: float
    seed: int
    prior: str
    train: list[str]
    """The configurations calibrated on."""
    rows: list[ValidationRow]
    """The held-out configurations."""
    calibration: CalibrationSummary
    prior_choice: PriorChoice
    warnings: list[str]


class MachineScores(ReportModel):
    """The model's scores on one machine's published rows."""

    median_abs_error: float
    spearman: float | None
    """Median over groups of one problem with two or more configurations (None: no such
    group)."""
    worst_regret: float | None
    rows: list[ValidationRow]


class PublishedMachine(ReportModel):
    """One machine of a published dataset: the prior's scores and the leave-one-group-out
    calibrated ones."""

    hardware: str
    profile: str
    """The built-in profile its GPU names (the prior)."""
    warning: str | None
    """Why that profile is only the closest one, when it is."""
    rows: int
    groups: int
    sources: list[str]
    """The rows' sources, once each."""
    prior: MachineScores
    leave_one_group_out: MachineScores | None
    """None: a single group, or a dataset scored by the prior alone."""


class ScoresSection(ReportModel):
    """A dataset of published CP-attention step times and the model's scores per machine."""

    name: str
    title: str
    table: str
    error_convention: str
    machines: list[PublishedMachine]


class PlanCheck(ReportModel):
    """`cpbench plan` with one published training run's settings against what was published
    (`cpbench.model.plan.validation.RowCheck`)."""

    id: str
    role: str
    """validate (a check) or calibrate (fixes its machine's peak scale)."""
    source: str
    settings: dict[str, Any]
    """The run's parallelism and batch settings as published."""
    assumes: str
    """What the row assumes where the source is silent."""
    peak_scale: float
    """The machine's peak scale used."""
    plan: str | None
    """The plan's label (None: it does not fit, `rule` says why)."""
    layout: str | None
    rule: str
    """Why no plan (empty when one fits)."""
    published_tokens_per_s_per_gpu: int | float | None
    """As the source's table gives it (an integer stays one in the JSON)."""
    predicted_tokens_per_s_per_gpu: float | None
    tokens_error: float | None
    """predicted / published tokens/s/GPU - 1."""
    published_tflops_per_gpu: int | float | None
    predicted_tflops_per_gpu: float | None
    tflops_error: float | None
    published_memory_gib: int | float | None
    published_memory_counts: str
    """What the published memory number counts."""
    predicted_tensor_gib: float | None
    """Tensor total per rank (no runtime reserve)."""
    predicted_with_reserve_gib: float | None
    capacity_gib: float
    fits: bool | None
    within_safe_memory_fraction: bool | None


class PlanSection(ReportModel):
    """`cpbench plan` per published training run (`cpbench.model.plan.validation`'s checks,
    which `cpbench.render.plan.render_published_plans` renders)."""

    name: Literal["plan_end_to_end"]
    title: str
    table: str
    error_convention: str
    rows: list[PlanCheck]


class PublishedReport(Versioned):
    """`cpbench validate --published`: a section per dataset with its scores."""

    mode: Literal["published"]
    sections: list[ScoresSection | PlanSection]
