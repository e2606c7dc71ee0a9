"""The HTML pages, drawn from the data of `cpbench.app.report`: document.py (`render_page`),
tables.py (sortable tables), report.py (`render_report`), comparison.py (`render_comparison`)."""
