"""`cpbench sweep` and `cpbench run`: thin typer wrappers around `cpbench.app.sweep.run_sweep`,
with a progress bar while it runs and a results table at the end."""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cpbench.cli import options as o
from cpbench.cli.common import command, console, err_console, resolve_device
from cpbench.config.constraints import check_cpu_world
from cpbench.config.inference import Workload
from cpbench.config.vocabulary import DEFAULT_DTYPE, INFERENCE_PHASES
from cpbench.errors import EXIT_INTERRUPTED, EXIT_WRONG_RESULT, CpbenchError
from cpbench.render.inference_table import inference_table
from cpbench.render.tables import dynamic_table, machine_lines, results_table, ties_lines

if TYPE_CHECKING:
    from cpbench.results.schema import ResultRecord


@command
def sweep(
    scenario: Annotated[
        str | None,
        typer.Argument(
            help="Scenario TOML path or shipped name (default: cpu-smoke without a "
            "GPU, gpu-node with GPUs)."
        ),
    ] = None,
    out: o.Out = None,
    device: o.DeviceOption = o.DEFAULT_DEVICE,
    resume: o.Resume = False,
    timeout: o.TimeoutOrNone = None,
    world_size: o.WorldSizeOrNone = None,
    precision: o.PrecisionOption = None,
    separate_ties: o.SeparateTies = False,
    yes: o.Yes = False,
) -> None:
    """Run every distinct configuration of a scenario once: correctness check (capped, and
    sampled rows at the full length), timing to a stated precision, overlap, counted bytes and
    peak memory, one JSONL record each, appended as it ends. Works unchanged under torchrun
    for several nodes.

    It first prints how many configurations it measures and about how long their timed steps
    take at the scenario's time budget; from a terminal, above 1,000 configurations it asks
    y/N first (--yes: it does not). One sweep at a time writes a results file (a second on
    the same --out is refused, naming the first); SIGTERM stops it as Ctrl-C does (exit 143)."""
    from cpbench.results.scenarios.loading import default_scenario, load_scenario  # noqa: PLC0415

    spec = load_scenario(scenario) if scenario else default_scenario(resolve_device(device))
    _run_and_report(
        spec, device, out, resume, timeout, world_size,
        precision=parse_precision(precision), separate_ties=separate_ties, yes=yes,
    )


def parse_precision(text: str | None) -> float | None | str:
    """--precision: None (the scenario's: "scenario"), "off" (None), or a width in (0, 1)."""
    if text is None:
        return "scenario"
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise CpbenchError(
            f"--precision ({text}) must be a relative width between 0 and 1 (0.05 = 5%) or 'off'"
        )
    return value


