"""The exceptions the CLI turns into exit codes, once (`cpbench.cli.common.command`):
`CpbenchError` (bad input or an impossible configuration, naming the values and the rule: exit
2) and `RunFailure` (a rank raised or died, a task hung: exit 1). See docs/design.md section 5."""

from __future__ import annotations


class CpbenchError(ValueError):
    """Bad input or an impossible configuration; the message names the values and the rule."""


class KernelRefused(CpbenchError):
    """The chosen attention kernel cannot run this call (its device, dtype, head dim or mask
    rule), said before anything runs: verify records such a case as skipped with the reason,
    not as a wrong result."""


class RunFailure(RuntimeError):
    """Running a valid configuration failed (a rank raised or died, a task timed out)."""


EXIT_WRONG_RESULT = 1
"""A result failed its reference check, measured bytes differ from the analytic bytes, or the run
itself failed (`RunFailure`)."""
EXIT_BAD_INPUT = 2
"""`CpbenchError`, or a usage error (unknown option, a value of the wrong type)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT): every record finished so far is kept."""
