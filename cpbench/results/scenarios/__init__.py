"""Scenarios: TOML files that describe a sweep, and the benchmark points they expand to.

The file format: scenarios/README.md. Pure Python, no torch."""
