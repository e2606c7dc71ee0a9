"""`cpbench tune`: a thin typer wrapper registered on `cpbench.cli.common.app`; the work is in
`cpbench.app.tune` (the loop: `cpbench.model.tune`), the output in `cpbench.render.tune`."""

from __future__ import annotations

from dataclasses import replace

import typer

from cpbench.cli import options as o
from cpbench.cli.common import command, emit, err_console, options_request
from cpbench.cli.recommend import cp_comms


@command
def tune(
    heads: o.Heads,
    kv_heads: o.KvHeads,
    seq_len: o.SeqLen = 131072,
    head_dim: o.HeadDim = 128,
    batch: o.Batch = o.DEFAULTS["batch"],
    gpus: o.Gpus = 8,
    gpus_per_node: o.GpusPerNode = None,
    hardware: o.Hardware = None,
    dtype: o.DtypeName = o.DEFAULTS["dtype"],
    causal: o.Causal = o.DEFAULTS["causal"],
    documents: o.Documents = None,
    window: o.WindowOption = None,
    seed: o.Seed = 0,
    tp: o.Tp = 1,
    pp: o.Pp = 1,
    cp: o.CpOrNone = None,
    grad_accum: o.GradAccum = 1,
    phase: o.PhaseChoice = o.DEFAULTS["phase"],
    cp_comm: o.CpCommOrNone = None,
    oracle: o.OracleOrNone = None,
    out: o.Out = None,
    resume: o.Resume = False,
    max_runs: o.MaxRuns = None,
    budget: o.BudgetOrNone = None,
    output: o.OutputOrNone = None,
    as_json: o.Json = False,
) -> None:
    """Pick the fastest candidate by measuring only what the model cannot decide.

    Ranks recommend's candidates by the model with their uncertainty, measures the one most
    likely to beat the pick by more than 3% (the pick itself first), corrects the model by
    what it measured, and stops when no candidate is 3% faster with probability 5% or more,
    when every candidate that could be is measured, or at --max-runs / --budget (seconds
    of measurement; a replay counts the measured step times) (docs/tune.md). --oracle FILE replays: each measurement is the file's row for the
    candidate (a cpbench results JSONL, or a CSV in the columns of the published tables);
    a candidate it lacks cannot be measured. Prints the pick with its probability and its
    framework settings, every candidate's status, and what was measured against measuring
    everything; -o writes the profile calibrated on the measurements (`recommend
    --hardware FILE` reads it).
    """
    from cpbench.app import tune as service  # noqa: PLC0415 - keep `cpbench --help` fast
    from cpbench.app.recommend.types import RecommendRequest  # noqa: PLC0415
    from cpbench.bench.pool import start_forkserver_early  # noqa: PLC0415
    from cpbench.cli.sweep import wrong_results  # noqa: PLC0415
    from cpbench.errors import EXIT_WRONG_RESULT, CpbenchError  # noqa: PLC0415
    from cpbench.model.tune import DEFAULT_SETTINGS  # noqa: PLC0415
    from cpbench.render.tune import render_tune  # noqa: PLC0415

    request = options_request(RecommendRequest, locals(), top=0, cp_comms=cp_comms(cp_comm))
    settings = replace(DEFAULT_SETTINGS, max_runs=max_runs, budget_s=budget)
    if oracle is not None:
        if out is not None or resume:
            raise CpbenchError("--out / --resume measure here: leave them out with --oracle")
        run = service.tune_with_oracle(request, oracle, settings)
        records: list[dict[str, object]] = []
    else:
        start_forkserver_early("auto")  # its imports beside this process's (bench/pool.py)
        run, records = service.tune_by_measuring(request, out, resume, settings)
    written = service.write_tuned_profile(run, output) if output else None
    report = service.tune_report(run, written)
    emit(report.model_dump(mode="json"), as_json, lambda: render_tune(report))
    wrong = wrong_results(records)
    if wrong:
        for reason, ids in wrong.items():
            err_console.print(f"FAILED: {reason}: {', '.join(ids)}", markup=False)
        raise typer.Exit(EXIT_WRONG_RESULT)