def _run_and_report(
    spec: Any,
    device: str,
    out: Path | None,
    resume: bool,
    timeout: float | None,
    world_size: int | None,
    single: bool = False,
    precision: float | None | str = "scenario",
    separate_ties: bool = False,
    yes: bool = False,
) -> None:
    """Run the sweep with a progress bar, print the table; exit 1 on any wrong result (and, for
    `cpbench run`, when its one configuration failed or timed out)."""
    from cpbench.bench.pool import start_forkserver_early  # noqa: PLC0415

    start_forkserver_early(device)  # its imports beside this process's (bench/pool.py)
    import torch  # noqa: PLC0415

    from cpbench.app.sweep import (  # noqa: PLC0415
        CONFIRM_ABOVE,
        default_output,
        estimate_sweep,
        run_sweep,
    )
    from cpbench.bench.launch import launched_rank  # noqa: PLC0415

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    launch = launched_rank()
    # Under torchrun / srun the launched world is the default (not the local GPUs, not 4).
    launched_world = None if launch is None or world_size is not None else launch.world_size
    dev, n = spec.resolve(device, gpus, launched_world)
    n = world_size or n
    if dev == "cuda" and launch is None and n > gpus:
        raise CpbenchError(
            f"world size ({n}) needs {n} local GPUs, found {gpus}: use torchrun for several nodes"
        )
    if dev == "cpu" and launch is None:
        check_cpu_world(n)
    if resume and out is None:
        raise CpbenchError("--resume needs --out FILE (the sweep to continue)")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise CpbenchError(f"--timeout ({timeout}) must be a positive, finite number of seconds")
    if world_size is not None and world_size < 1:
        raise CpbenchError(f"--world-size ({world_size}) must be at least 1")
    path = out or default_output(spec)
    points = spec.distinct(dev, n)
    study = spec.dynamic_study(dev, n)  # a batch that does not fit the ranks: before anything runs
    quiet = launch is not None and launch.rank != 0
    if not single:
        estimate = estimate_sweep(spec, points, precision, timeout, study)  # type: ignore[arg-type]
        if not quiet:
            console.print(estimate.line(), markup=False, highlight=False)
        if estimate.measured > CONFIRM_ABOVE and not yes and launch is None and in_terminal():
            if not typer.confirm("Start it?", default=False):
                raise CpbenchError(
                    f"not started ({estimate.measured:,} configurations): pass --yes to start "
                    "without asking, or narrow the scenario's axes"
                )
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )
    total = len(points) + (len(study.policies) if study is not None else 0)
    with progress:
        task = progress.add_task(f"{escape(spec.name)} (world {n}, {dev})", total=total)

        def on_start(config: Any) -> None:
            progress.update(task, description=f"{config.key}")

        def on_record(record: dict[str, Any]) -> None:
            progress.advance(task)

        result = run_sweep(
            spec,
            dev,
            n,
            path,
            resume=resume,
            timeout=timeout,
            on_record=on_record,
            on_start=on_start,
            precision=precision,  # type: ignore[arg-type]
            separate_ties=separate_ties,
        )
        # an interrupted sweep's bar stays where it stopped: a full one would say it finished
        finished = None if result.interrupted else total
        progress.update(task, completed=finished, description=escape(spec.name))
    wrong = wrong_results(result.records)
    if quiet:
        if wrong:
            raise typer.Exit(EXIT_WRONG_RESULT)
        return
    records = result.results
    inference = [r for r in records if _is_inference(r)]
    dynamic = [r for r in records if _is_dynamic(r)]
    training = [r for r in records if not _is_inference(r) and not _is_dynamic(r)]
    if training or not (inference or dynamic):
        console.print(results_table(training))
    if inference:
        console.print(inference_table(inference))
    if dynamic:
        # only here: the results store imports pandas, which `cpbench --help` does not load
        from cpbench.results.store import read_results  # noqa: PLC0415

        baselines = [r for r in read_results(path) if _is_dynamic(r)]
        console.print(dynamic_table(dynamic, baselines))
    for line in ties_lines(training):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in machine_lines(records):
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(result.counts().items()))
    merged = (
        f"; {result.duplicates} equivalent point(s) measured once as another"
        if result.duplicates
        else ""
    )
    console.print(  # the path is the user's: no markup read into it
        f"{len(result.records)} configurations ({counts or 'none'}; {result.resumed} already in "
        f"the file{merged}) in {result.wall_seconds:.1f} s -> {path}",
        markup=False,
        highlight=False,
    )
    if result.interrupted:
        console.print("[yellow]interrupted: every configuration finished so far is saved[/]")
        raise typer.Exit(EXIT_INTERRUPTED - signal.SIGINT + result.signal)
    for reason, ids in wrong.items():
        console.print(
            f"[bold red]FAILED: {escape(reason)} for {len(ids)} configuration"
            f"{'s' if len(ids) > 1 else ''}: {escape(', '.join(ids))}[/]",
            soft_wrap=True,
        )
    if wrong:
        raise typer.Exit(EXIT_WRONG_RESULT)
    not_run = [r for r in records if r.status != "ok"] if single else []
    for r in not_run:  # `cpbench run`: its one configuration did not run
        err_console.print(f"cpbench: failed: {r.status}: {r.error}", markup=False, highlight=False)
    if not_run:
        raise typer.Exit(EXIT_WRONG_RESULT)


def _is_inference(record: ResultRecord) -> bool:
    """An inference point's record (`config.inference` set; `is_inference_record` of a dict)."""
    return record.config is not None and record.config.inference is not None


def _is_dynamic(record: ResultRecord) -> bool:
    """A dynamic-CP policy's record (`schema.is_dynamic_record` of a dict): its `dynamic`
    section, or for one that did not run its config's scheme "dynamic"."""
    return record.dynamic is not None or (
        record.config is not None and record.config.scheme == "dynamic"
    )


def in_terminal() -> bool:
    """Whether a person is there to answer (stdin is a terminal)."""
    return sys.stdin.isatty()


