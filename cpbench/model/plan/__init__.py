"""The whole-model plan's pure math (no torch): transformer, memory, step, framework,
options, the pruned search and the published check. Formulas and sources: docs/plan.md."""
