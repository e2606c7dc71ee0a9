"""cpbench: benchmark and auto-tune context-parallel attention."""

__version__ = "0.1.0"
