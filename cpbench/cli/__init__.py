"""The command line: one module per command group (thin typer wrappers), `common` for what they
share, `main` for the entry point. Only this package and `cpbench.render` print."""
