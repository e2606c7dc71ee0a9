"""Figure builders of the HTML report: pure functions from a results frame to a plotly Figure.

Every builder takes the DataFrame of `cpbench.results.store.records_frame` (or, for comparisons,
the frame of `cpbench.results.frame.compare_frame`) and returns a `plotly.graph_objects.Figure`,
or None when the frame holds nothing to draw (the page then shows a one-line note instead of an empty chart).
Only successful records (`status == "ok"`) are plotted; facets exist only for the phases
that have data. Nothing here reads files, prints or touches the network.

One module per figure family: `timing` (step time, throughput, bandwidth, the U x R heatmaps),
`communication` (bytes, overlap), `memory`, `balance` (per-rank load and work), `prediction`
(the cost model against the measurements), `compare` (before/after); `common` holds what they
share (colours, ordering, escaping, axes, the per-phase line facets).
"""
