"""Cost model: predicted step time of one CP attention layer on a hardware profile. Pure Python.

One module per job; the formulas: docs/design.md section 2."""
