"""The model against published CP-attention measurements (`cpbench validate --published`).

The dataset, the prior and leave-one-group-out scores, the metrics: docs/cost-model.md section 4."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cpbench.errors import CpbenchError
from cpbench.model.calibrate.fit import fit_profile
from cpbench.model.calibrate.measurements import Measurement, default_prior
from cpbench.model.calibrate.table import read_table_rows
from cpbench.model.calibrate.validation import validation_rows, validation_summary
from cpbench.model.hardware.loading import load_profile


def published_table() -> Path:
    """The shipped table of published CP-attention measurements."""
    return Path(str(resources.files("cpbench") / "data" / "published" / "cp_attention.csv"))


def out_of_sample_table() -> Path:
    """yunchang's (feifeibear/long-context-attention) PCIe table, the out-of-sample check:
    scored by the prior only, never calibrated on (issue 24)."""
    return Path(str(resources.files("cpbench") / "data" / "published" / "yunchang_pcie.csv"))


@dataclass(frozen=True)
class Scores:
    """The model's accuracy on one machine's rows, one way."""

    median_abs_error: float
    """Median |predicted / measured - 1| of the step time."""
    spearman: float | None
    """Median Spearman of the groups with >= 2 configurations (None: no such group)."""
    worst_regret: float | None
    """Largest regret of the model's pick in those groups (None: no such group)."""
    rows: tuple[dict[str, Any], ...]
    """Predicted vs measured per row (`validation_rows`)."""


@dataclass(frozen=True)
class MachineValidation:
    """One machine of the dataset: its rows and the model's scores."""

    hardware: str
    """The machine (the rows' `hardware`)."""
    profile: str
    """The built-in profile its GPU names (the prior)."""
    warning: str | None
    """Why that profile is only the closest one, when it is."""
    rows: int
    """Rows of the machine."""
    groups: int
    """Groups of rows that solve one problem."""
    sources: tuple[str, ...]
    """The rows' sources, once each."""
    prior: Scores
    """The prior alone."""
    held_out: Scores | None
    """Leave-one-group-out calibrated (None: a single group, nothing to calibrate on)."""


def _scores(measurements: Sequence[Measurement], rows: Sequence[dict[str, Any]]) -> Scores:
    summary = validation_summary(measurements, rows)
    rankable = [g for g in summary["groups"] if g["configurations"] > 1]
    return Scores(
        summary["median_abs_error"],
        statistics.median(g["spearman"] for g in rankable) if rankable else None,
        summary["regret"],
        tuple(rows),
    )


def validate_machine(
    hardware: str,
    measurements: Sequence[Measurement],
    sources: Sequence[str],
    profile: str = "",
    leave_one_group_out: bool = True,
) -> MachineValidation:
    """The prior's and (with `leave_one_group_out`) the leave-one-group-out calibrated scores
    on one machine's rows; the prior is `profile` when the rows name one (their GPU has no
    profile), else the GPU's."""
    choice = default_prior(measurements, named=profile)
    prior = load_profile(choice.name)
    prior_scores = _scores(measurements, validation_rows(measurements, prior))
    groups: dict[Any, list[Measurement]] = {}
    for m in measurements:
        groups.setdefault(m.group, []).append(m)
    held_out = None
    if leave_one_group_out and len(groups) > 1:
        ordered: list[Measurement] = []
        rows: list[dict[str, Any]] = []
        for key, members in groups.items():
            train = [m for k, ms in groups.items() if k != key for m in ms]
            fitted = fit_profile(train, prior).profile
            ordered += members
            rows += validation_rows(members, fitted)
        held_out = _scores(ordered, rows)
    return MachineValidation(
        hardware, choice.name, choice.warning, len(measurements), len(groups),
        tuple(dict.fromkeys(sources)), prior_scores, held_out,
    )  # fmt: skip


def validate_published(
    path: Path | None = None, leave_one_group_out: bool = True
) -> list[MachineValidation]:
    """Every machine of the published table (the shipped one unless `path`), by machine;
    without `leave_one_group_out` the prior alone (the out-of-sample table)."""
    path = path or published_table()
    table = read_table_rows(path)
    if not table:
        raise CpbenchError(f"{path} has no rows")
    by_machine: dict[str, list[tuple[Measurement, str]]] = {}
    profiles: dict[str, set[str]] = {}
    for row_id, row in table:
        machine = row.hardware or row.gpu
        by_machine.setdefault(machine, []).append((row.measurement(row_id), row.source))
        profiles.setdefault(machine, set()).add(row.profile)
    for machine, named in profiles.items():
        if len(named) > 1:
            raise CpbenchError(
                f"{path}: the rows of {machine!r} name profiles "
                f"{sorted(named)}: one machine starts from one profile"
            )
    return [
        validate_machine(
            machine, [m for m, _ in items], [s for _, s in items], profiles[machine].pop(),
            leave_one_group_out,
        )
        for machine, items in by_machine.items()
    ]
