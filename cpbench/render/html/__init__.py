"""The HTML pages, drawn from the data of `cpbench.app.report`, by job: document.py (the
template, the static files, `render_page`), tables.py (sortable tables, the record table),
report.py (`render_report`), comparison.py (`render_comparison`).
"""
