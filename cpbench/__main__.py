"""`python -m cpbench`."""

from cpbench.cli import app

app()