def wrong_results(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Ids of the records whose result is wrong, by reason: a failed reference check, or
    measured bytes that differ from the analytic bytes. A configuration that crashed, ran out of
    memory or timed out measured nothing wrong: it is recorded, and the sweep still passes.
    Only the records of this invocation count: those already in the file (`--resume`) were
    judged by the run that wrote them."""
    wrong: dict[str, list[str]] = {}
    for r in records:
        accuracy, comm = r.get("accuracy") or {}, r.get("comm") or {}
        if accuracy.get("passed") is False:
            wrong.setdefault("result differs from the reference", []).append(r["id"])
        if r["status"] == "ok" and comm.get("match") is False:
            wrong.setdefault("measured bytes != analytic bytes", []).append(r["id"])
        checks = (r.get("dynamic") or {}).get("checks") or {}
        if checks and checks.get("passed") != checks.get("groups"):
            wrong.setdefault("a routed group differs from the reference", []).append(r["id"])
    return wrong


@command
def run(
    seq_len: o.SeqLen = 4096,
    heads: o.Heads = 8,
    kv_heads: o.KvHeadsOrNone = None,
    head_dim: o.HeadDim = 64,
    batch: o.Batch = o.DEFAULTS["batch"],
    ulysses: o.Ulysses = o.DEFAULTS["ulysses"],
    ring: o.Ring = 2,
    layout: o.LayoutChoice = o.DEFAULTS["layout"],
    dtype: o.DtypeOrNone = None,
    causal: o.Causal = o.DEFAULTS["causal"],
    documents: o.Documents = None,
    window: o.WindowOption = None,
    seed: o.Seed = 0,
    phase: o.StepPhase = o.DEFAULTS["phase"],
    cached_len: o.CachedLen = 0,
    new_tokens: o.NewTokens = None,
    scheme: o.SchemeOption = o.DEFAULT_SCHEME,
    cache_layout: o.CacheLayoutChoice = o.DEFAULT_CACHE_LAYOUT,
    kernel: o.KernelChoice = o.DEFAULTS["kernel"],
    warmup: o.Warmup = 1,
    iters: o.Iters = 5,
    precision: o.PrecisionOption = None,
    device: o.DeviceOption = o.DEFAULT_DEVICE,
    out: o.Out = None,
    timeout: o.Timeout = 600.0,
    impl: o.ImplChoice = o.DEFAULTS["impl"],
) -> None:
    """Measure one configuration (world size = ulysses x ring) and print its record.

    --kv-heads defaults to --heads (MHA), --dtype to float32 on CPU and bfloat16 on CUDA."""
    from cpbench.results.scenarios.loading import parse_scenario  # noqa: PLC0415

    dev = resolve_device(device)
    axes: dict[str, Any] = {
        "seq_len": seq_len,
        "batch": batch,
        "heads": heads,
        "kv_heads": heads if kv_heads is None else kv_heads,
        "head_dim": head_dim,
        "dtype": dtype or DEFAULT_DTYPE[dev],
        "causal": causal,
        "mesh": [f"{ulysses}x{ring}"],
        "layout": layout,
        "backend": kernel,
        "phase": phase,
        "impl": impl,
        "documents": documents,
        "window": window,
    }
    # an option of the other kind of step, given a value of its own, is refused, not ignored
    kind: Workload = "inference" if phase in INFERENCE_PHASES else "training"
    given = o.other_kind_given(run, locals(), kind)
    if given:
        label = "training" if kind == "inference" else "inference (prefill, decode)"
        raise CpbenchError(
            f"{', '.join(given)}: {label} option(s), not used by --phase {phase}: leave them out"
        )
    if phase in INFERENCE_PHASES:  # the step's own axes: its mesh and shards are its scheme's
        if new_tokens is None:
            raise CpbenchError(f"--phase {phase} needs --new-tokens (T, the step's new tokens)")
        how = {"scheme": scheme} if phase == "prefill" else {"cache_layout": cache_layout}
        training = ("seq_len", "mesh", "layout", "impl", "documents", "window", "causal")
        axes = {k: v for k, v in axes.items() if k not in training}
        axes |= {"cached_len": cached_len, "new_tokens": new_tokens, **how}
    spec = parse_scenario(
        {
            "name": "run",
            "description": "cpbench run",
            "world_size": ulysses * ring,
            "device": dev,
            "warmup": warmup,
            "iters": iters,
            "timeout": timeout,
            "seed": seed,
            "axes": axes,
        },
        "<cpbench run>",
    )
    ((config, feasibility),) = spec.expand(dev, ulysses * ring)
    feasibility.raise_if_infeasible()
    from cpbench.app.sweep import impl_skip_reason  # noqa: PLC0415

    reason = impl_skip_reason(config)
    if reason:
        raise CpbenchError(f"impl {impl!r} cannot run this configuration: {reason}")
    _run_and_report(
        spec, dev, out, False, timeout, None, single=True, precision=parse_precision(precision)
    )
