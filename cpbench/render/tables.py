"""Rich tables for the measurement commands (sweep / run results, the verify matrix) and
`FitTable`, which picks its layout from the console width when printed, so each table reads
whole at 80 columns or in a pipe without cutting a word or a number. Only the CLI prints."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text, TextType

from cpbench.config.constraints import required_kv_replication
from cpbench.units import format_memory, format_seconds

if TYPE_CHECKING:
    from cpbench.app.compare import Comparison, ComparisonRow
    from cpbench.app.verify import VerifyRow
    from cpbench.model.ties import Ranked
    from cpbench.results.schema import (
        CommSection,
        ConfigSection,
        FlopsSection,
        ResultRecord,
        TimingSection,
    )

# --------------------------------------------------------------------- fitting the width

#: A prose column never gets narrower than this (or than its longest word, or its full text).
WRAP_FLOOR = 16

Narrow = Literal["split", "stack"]


@dataclass
class _Col:
    """One column as `FitTable` lays it out: header and cells as Text, and how it may shrink."""

    header: Text
    cells: list[Text]
    justify: JustifyMethod = "left"
    key: bool = False
    wrap: bool = False
    priority: int = 1

    @property
    def natural(self) -> int:
        """Width with every cell and the header on one line."""
        return _widest([self.header, *self.cells])

    @property
    def minimum(self) -> int:
        """Narrowest width that cuts no word: a number column keeps each cell on its line (its
        header may wrap between words); a prose column wraps between words."""
        if not self.wrap:
            return max(_widest(self.cells), _widest([self.header], words=True))
        return max(_widest([self.header, *self.cells], words=True), min(self.natural, WRAP_FLOOR))


def _widest(texts: Iterable[Text], words: bool = False) -> int:
    """Cells of the widest line (or with `words` the widest word) of `texts`."""
    pieces = (piece for t in texts for piece in (t.plain.split() if words else t.plain.split("\n")))
    return max(map(cell_len, pieces), default=0)


def _as_text(cell: RenderableType | None) -> Text:
    if cell is None:
        return Text("")
    if isinstance(cell, Text):
        return cell.copy()
    if isinstance(cell, str):
        return Text.from_markup(cell)
    raise TypeError(f"FitTable cells are str or rich Text, got {type(cell).__name__}")


class FitTable(Table):
    """A rich `Table` that fits the console width and never cuts a word or a number.

    Add columns and rows as to a `Table`; `add_column` also takes `key` (the column names the row:
    it is repeated in every part of a split table), `wrap` (prose that may wrap between words;
    other columns keep each cell on one line) and `priority` (lower fills the first part first).
    At render time, from `options.max_width`:

    1. the whole table, as `Table` would print it, when it fits on one line per cell;
    2. else the whole table with its prose columns wrapped between words;
    3. else (`narrow="split"`) the columns in parts, each a table of its own that repeats the key
       columns (and a "#" row number with `index=True`), or (`narrow="stack"`, or when even one
       column beside the keys does not fit) one block of header / value lines per row.
    """

    def __init__(
        self,
        *headers: str,
        index: bool = False,
        narrow: Narrow = "split",
        **kwargs: Any,
    ) -> None:
        self._fit: list[tuple[bool, bool, int]] = []
        self.index = index
        self.narrow: Narrow = narrow
        super().__init__(*headers, **kwargs)

    def add_column(
        self,
        header: RenderableType = "",
        footer: RenderableType = "",
        *,
        key: bool = False,
        wrap: bool = False,
        priority: int = 1,
        **kwargs: Any,
    ) -> None:
        """`Table.add_column`, plus how the column behaves when the table is too wide."""
        super().add_column(header, footer, **kwargs)
        self._fit.append((key, wrap, priority))

    def add_columns(
        self,
        headers: Iterable[str],
        *,
        left: Collection[str] | None = None,
        right: Collection[str] = (),
        key: Collection[str] = (),
        wrap: Collection[str] = (),
        first: Collection[str] = (),
    ) -> None:
        """One `add_column` per header: those in `right` right-justified (or, given `left`, all
        but those in `left`), those in `first` with priority 0."""
        for header in headers:
            flush_left = header in left if left is not None else header not in right
            self.add_column(
                header,
                justify="left" if flush_left else "right",
                key=header in key,
                wrap=header in wrap,
                priority=0 if header in first else 1,
            )

    # ------------------------------------------------------------------ layout
    def _columns(self) -> list[_Col]:
        return [
            _Col(_as_text(c.header), [_as_text(x) for x in c.cells], c.justify, key, wrap, prio)
            for c, (key, wrap, prio) in zip(self.columns, self._fit, strict=True)
        ]

    def _extra(self, n: int, edge: bool | None = None) -> int:
        """Border and padding characters of a table of n columns (box edges, 1 space each side)."""
        edge = self.show_edge if edge is None else edge
        return (2 if self.box and edge else 0) + (n - 1 if self.box else 0) + 2 * n

    def _widths(self, cols: list[_Col], width: int, edge: bool | None = None) -> list[int] | None:
        """Content widths that fit `width` cutting no word, or None when no such widths exist."""
        room = width - self._extra(len(cols), edge)
        natural = [c.natural for c in cols]
        if sum(natural) <= room:
            return natural
        widths = [c.minimum for c in cols]
        if sum(widths) > room:
            return None
        # the spare room goes first to the headers of the number columns (a few characters keep
        # each on one line), then to the prose columns, the nearest to one line per cell first
        spare = room - sum(widths)
        for i in sorted(range(len(cols)), key=lambda i: (cols[i].wrap, natural[i] - widths[i])):
            grow = min(spare, natural[i] - widths[i])
            widths[i] += grow
            spare -= grow
        return widths

    def _like(self, title: TextType | None, caption: TextType | None, **settings: Any) -> Table:
        """An empty rich `Table` with this table's box and title and caption styles."""
        return Table(title=title, caption=caption, box=self.box, title_style=self.title_style,
                     caption_style=self.caption_style, **settings)

    def _table(
        self, cols: list[_Col], widths: list[int], title: TextType | None, caption: TextType | None
    ) -> Table:
        table = self._like(title, caption, show_edge=self.show_edge, show_header=self.show_header,
                           show_lines=self.show_lines, header_style=self.header_style)
        for col, w in zip(cols, widths, strict=True):
            table.add_column(col.header, justify=col.justify, width=w, overflow="fold")
        for r, row in enumerate(self.rows):
            table.add_row(
                *(c.cells[r] for c in cols), style=row.style, end_section=row.end_section
            )
        return table

    def layouts(self, width: int) -> list[Table]:
        """The tables this renders as at `width` columns (one, or the parts of a split)."""
        cols = self._columns()
        widths = self._widths(cols, width)
        if widths is not None:
            return [self._table(cols, widths, self.title, self.caption)]
        parts = self._split(cols, width) if self.narrow == "split" else None
        if parts is None:
            return [self._stack(cols, width)]
        title = self.title.plain if isinstance(self.title, Text) else self.title or ""
        return [
            self._table(part, part_widths, f"{title} ({n}/{len(parts)})".strip(),
                        self.caption if n == len(parts) else None)
            for n, (part, part_widths) in enumerate(parts, 1)
        ]

    def _split(self, cols: list[_Col], width: int) -> list[tuple[list[_Col], list[int]]] | None:
        if self.index:
            numbers = [Text(str(i + 1)) for i in range(len(self.rows))]
            cols = [_Col(Text("#"), numbers, "right", key=True), *cols]
        keys = [c for c in cols if c.key]
        rest = sorted((c for c in cols if not c.key), key=lambda c: c.priority)
        position = {id(c): i for i, c in enumerate(cols)}

        def ordered(part: list[_Col]) -> list[_Col]:
            return sorted(keys + part, key=lambda c: position[id(c)])

        groups: list[list[_Col]] = [[]]
        for col in rest:
            if self._widths(ordered([*groups[-1], col]), width) is None:
                if self._widths(ordered([col]), width) is None:
                    return None
                groups.append([])
            groups[-1].append(col)
        out = []
        for group in groups:
            part = ordered(group)
            widths = self._widths(part, width)
            assert widths is not None
            out.append((part, widths))
        return out

    def _stack(self, cols: list[_Col], width: int) -> Table:
        """One block per row: a line per non-empty cell, its header on the left; without the
        outer edges when a word would not fit inside them (then folded, as a last resort)."""
        names = _Col(Text(""), [c.header for c in cols], wrap=True)
        values = _Col(Text(""), [x for c in cols for x in c.cells], wrap=True)
        edge = self.show_edge and self._widths([names, values], width) is not None
        name_w = names.minimum
        value_w = max(1, width - self._extra(2, edge) - name_w)
        widths = self._widths([names, values], width, edge) or [name_w, value_w]
        table = self._like(self.title, self.caption, show_edge=edge, show_header=False)
        table.add_column(width=widths[0], overflow="fold", style="bold")
        table.add_column(width=widths[1], overflow="fold")
        for r, row in enumerate(self.rows):
            cells = [(c.header, c.cells[r]) for c in cols if c.cells[r].plain.strip()]
            for k, (header, cell) in enumerate(cells):
                table.add_row(header, cell, style=row.style, end_section=k == len(cells) - 1)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.layouts(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        cols = self._columns()
        full = sum(c.natural for c in cols) + self._extra(len(cols))
        return Measurement(min(full, options.max_width), min(full, options.max_width))


# --------------------------------------------------------------------- the sweep results

RESULTS_CAPTION = (
    "step: median time per iteration (max over ranks) +/- half the width of its 95% interval "
    "in percent of the median, n = timed iterations; best: the fastest of its group (same L, "
    "heads, KV heads, mask, phase) beyond the noise, 'tie' when the intervals of the leaders "
    "overlap; TFLOP/s: achieved, all ranks; "
    "bytes/rank: sent per rank per step ('=' the counted bytes equal the analytic model's, "
    "'(lib)' an external library's, counted at the torch.distributed boundary); overlap: share "
    "of the communication hidden behind compute (0 none, 1 all) with the range the intervals "
    "allow, 'n/m' when the communication is within the timing noise, '0 (a2a)' for Ulysses, "
    "whose all-to-alls hide nothing by construction; layout '=x' lists equivalent names "
    "measured once; peak mem: max over ranks; "
    "max err: max abs error vs the reference"
)


def _mask_group(config: ConfigSection) -> str:
    """The string "plain" for causal / full attention, else the mask kind and its documents and window
    (configurations are compared for the best time within one mask)."""
    kind = config.mask or "causal"
    if kind in ("causal", "full"):
        return "plain"
    return f"{kind} {config.documents} {config.window}"


def _mask_cell(config: ConfigSection) -> str:
    """The mask in a few characters: causal, full, docs (12), w1024, docs (12) w1024; with
    the padding its layout added."""
    kind = config.mask or ("causal" if config.causal else "full")
    documents, window = config.documents, config.window
    parts = []
    if documents is not None and len(documents) > 1:
        parts.append(f"docs ({len(documents)})")
    if window is not None:
        parts.append(f"w{window}")
    text = " ".join(parts) or str(kind)
    padding = config.padding
    return f"{text} +{padding} pad" if padding else text


def _layout_cell(config: ConfigSection) -> str:
    """The layout, with the other layout names measured as this one (`config.equivalent`)."""
    names = []
    for other in config.equivalent or ():
        match = re.search(r"-U\d+xR\d+-([a-z_]+)-rep", other)
        if match and match.group(1) != config.layout:
            names.append(match.group(1))
    return config.layout + "".join(f" ={n}" for n in dict.fromkeys(names))


def _step_cell(timing: TimingSection) -> str:
    median = timing.median
    low, high = timing.ci_low, timing.ci_high
    n = timing.iterations or len(timing.samples)
    if low is None or high is None or median <= 0:
        return f"{format_seconds(median)} n={n}"
    half = (high - low) / 2 / median
    return f"{format_seconds(median)} ±{half:.0%} n={n}"


def _overlap_cell(timing: TimingSection) -> str:
    status = timing.overlap_status
    if status == "none by construction":
        return "0 (a2a)"
    if status == "not measurable":
        return "n/m"
    value = timing.overlap
    if value is None:
        return "-"
    low, high = timing.overlap_low, timing.overlap_high
    if low is None or high is None:
        return f"{value:.2f}"
    return f"{value:.2f} \\[{low:.1f}-{high:.1f}]"


def _config(record: ResultRecord) -> ConfigSection:
    """The record's configuration (every record the sweep writes has one)."""
    if record.config is None:
        raise ValueError(f"record {record.id} has no config: it cannot be shown")
    return record.config


@dataclass(frozen=True)
class _Measured:
    """The sections of an ok training record that its row shows."""

    timing: TimingSection
    comm: CommSection
    flops: FlopsSection
    peak_bytes: list[int]


def _measured(record: ResultRecord) -> _Measured:
    """The timing, bytes, FLOPs and peak memory of an ok record (the sweep writes all four)."""
    t, comm, flops, memory = record.timing, record.comm, record.flops, record.memory
    if t is None or comm is None or flops is None or memory is None or not memory.peak_bytes:
        missing = [name for name, section in (("timing", t), ("comm", comm), ("flops", flops))
                   if section is None] or ["memory.peak_bytes"]  # fmt: skip
        raise ValueError(f"ok record {record.id} has no {', '.join(missing)}")
    return _Measured(t, comm, flops, memory.peak_bytes)


def _ranked(records: list[ResultRecord]) -> dict[tuple[object, ...], Ranked]:
    """`frame.rank_records` of the records (it reads them as the file holds them)."""
    # pandas and scipy only when a results table is drawn: `cpbench --help` stays light
    from cpbench.results.frame import rank_records  # noqa: PLC0415
    from cpbench.results.schema import dump_record  # noqa: PLC0415

    return rank_records([dump_record(r) for r in records])


def results_table(records: list[ResultRecord]) -> FitTable:
    """One row per configuration; the best configuration per group (`rank_group`) in bold
    green, its ties in yellow (`rank_records`: overlapping 95% intervals).

    Narrower than the whole table, it splits into parts with a "#" row number."""
    from cpbench.results.frame import rank_group  # noqa: PLC0415

    ranked = _ranked(records)
    impls = {_config(r).impl for r in records}
    show_impl = impls != {"cpbench"} and bool(impls)
    # The mask column appears once a record has documents or a window (causal / full alone
    # are told apart by the workload, as before masks).
    show_mask = any(_mask_group(_config(r)) != "plain" for r in records)
    table = FitTable(title="cpbench sweep results", caption=RESULTS_CAPTION, index=True)
    columns = ["L", "h/kv", "UxR", "layout", "phase", "step", "best", "TFLOP/s", "bytes/rank",
               "overlap", "peak mem", "max err", "status"]
    if show_mask:
        columns.insert(columns.index("layout") + 1, "mask")
    if show_impl:
        columns.insert(0, "impl")
    table.add_columns(columns, left=("impl", "layout", "mask", "status", "phase", "best"),
                      wrap=("status",))
    for r in records:
        c = _config(r)
        row_style = None
        cells: list[str | Text] = [
            str(c.seq_len), f"{c.heads}/{c.kv_heads}", f"{c.ulysses}x{c.ring}",
            _layout_cell(c), c.phase,
        ]
        if show_mask:
            cells.insert(4, _mask_cell(c))
        if show_impl:
            cells.insert(0, c.impl)
        if r.status == "ok":
            m = _measured(r)
            comm = m.comm
            analytic = sum(comm.analytic_bytes.values())
            measured = max(sum(x) for x in zip(*comm.measured_bytes.values(), strict=True))
            # "=": the counted bytes equal the analytic model's, collective by collective;
            # "(lib)": an external library's bytes, counted at the torch.distributed boundary.
            if comm.match is None:
                traffic = f"{format_memory(measured)} (lib)"
            elif comm.match:
                traffic = f"{format_memory(analytic)} ="
            else:
                traffic = f"[bold red]{format_memory(analytic)} != {format_memory(measured)}[/]"
            acc = r.accuracy
            group = ranked.get(rank_group(c.model_dump()))
            best = ""
            if group is not None and r.id in group.tied:
                best, row_style = group.verdict, "bold green" if group.clear else "yellow"
                if group.resolved_by and r.id == group.leader:
                    best, row_style = "best (rerun)", "bold green"
            error = f"{acc.max_abs_error if acc is not None else float('nan'):.0e}"
            rows = acc.sampled_rows if acc is not None else None
            if rows:
                error += f" / {rows.max_abs_error:.0e}@{rows.seq_len}"
            cells += [
                _step_cell(m.timing), best, f"{m.flops.achieved_tflops:.3f}", traffic,
                _overlap_cell(m.timing), format_memory(max(m.peak_bytes)), error, "ok",
            ]
        else:
            cells += ["-"] * 7 + [Text(f"{r.status}: {r.error}")]
        table.add_row(*cells, style=row_style)
    return table


def ties_lines(records: list[ResultRecord]) -> list[str]:
    """One line per group whose leaders tie: who, and the rule (ties are a result, said)."""
    from cpbench.model.ties import TIE_RULE  # noqa: PLC0415

    lines = []
    by_id = {r.id: _config(r) for r in records}
    for ranked in _ranked(records).values():
        if ranked.clear and not ranked.resolved_by:
            continue
        c = by_id[ranked.leader]
        names = ", ".join(
            f"{by_id[i].ulysses}x{by_id[i].ring} {by_id[i].layout}" for i in ranked.tied
        )
        where = f"L={c.seq_len} h/kv {c.heads}/{c.kv_heads} {c.phase}"
        if ranked.resolved_by:
            lines.append(f"{where}: tie separated by an {ranked.resolved_by}: {names}")
        else:
            lines.append(f"{where}: tie between {names} ({TIE_RULE})")
    return lines


def machine_lines(records: list[ResultRecord]) -> list[str]:
    """The machine warnings of the records (`environment.machine.warnings`), each once, with
    how many records it concerns."""
    counts: dict[str, int] = {}
    for r in records:
        machine = r.environment.machine if r.environment is not None else None
        for w in (machine.warnings if machine is not None else None) or ():
            key = (
                "precision target not met: the median's 95% interval stayed wider than the "
                "target (see timing.relative_width)"
                if w.startswith("precision")
                else w
            )
            counts[key] = counts.get(key, 0) + 1
    return [f"{w} ({n} configuration{'s' if n > 1 else ''})" for w, n in counts.items()]


# --------------------------------------------------------------------- the verify matrix


def verify_tables(records: list[VerifyRow], n: int, dev: str, impl: str) -> list[RenderableType]:
    """The verify matrix: one row per case, then the skip reasons, known issues and a count.

    Narrower than the whole matrix, it splits into parts that each repeat the case (scheme,
    mesh, layout, mask, heads)."""
    out: list[RenderableType] = []
    failed = [r for r in records if r.passed is False]
    skipped = [r for r in records if r.skipped]
    reasons: dict[str, int] = {}
    title = f"cpbench verify: world size {n}, {dev}" + (
        f", impl {impl}" if impl != "cpbench" else ""
    )
    table = FitTable(title=title)
    table.add_columns(
        ("scheme", "UxR", "layout", "mask", "h/kv", "rep", "out", "dq", "dk", "dv", ""),
        right=("out", "dq", "dk", "dv"), key=("scheme", "UxR", "layout", "mask", "h/kv"),
        wrap=("",), first=("", "rep"),
    )
    for r in records:
        case = _verify_case(r)
        e = r.errors
        rep = required_kv_replication(case.kv_heads, case.ulysses) or "-"
        cells = [f"{e[k]:.0e}" if k in e else "-" for k in ("out", "dq", "dk", "dv")]
        if r.skipped:
            number = reasons.setdefault(r.skipped, len(reasons) + 1)
            verdict = Text.from_markup(f"[yellow]skipped[/] ({number})")
        elif r.passed:
            verdict = Text.from_markup(
                "[green]ok[/]" + (" (known issue)" if r.known_issues else "")
            )
        else:
            verdict = Text.from_markup("[red]FAIL[/] ") + Text(r.error or "")
        mask = r.mask or ("causal" if case.causal else "full")
        table.add_row(case.scheme, f"{case.ulysses}x{case.ring}", case.layout, mask,
                      f"{case.heads}/{case.kv_heads}", str(rep), *cells, verdict)
    tolerances = [r.tolerance for r in records if r.tolerance is not None]
    out.append(
        f"tolerance: max abs error <= {tolerances[0]:g} vs float64 (out, dq, dk, dv: max abs "
        "error of the output and of each gradient)"
        if tolerances
        else "no cases ran"
    )
    out.append(table)
    for reason, number in reasons.items():
        out.append(f"skipped ({number}): {reason}")
    for issue in dict.fromkeys(i for r in records for i in r.known_issues):
        out.append(f"known upstream issue (its gradient gets the bf16 tolerance): {issue}")
    ran = len(records) - len(skipped)
    out.append(
        f"{ran - len(failed)}/{ran} cases passed"
        + (f", {len(skipped)} skipped (the reasons above)" if skipped else "")
    )
    return out


@dataclass(frozen=True)
class _VerifyCase:
    """The fields of a training case's row that the verify matrix shows."""

    scheme: str
    ulysses: int
    ring: int
    layout: str
    causal: bool
    heads: int
    kv_heads: int


def _verify_case(row: VerifyRow) -> _VerifyCase:
    """The case of a training row (every training case's record has these fields)."""
    fields = (row.scheme, row.ulysses, row.ring, row.layout, row.causal, row.heads, row.kv_heads)
    scheme, ulysses, ring, layout, causal, heads, kv_heads = fields
    if (scheme is None or ulysses is None or ring is None or layout is None or causal is None
            or heads is None or kv_heads is None):  # fmt: skip
        raise ValueError(f"verify case {row.label!r} is not a training case (no mesh or heads)")
    return _VerifyCase(scheme, ulysses, ring, layout, causal, heads, kv_heads)


# --------------------------------------------------------------------- compare

COMPARE_CAPTION = (
    "before/after: median step time (max over ranks); after/before: ratio of the medians with "
    "\\[low-high], every ratio the two 95% intervals allow; faster/slower: the intervals do not "
    "overlap; regression: slower by more than the threshold"
)


AXIS_COLUMNS = {"heads": "h", "kv_heads": "kv", "head_dim": "d", "batch": "B", "dtype": "dtype",
                "impl": "impl", "mask": "mask", "window": "W", "kernel": "kernel",
                "backend": "backend"}
"""Header of each configuration axis `compare_table` may show (heads and KV heads always,
the others where rows differ in them)."""


def compare_table(comparison: Comparison) -> FitTable:
    """`cpbench compare`: one row per configuration (`cpbench.app.compare.Comparison`), with
    every configuration axis that tells two rows apart."""
    table = FitTable(title=f"cpbench compare: {' -> '.join(comparison.sources)}",
                     caption=COMPARE_CAPTION, index=True)
    rows = comparison.rows
    axes = [a for a in AXIS_COLUMNS if a in ("heads", "kv_heads")
            or len({str(getattr(r, a)) for r in rows}) > 1]
    table.add_columns(
        ("L", *(AXIS_COLUMNS[a] for a in axes), "UxR", "layout", "phase", "before", "after",
         "after/before", "verdict"),
        left=("UxR", "layout", "phase", "verdict", "dtype", "impl", "mask", "kernel", "backend"),
        wrap=("verdict",),
    )
    for r in rows:
        mesh = str(r.mesh or "").replace("U", "").replace("R", "")
        ratio: str | Text
        if r.verdict is None:
            ratio = "-"
            sides = [r.status_before or "absent", r.status_after or "absent"]
            verdict = Text(f"not compared ({sides[0]} -> {sides[1]})")
        else:
            ratio = Text(f"{_number(r.ratio, r):.3f} "
                         f"[{_number(r.ratio_low, r):.2f}-{_number(r.ratio_high, r):.2f}]")
            style = {"faster": "green", "slower": "red"}.get(r.verdict, "")
            text = r.verdict + (" REGRESSION" if r.regression else "")
            verdict = Text(text, style=style)
        table.add_row(
            str(r.seq_len or "-"), *(_dash_or_str(getattr(r, a)) for a in axes), mesh,
            str(r.layout or "-"), str(r.phase or "-"),
            "-" if r.before_s is None else format_seconds(r.before_s),
            "-" if r.after_s is None else format_seconds(r.after_s),
            ratio, verdict,
        )
    return table


def _number(value: float | None, row: ComparisonRow) -> float:
    """A ratio of a compared row (one with a verdict has all three)."""
    if value is None:
        raise ValueError(f"compared row {row.id} ({row.verdict}) lacks its ratio or its bounds")
    return value


def _dash_or_str(value: object) -> str:
    return "-" if value is None else str(value)


# --------------------------------------------------------------------- dynamic CP

DYNAMIC_CAPTION = (
    "dynamic CP: one attention layer's fwd+bwd over the whole batch, the micro-batches in turn; "
    "step: median over the interleaved rounds (max over ranks), +/-: half the 95% interval in "
    "% of the median; CP:seqs: sequences per CP degree; checks: routed groups within the reference bound / groups; idle: the "
    "ranks' idle share of one instrumented step (predicted in brackets); x static: the static "
    "policy's step / this one's, measured and predicted"
)


def dynamic_table(
    records: list[ResultRecord], baselines: list[ResultRecord] | None = None
) -> FitTable:
    """One row per dynamic-CP policy record (`schema.DynamicSection`); the speedups over static
    CP from `baselines` (the file's dynamic records, default `records`)."""
    from cpbench.results.frame import dynamic_speedups  # noqa: PLC0415
    from cpbench.results.schema import dump_record  # noqa: PLC0415

    base = baselines if baselines is not None else records
    speedups = dynamic_speedups([dump_record(r) for r in base])
    table = FitTable(title="dynamic CP policies", caption=DYNAMIC_CAPTION, index=True)
    table.add_columns(
        ["policy", "micro-batches", "CP:seqs", "step", "checks", "predicted", "idle",
         "x static meas", "x static pred", "status"],
        left=("policy", "CP:seqs", "status"), wrap=("status",),
    )  # fmt: skip
    for r in records:
        d = r.dynamic
        policy = r.id.rsplit("-", 1)[-1]
        if d is None:
            if r.status == "ok":
                raise ValueError(f"ok dynamic-CP record {r.id} has no dynamic section")
            table.add_row(policy, *["-"] * 8, Text(f"{r.status}: {r.error}"))
            continue
        half = (d.ci_high - d.ci_low) / 2 / d.median_s
        measured, predicted = speedups.get(r.id, (None, None))
        checks = d.checks
        passed = f"{checks.passed}/{checks.groups}"
        table.add_row(
            d.policy, str(len(d.micro_batches)),
            " ".join(f"{g}:{n}" for g, n in d.degrees.items()),
            f"{format_seconds(d.median_s)} ±{half:.0%} n={len(d.samples)}",
            passed if checks.passed == checks.groups else f"[bold red]{passed}[/]",
            format_seconds(d.predicted_s),
            f"{d.idle_share:.0%} ({d.predicted_idle_share:.0%})",
            "-" if measured is None else f"{measured:.2f}",
            "-" if predicted is None else f"{predicted:.2f}",
            "ok" if r.status == "ok" else Text(f"{r.status}: {r.error}"),
        )  # fmt: skip
    return table
