"""The one exception type the CLI turns into a clear message and exit code 2."""

from __future__ import annotations


class CpbenchError(ValueError):
    """Bad input or an impossible configuration; the message names the values and the rule."""
