"""The sweep's `FitTable` of inference records: per record the TTFT or per-token latency beside
the reference, bytes and KV-cache checks, nccl-tests style (a value, then "=" where the count
equals the model). Renderers return renderables; the CLI prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from cpbench.render.tables import FitTable
from cpbench.units import format_memory, format_seconds

if TYPE_CHECKING:
    from cpbench.model.ties import Interval
    from cpbench.results.schema import (
        ConfigSection,
        InferenceConfigSection,
        InferenceSection,
        ResultRecord,
        TimingSection,
    )

INFERENCE_CAPTION = (
    "TTFT: seconds per prefill of T new tokens on P cached (median, max over ranks); "
    "lat/tok: seconds per decode step / T; +/-: half the 95% interval in % of the median; "
    "tok/s: B*T / step; best: the fastest scheme or cache layout of its group (same phase, "
    "P, T, B, heads, world) beyond the noise, 'tie' when the intervals overlap; bytes/rank: "
    "sent per rank per step, '=' the count at the torch.distributed boundary equals "
    "prefill_bytes / decode_bytes; KV/rank: the most KV-cache bytes a rank holds (one "
    "layer), '=' the measured tensors within 5% of kv_cache_bytes_per_rank; max err: max abs "
    "error vs the float64 reference"
)


def _size(value: float) -> str:
    """Bytes in KiB below 1 MiB (inference shards are small on CPU), else as `format_memory`."""
    return f"{value / 2**10:.1f} KiB" if value < 2**20 else format_memory(value)


def _group(record: ResultRecord) -> tuple[object, ...]:
    """The records that compete: one phase, P, T, shape and world; schemes (prefill) or cache
    layouts (decode) and kernels vary within it."""
    c, step = _step(record)
    return (
        step.phase, step.cached_len, step.new_tokens, c.batch, c.heads, c.kv_heads, c.head_dim,
        c.dtype, c.device, c.world_size,
    )  # fmt: skip


def _step(record: ResultRecord) -> tuple[ConfigSection, InferenceConfigSection]:
    """The record's configuration and its inference step (the sweep writes both)."""
    if record.config is None or record.config.inference is None:
        raise ValueError(f"record {record.id} is not an inference record (no config.inference)")
    return record.config, record.config.inference


def _best(records: list[ResultRecord]) -> dict[str, str]:
    """"best" or "tie (n)" for the leaders of each group (`ties.rank_with_ties`)."""
    from cpbench.model.ties import rank_with_ties  # noqa: PLC0415

    groups: dict[tuple[object, ...], dict[str, Interval]] = {}
    for r in records:
        if r.status == "ok" and r.timing is not None:
            groups.setdefault(_group(r), {})[r.id] = r.timing.interval()
    out: dict[str, str] = {}
    for intervals in groups.values():
        if len(intervals) < 2:
            continue
        ranked = rank_with_ties(intervals)
        for rid in ranked.tied:
            out[rid] = ranked.verdict
    return out


def _time_cell(timing: TimingSection, section: InferenceSection) -> str:
    median = timing.median
    low, high = timing.ci_low, timing.ci_high
    spread = "" if low is None or high is None else f" ±{(high - low) / 2 / median:.0%}"
    if section.phase == "prefill":
        return f"{format_seconds(section.ttft_s)}{spread}"
    return f"{format_seconds(section.per_token_latency_s, 2)}/tok{spread}"


def inference_table(records: list[ResultRecord]) -> FitTable:
    """One row per inference record; the best of each group in bold green, ties in yellow."""
    best = _best(records)
    table = FitTable(title="cpbench inference results", caption=INFERENCE_CAPTION, index=True)
    # the step's time beside its checks (error, bytes, KV-cache), then the rest
    columns = ["how", "P", "T", "TTFT|lat", "max err", "bytes/rank", "KV/rank", "best",
               "tok/s", "phase", "W", "B", "h/kv", "status"]  # fmt: skip
    table.add_columns(columns, left=("how", "best", "phase", "status"), wrap=("status",),
                      key=("how", "P", "T"))
    for r in records:
        c, step = _step(r)
        how = step.scheme if step.phase == "prefill" else step.cache_layout
        where = [step.phase, str(c.world_size), str(c.batch), f"{c.heads}/{c.kv_heads}"]
        cells: list[str | Text] = [str(how), str(step.cached_len), str(step.new_tokens)]
        style = None
        section, comm, timing = r.inference, r.comm, r.timing
        if r.status == "ok" and section and comm is not None and timing is not None:
            analytic = sum(comm.analytic_bytes.values())
            measured = max(sum(x) for x in zip(*comm.measured_bytes.values(), strict=True))
            if comm.match:
                traffic = f"{_size(analytic)} ="
            else:
                traffic = f"[bold red]{_size(analytic)} != {_size(measured)}[/]"
            ratio = section.kv_cache_ratio
            cache = section.kv_cache_bytes_analytic
            kv = f"{_size(cache)} =" if abs(ratio - 1) <= 0.05 else f"{_size(cache)} x{ratio:.2f}"
            label = best.get(r.id, "")
            if label:
                style = "bold green" if label == "best" else "yellow"
            error = r.accuracy.max_abs_error if r.accuracy else float("nan")
            cells += [
                _time_cell(timing, section), f"{error:.0e}", traffic, kv, label,
                f"{section.tokens_per_s:.3g}", *where, "ok",
            ]  # fmt: skip
        else:  # a failed check keeps its error beside the time it did not get
            shown = "-" if r.accuracy is None else f"{r.accuracy.max_abs_error:.0e}"
            cells += ["-", shown] + ["-"] * 4 + where + [Text(f"{r.status}: {r.error}")]
        table.add_row(*cells, style=style)
    return table
