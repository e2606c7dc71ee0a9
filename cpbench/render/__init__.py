"""Rendering: rich tables, unit formatting, plotly figures and the HTML report. Renderers take
the data that `cpbench.app` services return; nothing below this layer prints."""
