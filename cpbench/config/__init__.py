"""The one vocabulary every layer shares: option literals, the attention shape and its
feasibility rules, the implementation names, the benchmark configuration and tolerances. Pure
Python (no torch)."""
