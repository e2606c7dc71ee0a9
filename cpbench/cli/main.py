"""The `cpbench` console entry point: imports every command module (each registers itself on
`cpbench.cli.common.app`), then runs the app with usage errors turned into exit code 2."""

from __future__ import annotations

import sys

import typer

from cpbench.cli import calibrate as _calibrate  # noqa: F401
from cpbench.cli import compare as _compare  # noqa: F401
from cpbench.cli import doctor as _doctor  # noqa: F401
from cpbench.cli import efficiency as _efficiency  # noqa: F401
from cpbench.cli import formulas as _formulas  # noqa: F401
from cpbench.cli import plan as _plan  # noqa: F401
from cpbench.cli import probe as _probe  # noqa: F401
from cpbench.cli import recommend as _recommend  # noqa: F401
from cpbench.cli import report as _report  # noqa: F401
from cpbench.cli import sweep as _sweep  # noqa: F401
from cpbench.cli import tune as _tune  # noqa: F401
from cpbench.cli import verify as _verify  # noqa: F401
from cpbench.cli.common import app, err_console
from cpbench.errors import EXIT_BAD_INPUT

try:  # typer >= 0.28 vendors click and raises its own exception types
    from typer import TyperException as UsageFailure
except ImportError:  # typer 0.19 - 0.27 run on click
    from click import ClickException as UsageFailure  # type: ignore[no-redef]


def main() -> None:
    """Console entry point: the app, with usage errors (unknown option, a value of the wrong
    type) printed as one line on stderr with exit code 2, like the domain errors."""
    try:
        code = app(standalone_mode=False, prog_name="cpbench")
    except UsageFailure as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # type: ignore[attr-defined]  # NoArgsIsHelpError: prints the help
        else:
            message = " ".join(exc.format_message().split())
            err_console.print(f"cpbench: error: {message}", markup=False, highlight=False)
        sys.exit(getattr(exc, "exit_code", EXIT_BAD_INPUT))
    except typer.Abort:
        err_console.print("cpbench: aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
