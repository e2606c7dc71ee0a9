"""The whole-model plan's pure math (no torch): transformer, memory, step, tiers, framework,
options, the pruned search and the published check. Formulas and sources: docs/plan.md."""
