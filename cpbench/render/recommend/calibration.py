"""Rich renderables of the calibrate and validate reports (the typed reports of
`cpbench.app.calibrate_schema` that `cpbench.app.calibrate` returns)."""

from __future__ import annotations

from collections import Counter

from rich.console import Group, RenderableType
from rich.text import Text

from cpbench.app.calibrate_schema import (
    CalibrationReport,
    CalibrationSummary,
    FitParameter,
    HoldoutReport,
    MachineScores,
    PlanSection,
    PublishedReport,
    ValidationReport,
)
from cpbench.render.tables import FitTable
from cpbench.units import format_number, format_percent, format_seconds


def render_validation(report: ValidationReport | HoldoutReport) -> list[RenderableType]:
    """Rich renderables of a validate report."""
    title = f"Predicted vs measured ({report.mode}, profile {report.profile})"
    if isinstance(report, HoldoutReport):
        title += (
            f": calibrated on {report.n_train}, predicting {report.n_test} held out "
            f"({report.split} split, seed {report.seed})"
        )
    table = FitTable(title=title)
    table.add_columns(("configuration", "measured ms", "predicted ms", "error"),
                      left=("configuration",), key=("configuration",), wrap=("configuration",))
    for r in report.rows:
        table.add_row(Text(r.config), format_seconds(r.measured_s, 2, unit=False),
                      format_seconds(r.predicted_s, 2, unit=False),
                      format_percent(r.error, sign=True))
    summary = Text(
        f"median |error| {format_percent(report.median_abs_error)}, max |error| "
        f"{format_percent(report.max_abs_error)}, Spearman {format_number(report.spearman)}, regret of the "
        f"model's pick {format_percent(report.regret)} (worst group; mean {format_percent(report.regret_mean)})"
    )
    out: list[RenderableType] = [table, summary]
    out += [Text(f"warning: {w}", style="yellow") for w in report.warnings]
    out += [
        Text(f"  group of {g.configurations}: model picks {g.chosen}, measured best {g.best}, "
             f"regret {format_percent(g.regret)}", style="dim")
        for g in report.groups
        if g.configurations > 1
    ]
    if report.calibration:
        out.append(render_calibration(report.calibration))
    return out


def _data(param: FitParameter) -> str:
    """How well the data pin a joint-fit parameter down; `linear` for the linear fits'."""
    if param.status is None:
        return "linear fit"
    misfit = ", MISFIT" if param.misfit else ""
    return f"{param.status} (sd {param.posterior_sd:.2f} of {param.prior_sd:.2f}){misfit}"


def render_calibration(report: CalibrationSummary) -> RenderableType:
    """Rich renderable of a calibration summary (a `cpbench calibrate` report's warnings and
    written file too)."""
    table = FitTable(
        title=(
            f"Calibration of {report.prior} on {report.points} measurements: RMS relative "
            f"step-time error {format_percent(report.residual_before)} -> "
            f"{format_percent(report.residual)}"
        ),
        caption=(
            "prior and fitted in the unit of the unit column (no unit: dimensionless); joint "
            "fit: residuals are RMS log errors, data = determined (posterior sd of the log <= "
            "5%), constrained (below half the prior sd) or undetermined (the data do not pin it: "
            "its value is no evidence), with the posterior sd vs the prior sd"
        ),
    )
    table.add_columns(("fit", "parameter", "prior", "fitted", "unit", "points", "data"),
                      right=("prior", "fitted", "points"), key=("parameter",),
                      wrap=("fit", "parameter"))
    for fit in report.fits:
        label = (
            f"{fit.target} ({fit.points} pts, RMS {format_percent(fit.residual_before)} "
            f"-> {format_percent(fit.residual_after)})"
        )
        for i, param in enumerate(fit.parameters):
            table.add_row(Text(label if i == 0 else ""), Text(param.name), f"{param.prior:.4g}",
                          f"{param.fitted:.4g}", param.unit, str(param.points), _data(param))
    misfits = [p.misfit for fit in report.fits for p in fit.parameters if p.misfit]
    notes = [Text(f"warning: {m}", style="yellow") for m in misfits]
    notes += [Text(f"note: {n}", style="dim") for n in report.notes]
    if isinstance(report, CalibrationReport):  # not the calibration inside a validation
        notes[:0] = [Text(f"warning: {w}", style="yellow") for w in report.warnings]
        if report.output:
            notes.append(Text(f"wrote {report.output} (load it with --hardware {report.output})"))
    return Group(table, *notes)


def _score_cells(scores: MachineScores | None) -> tuple[str, str, str]:
    """|error|, Spearman and regret of a machine's scores, `-` for each one missing."""
    if scores is None:
        return ("-", "-", "-")
    error, spearman, regret = scores.median_abs_error, scores.spearman, scores.worst_regret
    return (
        "-" if error is None else format_percent(error),
        "-" if spearman is None else format_number(spearman),
        "-" if regret is None else format_percent(regret),
    )


def render_published(report: PublishedReport) -> list[RenderableType]:
    """Rich renderables of `validate --published`: one table per section, a row per machine
    with the prior's and the leave-one-group-out calibrated scores."""
    from cpbench.render.plan import render_published_plans  # noqa: PLC0415

    out: list[RenderableType] = []
    for section in report.sections:
        if isinstance(section, PlanSection):  # the end-to-end section: one row per published run
            out += render_published_plans(section)
            continue
        # a section scored by the prior alone (the out-of-sample check) has no LOGO columns
        fitted = any(m.leave_one_group_out for m in section.machines)
        table = FitTable(
            title=f"{section.title}: the model vs published measurements ({section.table})",
            caption=section.error_convention + (
                "; LOGO = calibrated on the machine's other groups, predicting the held-out one"
                if fitted else ""
            ),
        )  # fmt: skip
        columns = ("hardware", "profile", "rows", "groups", "prior |err|", "prior Spearman",
                   "prior regret") + (("LOGO |err|", "LOGO Spearman", "LOGO regret")
                                      if fitted else ())  # fmt: skip
        table.add_columns(columns, left=("hardware", "profile"), key=("hardware",),
                          wrap=("hardware",))
        for m in section.machines:
            table.add_row(
                Text(m.hardware), m.profile, str(m.rows), str(m.groups), *_score_cells(m.prior),
                *(_score_cells(m.leave_one_group_out) if fitted else ()),
            )  # fmt: skip
        out.append(table)
        for m in section.machines:
            if m.warning:
                out.append(Text(f"{m.hardware}: {m.warning}", style="yellow"))
            cited = Counter(source.split(", ")[0] for source in m.sources)
            out += [
                Text(f"{m.hardware}: {n} row source(s) from {where} (each cell: --json)",
                     style="dim")
                for where, n in cited.items()
            ]  # fmt: skip
    return out
