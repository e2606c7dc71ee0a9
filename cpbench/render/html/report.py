"""The report page (`render_report`): its sections in page order, each a figure of
`cpbench.render.figures` with how to read it (or why there is none), and the tables of the
recommendation, the packed-documents work, the whole-model plan and every record."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from cpbench.app.report.data import NO_PROFILE_NOTE, ReportData, ReportRecommendation
from cpbench.render.figures import (
    balance,
    communication,
    dynamic,
    inference,
    memory,
    prediction,
    timing,
)
from cpbench.render.html.document import Page, RecommendationView, Section, render_page
from cpbench.render.html.tables import Column, record_columns, records_table, table
from cpbench.render.recommend.explanation import explanation_text
from cpbench.render.recommend.frameworks import setting_note
from cpbench.results.frame import PHASE_ORDER, ok_rows, phases_of


def recommendation_view(rec: ReportRecommendation | None, note: str | None) -> RecommendationView:
    """The recommendation with its tables (those with rows) laid out."""
    if rec is None:
        return RecommendationView(None, note)
    if rec.explanation is not None or rec.frameworks:
        settings = [(f.framework, f.settings, setting_note(f)) for f in rec.frameworks]
        summary = explanation_text(rec.explanation) if rec.explanation else rec.summary
        rec = replace(rec, summary=summary, settings=settings)
    tables = []
    for i, (caption, rows) in enumerate(rec.tables):
        if not rows:
            continue
        keys = list(dict.fromkeys(k for row in rows for k in row))
        frame = pd.DataFrame(rows, columns=keys)
        columns = [Column(k, k) for k in keys]
        tables.append((caption, table(frame, columns, table_id=f"recommendation-table-{i}")))
    return RecommendationView(rec, note, tables)


def _missing_phases_note(frame: pd.DataFrame) -> str | None:
    present = set(phases_of(ok_rows(frame, "median_s")))
    if not present:
        return None
    missing = [p for p in PHASE_ORDER if p not in present]
    if not missing:
        return None
    return (
        f"No successful {' or '.join(missing)} measurement: "
        f"the {' and '.join(missing)} facets are left out of every chart."
    )


WORK_COLUMNS = (
    *record_columns("phase", "layout", "mesh", "seq_len", "mask"),
    Column("documents", "documents", "num"),
    Column("padding tokens", "padding", "num"),
    Column("run length", "run_seq_len", "num"),
    Column("step median ms", "median_s", "ms"),
    Column("slowest compute ms", "compute_s", "ms"),
    Column("work max/mean", "work_imbalance", "num"),
    Column("compute max/mean", "compute_imbalance", "num"),
    Column("r (ranks)", "correlation", "num"),
    *record_columns("id"),
)


def work_section(report: ReportData) -> Section:
    """Packed documents: the per-rank work figure and, per record, the padding each layout
    paid, its predicted and measured balance and its step time."""
    fits = report.work
    rows = (
        pd.concat([fit.records.assign(phase=fit.phase) for fit in fits], ignore_index=True)
        if fits
        else pd.DataFrame()
    )
    explain = (
        "Each rank's median compute-only time (communication removed) against the model's "
        "work for it: attended (query, key) pairs of its ring rank x B x its heads "
        "(cpbench.config.geometry.rank_pairs, a causal diagonal pair counts 1/2). The dotted "
        "line is the least-squares fit over every rank of the phase; r is Pearson's "
        "correlation, the largest error is |fit / measured - 1|. Padding is the tokens the "
        "layout added (doc_zigzag pads every document to a multiple of 2R)."
    )
    if fits:
        explain += " " + " ".join(
            f"Phase {fit.phase}: r = {'n/a' if fit.correlation is None else f'{fit.correlation:.3f}'} "
            f"over {len(fit.points)} ranks, largest error {fit.max_error * 100:.1f}%."
            for fit in fits
        )
    return Section(
        "packed-documents", "Packed documents: per-rank work and padding",
        explain,
        balance.work_balance_figure(fits),
        table=table(rows, WORK_COLUMNS, table_id="work-table") if not rows.empty else None,
        empty="No configuration with packed documents has per-rank compute times and predicted "
        "work.",
    )


def report_sections(report: ReportData) -> list[Section]:
    """The sections of a report, in page order."""
    frame = report.frame
    phase_note = _missing_phases_note(frame)
    heat_phase = timing.heatmap_phase(frame)
    return [
        Section(
            "step-time", "Step time",
            "Median over iterations of the slowest rank's step time; bars span p10-p90. "
            "Colour = U x R mesh, dash = layout.",
            timing.step_time_figure(frame),
            phase_note or None,
            empty="No successful configuration has a step time: nothing to plot.",
        ),
        Section(
            "throughput", "Achieved TFLOP/s",
            "Global attention FLOPs / median step time. "
            + (f"Convention: {report.flops_convention}." if report.flops_convention else ""),
            timing.throughput_figure(frame),
            report.peak_note,
            empty="No successful configuration reports achieved TFLOP/s.",
        ),
        Section(
            "communication", "Communication volume: analytic vs measured",
            "Bytes a rank sends per layer (forward, backward) from the formulas vs counted by "
            "the instrumented communicator; they must agree: a mismatch is a red cross.",
            communication.comm_bytes_figure(frame),
            empty="No configuration has both analytic and measured communication bytes.",
        ),
        Section(
            "bandwidth", "Achieved bandwidth",
            "Measured bytes per rank / communication-only time (algorithm bandwidth).",
            timing.bandwidth_figure(frame),
            empty="No configuration reports an achieved bandwidth.",
        ),
        Section(
            "overlap", "Compute / communication overlap",
            "Compute-only time plus exposed communication (step - compute) per configuration; "
            "overlap = (compute + comm - step) / min(compute, comm).",
            communication.overlap_figure(frame),
            empty="No configuration has compute-only and communication-only timings.",
        ),
        Section(
            "memory", "Peak memory per rank",
            "Measured peak per rank (max over ranks) against the analytic lower bound "
            "(activations of one attention layer, no model weights).",
            memory.memory_figure(frame),
            empty="No configuration reports its peak memory.",
        ),
        Section(
            "load-balance", "Causal load balance",
            "Per-rank time under a causal mask: contiguous leaves early ranks idle, zigzag and "
            "striped spread the work.",
            balance.load_balance_figure(frame),
            empty="No causal multi-rank configuration has per-rank timings.",
        ),
        work_section(report),
        Section(
            "mesh-heatmap", "U x R mesh",
            f"Median step time of each Ulysses x Ring mesh per sequence length (phase {heat_phase})."
            if heat_phase
            else "",
            timing.heatmap_figure(frame),
            empty="No successful configuration has a step time: no U x R map.",
        ),
        Section(
            "prediction", "Predicted vs measured",
            "Cost-model step time for the hardware profile vs the measurement.",
            prediction.prediction_figure(frame),
            report.prediction_note,
            empty=NO_PROFILE_NOTE,
        ),
        Section(
            "recommendation", "Recommendation",
            "The best configuration for the measured workload and the settings to reproduce it.",
            recommendation=recommendation_view(report.recommendation, report.recommendation_note),
        ),
        *plan_sections(report),
        *inference_sections(report),
        *dynamic_sections(report),
        Section(
            "records", "All records",
            "Click a column header to sort. Failed, skipped and timed-out configurations are "
            "listed with their error.",
            table=records_table(frame),
        ),
    ]


PLAN_COLUMNS = [
    Column("#", "rank", "num"),
    Column("plan", "label"),
    Column("step (s per optimizer step)", "step_s", "num"),
    Column("attention share", "attention_share", "pct"),
    Column("tokens/s/GPU", "tokens_per_s_per_gpu", "num"),
    Column("MFU", "mfu", "pct"),
    Column("memory / rank", "memory_bytes", "bytes"),
    Column("longest L", "max_seq_len", "num"),
]


def plan_sections(report: ReportData) -> list[Section]:
    """The whole-model plan (`cpbench report --model`): feasible plans by step time, the
    rejected ones with the component that overflows. None without a model."""
    plan = report.plan
    if plan is None:
        return []
    inputs, conventions = plan.inputs, plan.conventions
    feasible = pd.DataFrame([p.model_dump() for p in plan.feasible])
    explain = (
        f"{inputs.model.get('name', '')} at L = {inputs.seq_len} on {inputs.gpus} GPUs "
        f"({inputs.hardware}): every TP x CP x PP x DP x recompute plan that fits, fastest "
        f"first. Step in seconds per optimizer step (the plan's parts: "
        f"{conventions.get('time', '')}); {conventions.get('mfu', '')}; "
        f"{conventions.get('memory', '')}."
    )
    note = None if not feasible.empty else "No plan fits: see the rejected plans."
    rejected = pd.DataFrame([x.model_dump() for x in plan.rejected])
    sections = [
        Section(
            "plan", "Whole-model plan", explain, note=note,
            table=None if feasible.empty else table(feasible, PLAN_COLUMNS, table_id="plan-table"),
        )
    ]
    if not rejected.empty:
        columns = [Column("plan", "label"), Column("why rejected", "rule")]
        sections.append(
            Section(
                "plan-rejected", "Plans that do not fit",
                "The component that overflows, with the longest sequence the plan holds.",
                table=table(rejected, columns, table_id="plan-rejected-table"),
            )
        )
    return sections


INFERENCE_TABLE_COLUMNS = [
    *record_columns("phase"),
    Column("scheme / cache", "how"),
    Column("W", "world_size", "num"),
    Column("P cached", "cached_len", "num"),
    Column("T new", "new_tokens", "num"),
    Column("B", "batch", "num"),
    Column("TTFT ms", "ttft_s", "ms"),
    Column("latency ms/token", "per_token_latency_s", "ms"),
    Column("tokens/s", "tokens_per_s", "num"),
    Column("KV/rank measured", "kv_cache_bytes_measured", "bytes"),
    Column("KV/rank analytic", "kv_cache_bytes_analytic", "bytes"),
    Column("bytes = model", "bytes_match"),
    Column("max abs error", "max_abs_error", "num"),
    *record_columns("status", "id"),
]


def inference_sections(report: ReportData) -> list[Section]:
    """The inference records (prefill, decode): TTFT against the prompt per scheme, decode
    latency against the degree, the KV cache per rank, and their table. None without them."""
    frame = report.inference
    if frame is None or frame.empty:
        return []
    return [
        Section(
            "inference-ttft", "Inference: time to first token by scheme",
            "Seconds per prefill of T new tokens on P cached (median over iterations of the "
            "slowest rank's forward, shards in and out), one line per scheme (colour) and P "
            "(dash). pass-Q passes the queries and partial outputs, pass-KV the keys and "
            "values: pass-Q wins when T is small against P.",
            inference.ttft_figure(frame),
            None if (frame["phase"] == "prefill").any() else "No prefill records.",
        ),
        Section(
            "inference-decode", "Inference: decode latency per token by CP degree",
            "Seconds per decode step / T (inter-token latency), one line per cache layout "
            "(colour) and batch (dash), against the ranks the cache is sharded over.",
            inference.decode_latency_figure(frame),
            None if (frame["phase"] == "decode").any() else "No decode records.",
        ),
        Section(
            "inference-kv", "Inference: KV cache per rank",
            "Bytes of the K and V tensors a rank holds for the step (markers, the most of any "
            "rank) against the model's ceil((P + T) / W) tokens x 2 x KV heads x head dim x "
            "element bytes x B (dashed), one layer: the cache a rank must hold shrinks as 1/W.",
            inference.kv_capacity_figure(frame),
            table=table(frame, INFERENCE_TABLE_COLUMNS, table_id="inference-table"),
        ),
    ]


DYNAMIC_TABLE_COLUMNS = [
    Column("policy", "policy"),
    Column("W", "world_size", "num"),
    Column("sequences", "sequences", "num"),
    Column("tokens", "tokens", "num"),
    Column("C tokens/rank", "tokens_per_rank", "num"),
    Column("micro-batches", "micro_batches", "num"),
    Column("CP degree:sequences", "degrees"),
    Column("step ms measured", "median_s", "ms"),
    Column("95% low ms", "ci_low_s", "ms"),
    Column("95% high ms", "ci_high_s", "ms"),
    Column("step ms predicted", "predicted_s", "ms"),
    Column("idle measured", "idle_share", "pct"),
    Column("idle predicted", "predicted_idle_share", "pct"),
    Column("x static measured", "speedup_measured", "num"),
    Column("x static predicted", "speedup_predicted", "num"),
    Column("checks passed", "checks_passed", "num"),
    Column("groups", "checks", "num"),
    Column("profile", "hardware"),
    *record_columns("status", "id"),
]


def dynamic_sections(report: ReportData) -> list[Section]:
    """The dynamic-CP policies of a `[dynamic]` study: the batch's lengths, each policy's
    per-rank load, the measured against the predicted speedup over static CP, and their table.
    None without such records."""
    frame = report.dynamic
    if frame is None or frame.empty:
        return []
    return [
        Section(
            "dynamic-lengths", "Dynamic CP: the batch",
            "Sequence lengths of the global batch the policies schedule (whole sequences, "
            "drawn from the study's lengths source).",
            dynamic.length_histogram(frame),
            empty="No dynamic-CP record lists its batch.",
        ),
        Section(
            "dynamic-load", "Dynamic CP: per-rank load by policy",
            "Each rank's busy milliseconds in one instrumented step (working on its CP group) "
            "and idle ones (waiting for the micro-batch's slowest group), per policy; the "
            "idle share of the step beside each policy.",
            dynamic.rank_load_figure(frame),
            empty="No dynamic-CP policy was measured.",
        ),
        Section(
            "dynamic-speedup", "Dynamic CP: speedup over static, measured vs predicted",
            "The static policy's step / each policy's (measured: medians of interleaved "
            "rounds, the whiskers from the two 95% intervals; predicted: the cost model on the "
            "study's hardware profile).",
            dynamic.speedup_figure(frame),
            empty="No static record beside the other policies: no measured speedup.",
            table=table(frame, DYNAMIC_TABLE_COLUMNS, table_id="dynamic-table"),
        ),
    ]


def render_report(report: ReportData) -> Page:
    """The HTML report page of `report` (`cpbench.app.report.build_report`)."""
    return render_page(report, report_sections(report), report.profile_line)
