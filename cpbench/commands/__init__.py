"""Typer commands that live in their own modules; each registers itself on `cpbench.cli.app`
with the `cpbench.cli.command` decorator when `cpbench.cli` imports it."""
