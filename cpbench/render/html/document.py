"""The HTML document (`render_page`): one self-contained file that needs no network access.

The template, inlined assets and scripts: docs/internals.md, "The HTML report page"."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

import plotly
import plotly.graph_objects as go
import plotly.io as pio
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from cpbench import __version__
from cpbench.app.report.data import (
    NO_PROFILE_NOTE,
    ComparisonData,
    ReportData,
    ReportRecommendation,
)
from cpbench.render.html.tables import Table
from cpbench.render.text import visible

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False}
STATIC_FILES = {
    "css": "report.css",
    "errors_js": "errors.js",
    "render_js": "render.js",
    "sort_js": "sort.js",
}
"""Template name -> file of `cpbench/render/static/` inlined into the page."""


@cache
def environment() -> Environment:
    """The jinja2 environment of the report templates (autoescaped HTML, hidden characters of
    every text shown made visible, `tojson` keeps the key order of the figures)."""
    env = Environment(
        finalize=_printable,
        loader=PackageLoader("cpbench.render", "templates"),
        autoescape=select_autoescape(("html",), default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "separators": (",", ":")}
    return env


def _printable(value: Any) -> Any:
    """What a template prints of `value`: text from records with its hidden characters made
    visible (our own markup, the inlined assets, is printed as it is)."""
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) else value


@cache
def static_files() -> dict[str, Markup]:
    """The CSS and scripts inlined into the page (our own files: not escaped)."""
    folder = files("cpbench.render").joinpath("static")
    return {
        key: Markup(folder.joinpath(name).read_text(encoding="utf-8"))
        for key, name in STATIC_FILES.items()
    }


@dataclass(frozen=True)
class Page:
    """A rendered page."""

    html: str
    figures: int
    """Number of figures on the page."""


@dataclass(frozen=True)
class RecommendationView:
    """The recommendation section: the service's recommendation with its tables laid out."""

    recommendation: ReportRecommendation | None
    note: str | None
    tables: list[tuple[str, Table]] = field(default_factory=list)


@dataclass
class Section:
    """One section of the page: a heading, a line on how to read it, a figure (or a note
    saying why there is none), and a table or the recommendation."""

    key: str
    title: str
    explain: str = ""
    figure: go.Figure | None = None
    note: str | None = None
    table: Table | None = None
    recommendation: RecommendationView | None = None
    empty: str | None = None
    """The note when there is no figure and no other note: why there is none."""
    plot_id: str | None = None
    """Id of the figure's element, set when the page is drawn."""

    def __post_init__(self) -> None:
        if self.figure is None and not self.note and self.empty:
            self.note = self.empty


def figure_data(fig: go.Figure) -> Any:
    """The figure as plain JSON data (plotly's own serialisation: NaN -> null, arrays ->
    lists), for the template's `tojson`."""
    return json.loads(pio.to_json(fig, validate=False, pretty=False))


def render_page(
    data: ReportData | ComparisonData, sections: Sequence[Section], profile_line: str
) -> Page:
    """The whole HTML document of `data` (its title, summary, sources and time): header, table
    of contents, sections (figures drawn from embedded JSON by the one embedded copy of
    plotly.js)."""
    specs: list[dict[str, Any]] = []
    for s in sections:
        if s.figure is not None:
            s.plot_id = f"fig-{len(specs)}"
            specs.append({"target": s.plot_id, "figure": figure_data(s.figure)})
    html = (
        environment()
        .get_template("page.html")
        .render(
            title=data.title,
            summary=data.summary,
            sources=list(data.sources),
            generated_at=data.generated_at,
            profile_line=profile_line,
            sections=sections,
            specs=specs,
            static=static_files(),
            plotly_config=PLOTLY_CONFIG,
            plotly_js=Markup(get_plotlyjs()) if specs else "",
            version=__version__,
            plotly_version=plotly.__version__,
            no_profile_note=NO_PROFILE_NOTE,
        )
    )
    return Page(html, len(specs))
