"""Hardware profiles: what the cost model needs to know about a system. Pure Python, one module
per job. What the numbers mean: docs/design.md section 2, "The hardware profile"."""
