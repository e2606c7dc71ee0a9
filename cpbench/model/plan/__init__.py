"""The whole-model plan's pure math: the transformer description (`transformer`), memory per
rank by component (`memory`) and time per training step (`step`). Pure Python, no torch.

`cpbench.app.plan` searches TP x CP x PP x DP x recompute with these; docs/plan.md states the
formulas and their sources.
"""
