"""`cpbench calibrate` and `cpbench validate`: thin typer wrappers registered on
`cpbench.cli.common.app`; the work is in `cpbench.app.calibrate`, the output in
`cpbench.render.recommend.calibration`."""

from __future__ import annotations

from typing import Annotated

import typer

from cpbench.cli import options as o
from cpbench.cli.common import command, emit
from cpbench.render.recommend.calibration import (
    render_calibration,
    render_published,
    render_validation,
)


@command
def calibrate(
    results: Annotated[
        list[str],
        typer.Argument(
            help="JSONL results files of `cpbench sweep`, or tables of measured step times "
            "(CSV or JSONL rows: shape, mask, mesh, layout, exchange, phase, dtype, GPU, step "
            "time; docs/cost-model.md)."
        ),
    ],
    output: o.OutputOrNone = None,
    hardware: o.Hardware = None,
    name: o.Name = None,
    as_json: o.Json = False,
) -> None:
    """Fit a hardware profile to measured results (least squares).

    Link latency and busbw per collective kind and tier from the comm-only times, the kernel
    efficiency curve and step overhead from the compute-only times (when recorded), then one
    joint fit of kernel throughput, step overhead, links and overlap to every measured time,
    step times alone included (regularised toward the prior). Prints every parameter before
    and after, whether the data determine it or it stays at the prior, and the residual.
    """
    from cpbench.app import calibrate as service  # noqa: PLC0415

    report = service.calibrate_results(results, hardware, output, name)
    emit(report.model_dump(mode="json"), as_json, lambda: [render_calibration(report)])


@command
def validate(
    results: Annotated[
        list[str] | None,
        typer.Argument(
            help="JSONL results files of `cpbench sweep`, or tables of measured step times "
            "(docs/cost-model.md); none with --published."
        ),
    ] = None,
    hardware: o.Hardware = None,
    holdout: o.Holdout = False,
    holdout_fraction: o.HoldoutFraction = 0.5,
    seed: o.Seed = 0,
    split: o.SplitChoice = "stratified",
    calibrate_first: o.CalibrateFirst = False,
    published: o.Published = False,
    as_json: o.Json = False,
) -> None:
    """Predicted vs measured step time per configuration, with the median and max absolute
    percentage error, the Spearman rank correlation and the regret of the model's pick."""
    from cpbench.app import calibrate as service  # noqa: PLC0415
    from cpbench.errors import CpbenchError  # noqa: PLC0415

    if published:
        if results:
            raise CpbenchError(
                f"--published scores the shipped dataset: give no results files with it "
                f"(got {', '.join(results)})"
            )
        document = service.validate_published_report()
        emit(document.model_dump(mode="json"), as_json, lambda: render_published(document))
        return
    if not results:
        raise CpbenchError("validate needs results files (or --published)")
    holdout = holdout or holdout_fraction != 0.5
    report = service.validate_results(
        results, hardware, holdout, holdout_fraction, seed, split, calibrate_first
    )
    emit(report.model_dump(mode="json"), as_json, lambda: render_validation(report))
