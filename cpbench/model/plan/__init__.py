"""The whole-model plan's pure math: the transformer description (`transformer`), memory per
rank by component (`memory`), time per training step (`step`), the tier each collective crosses
(`tiers`), the framework's attention and the linears' precision (`framework`), the user's choices
(`options`), the pruned search (`search`) and the check against published runs (`validation`). Pure Python, no torch.

`cpbench.app.plan` fills a `search.SearchSpace` from a request; docs/plan.md states the
formulas and their sources.
"""
