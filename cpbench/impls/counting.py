"""Counting the bytes an external library hands to torch.distributed: the same boundary counter
cpbench's own schemes are counted by (`cpbench.attention.boundary`), so a library's bytes and
cpbench's are counted alike. The module docstring there lists what each entry point records."""

from __future__ import annotations

from cpbench.attention.boundary import ByteCounter, boundary_counting

library_counting = boundary_counting
"""`boundary_counting` under the name the adapters' measurement uses (no labels are set
inside a library: tags are the kinds of call, p2p, all_to_all, ...)."""

__all__ = ["ByteCounter", "library_counting"]
