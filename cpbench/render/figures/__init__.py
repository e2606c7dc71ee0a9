"""Figure builders of the HTML report: pure functions from a results frame to a plotly Figure.

Their contract and the modules: docs/internals.md, "The HTML report page"."""
