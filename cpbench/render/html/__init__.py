"""The HTML report page, drawn from the data of `cpbench.app.report`: one self-contained file
that needs no network access at all.

The page is a jinja2 template (`templates/page.html`, autoescaped: every string taken from a
results file is HTML-escaped on the way in); its CSS and scripts are the files of `static/`,
inlined. plotly.js is embedded once (inline `<script>`), every figure's JSON sits in a
`<script type="application/json">` block written by jinja2's `tojson` (`<`, `>`, `&` and `'`
escaped as `\\u003c` etc.). `static/render.js` draws the figures and then sets
`document.body.dataset.rendered` to their number; errors caught by `window.onerror` (and
rejected promises, `static/errors.js`) are collected in `document.body.dataset.errors`. The
record table sorts on a click on a column header (`static/sort.js`, no library).

By job: document.py (the template, the static files, `render_page`), tables.py (sortable
tables, the record table), report.py (`render_report`), comparison.py (`render_comparison`).
"""
