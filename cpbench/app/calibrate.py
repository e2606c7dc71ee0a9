"""`cpbench calibrate` and `cpbench validate`: fit a hardware profile to results files (or
tables of measured step times, `model.calibrate.table`), and compare the model's predictions
with measurements (in sample or on a holdout)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpbench.app import calibrate_schema as out
from cpbench.app.calibrate_schema import (
    CalibrationReport,
    HoldoutReport,
    PlanCheck,
    PlanSection,
    PriorChoice,
    PublishedReport,
    ScoresSection,
    ValidationReport,
)
from cpbench.app.recommend import load_results
from cpbench.errors import CpbenchError
from cpbench.files import check_output
from cpbench.model.calibrate import (
    Measurement,
    Split,
    calibration_summary,
    fit_profile,
    holdout_evaluation,
    measurements_from_records,
    validate_profile,
)
from cpbench.model.calibrate.measurements import default_prior, measurement_from_record
from cpbench.model.calibrate.table import is_table, read_table_rows
from cpbench.model.hardware.file_schema import save_profile
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.results.store import status_summary


def _measurements_and_prior(
    paths: Sequence[str], hardware: str | None, job: str
) -> tuple[list[Measurement], HardwareProfile, PriorChoice, list[str]]:
    """The usable measurements of `paths`, the profile to start from (given, the one every
    table row names, or the built-in profile of the GPU the records name) and how it was
    chosen (`prior_choice` of the report: name, reason, warning); CpbenchError when no record
    is usable."""
    tables = [p for p in paths if is_table(Path(p))]
    record_files = [p for p in paths if p not in tables]
    records = load_results(record_files) if record_files else []
    measurements = measurements_from_records(records)
    named: set[str] = set()  # the profiles the tables' rows name (docs/cost-model.md)
    for table in tables:
        for row_id, row in read_table_rows(Path(table)):
            measurements.append(row.measurement(row_id))
            named.add(row.profile)
    if not measurements:
        raise CpbenchError(
            f"no usable records in {', '.join(paths)}: {status_summary(records)}; {job} needs "
            f"status 'ok' records with a feasible config and timing.median, or table rows "
            f"(docs/cost-model.md)"
        )
    # A table whose every row names one profile starts from it, as `validate --published` does
    choice = default_prior(
        measurements, hardware, named.pop() if len(named) == 1 and not records else ""
    )
    chosen = PriorChoice(name=choice.name, reason=choice.reason, warning=choice.warning)
    unused = [r for r in records if measurement_from_record(r) is None]
    warnings = [w for w in (choice.warning, _unused_note(unused, len(records))) if w]
    return measurements, load_profile(choice.name), chosen, warnings


def _unused_note(unused: Sequence[dict[str, Any]], total: int) -> str | None:
    """What the fit left out, counted by status (an ok record: an external impl, an inference
    step, an infeasible config or no timing.median)."""
    if not unused:
        return None
    counts = status_summary(unused).partition(" (")[2].rstrip(")")
    return (
        f"{len(unused)} of {total} records not used ({counts}): only 'ok' records of "
        f"cpbench's training steps with a feasible config and timing.median are fitted"
    )


def calibrate_results(
    paths: Sequence[str],
    hardware: str | None = None,
    output: str | None = None,
    name: str | None = None,
) -> CalibrationReport:
    """Fit a profile to results files and optionally write it as TOML; the report."""
    if output:  # before the fit: an output that is an input is refused at once
        check_output(output, paths, "-o")
    measurements, prior, chosen, warnings = _measurements_and_prior(
        paths, hardware, "calibration"
    )
    result = fit_profile(measurements, prior, name=name, files=tuple(paths))
    written = None
    if output:
        header = (
            f"Calibrated by `cpbench calibrate` from {', '.join(paths)} "
            f"({result.points} measurements, prior {prior.name}).\n"
            f"RMS relative step-time error {result.residual:.1%} on those points "
            f"(prior: {result.residual_before:.1%}). Load with --hardware {output}"
        )
        written = str(save_profile(result.profile, output, header, inputs=paths))
    return CalibrationReport.model_validate(
        {**calibration_summary(result), "output": written, "prior_choice": chosen,
         "warnings": warnings}
    )


def validate_results(
    paths: Sequence[str],
    hardware: str | None = None,
    holdout: bool = False,
    fraction: float = 0.5,
    seed: int = 0,
    split: Split = "stratified",
    calibrate_first: bool = False,
) -> ValidationReport | HoldoutReport:
    """Predicted vs measured per configuration (or a holdout evaluation); the report."""
    measurements, prior, chosen, warnings = _measurements_and_prior(
        paths, hardware, "validation"
    )
    extra = {"prior_choice": chosen, "warnings": warnings}
    if holdout:
        result = holdout_evaluation(measurements, seed, prior=prior, fraction=fraction, split=split)
        return HoldoutReport.model_validate(
            {"mode": "holdout", "profile": prior.name, **result, **extra}
        )
    profile = prior
    calibration = None
    if calibrate_first:
        fitted = fit_profile(measurements, prior, files=tuple(paths))
        profile, calibration = fitted.profile, calibration_summary(fitted)
    report = validate_profile(measurements, profile)
    mark_ties(report, load_results([p for p in paths if not is_table(Path(p))]))
    mode = "in-sample (calibrated on the same results)" if calibrate_first else "as given"
    return ValidationReport.model_validate(
        {"mode": mode, **report, "calibration": calibration, **extra}
    )


def mark_ties(report: dict[str, Any], records: Sequence[dict[str, Any]]) -> None:
    """Per validation group, whether the configuration the model chose is measured as fast as
    the measured best within the noise (their 95% intervals overlap: `ties.Interval.overlaps`):
    `tie` (bool) and `regret_within_noise` on each group, and `groups_within_noise` overall. A
    regret on a tie is noise, not a wrong choice."""
    from cpbench.model.ties import Interval  # noqa: PLC0415
    from cpbench.results.frame import record_interval  # noqa: PLC0415

    ok = {r["id"]: r for r in records if r.get("status") == "ok"}
    by_label: dict[str, Interval] = {}
    for row in report.get("rows", []):
        if (found := record_interval(ok.get(row["id"], {}))) is not None:
            by_label[row["config"]] = found
    for group in report.get("groups", []):
        best = by_label.get(group["best"])
        chosen = [by_label.get(c) for c in str(group["chosen"]).split(" = ")]
        tie = best is not None and None not in chosen and any(c.overlaps(best) for c in chosen if c)
        group["tie"] = group["regret_within_noise"] = tie
    report["groups_within_noise"] = sum(g["tie"] for g in report.get("groups", []))


def published_cp_attention_section(path: str | None = None) -> ScoresSection:
    """The CP-attention section of `validate --published`: per machine, the prior's and the
    leave-one-group-out calibrated scores (`model.calibrate.published`)."""
    from cpbench.model.calibrate.published import published_table  # noqa: PLC0415

    return copy.deepcopy(_scores_section(
        "cp_attention",
        "CP attention step times (one attention layer)",
        Path(path) if path else published_table(),
        "error = predicted / measured - 1 of the step time; Spearman: median over groups of one "
        "problem with >= 2 configurations; regret: measured time of the model's pick / the "
        "measured fastest - 1, worst group",
        True,
    ))


def out_of_sample_section() -> ScoresSection:
    """The out-of-sample section of `validate --published`: yunchang's PCIe tables scored by
    the prior alone (`model.calibrate.published.out_of_sample_table`)."""
    from cpbench.model.calibrate.published import out_of_sample_table  # noqa: PLC0415

    return copy.deepcopy(_scores_section(
        "cp_attention_out_of_sample",
        "CP attention, out of sample: yunchang's PCIe tables (prior only, in no fit)",
        out_of_sample_table(),
        "error = predicted / measured - 1 of the step time (forward, one attention layer); "
        "Spearman: median over groups of one problem; regret: measured time of the model's "
        "pick / the measured fastest - 1, worst group; no LOGO: these rows are never "
        "calibrated on",
        False,
    ))


@functools.cache
def _scores_section(
    name: str, title: str, table: Path, convention: str, leave_one_group_out: bool
) -> ScoresSection:
    """A published table's section: per machine the prior's scores and (`leave_one_group_out`)
    the leave-one-group-out calibrated ones. The fits take seconds: computed once per process
    (the text and --json views of one run, the tests), handed out as copies."""
    from cpbench.model.calibrate.published import validate_published  # noqa: PLC0415

    machines = [
        out.PublishedMachine.of(
            v,
            prior=out.MachineScores.of(v.prior),
            leave_one_group_out=None if v.held_out is None else out.MachineScores.of(v.held_out),
        )
        for v in validate_published(table, leave_one_group_out=leave_one_group_out)
    ]
    return ScoresSection(
        name=name, title=title, table=str(table), error_convention=convention, machines=machines
    )


def validate_published_report(path: str | None = None) -> PublishedReport:
    """`cpbench validate --published`: a list of sections, each a dataset with its scores
    (this module's CP-attention one, the end-to-end plans, and the out-of-sample check)."""
    return PublishedReport(
        mode="published",
        sections=[
            published_cp_attention_section(path),
            published_plan_section(),
            out_of_sample_section(),
        ],
    )


def published_plan_section() -> PlanSection:
    """The end-to-end section of `validate --published`: `cpbench plan` per published training
    run (`model.plan.validation`), predicted vs published tokens/s/GPU (or TFLOP/s/GPU) and
    memory with what the published number counts."""
    from cpbench.model.plan.validation import (  # noqa: PLC0415
        END_TO_END_TABLE,
        end_to_end_json,
        validate_end_to_end,
    )

    return PlanSection(
        name="plan_end_to_end",
        title="cpbench plan vs published training runs (tokens/s/GPU)",
        table=END_TO_END_TABLE,
        error_convention="error = predicted / published - 1; tokens/s/GPU = global batch x "
        "L / step / GPUs; TFLOP/s/GPU = model FLOPs (MFU convention) / step / GPUs; a "
        "'calibrate' row fixes its machine's peak scale and is not a validation",
        rows=[PlanCheck.model_validate(r) for r in end_to_end_json(validate_end_to_end())],
    )
