"""What every command module shares: the typer app, the consoles, the `command` decorator that
turns errors into exit codes (once, here) and device resolution."""

from __future__ import annotations

import functools
import inspect
import json
import signal
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

import typer
from rich.console import Console, RenderableType

from cpbench.cli.options import Version
from cpbench.config.vocabulary import CliDevice
from cpbench.config.vocabulary import Device as RunDevice
from cpbench.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_WRONG_RESULT,
    CpbenchError,
    RunFailure,
)

app = typer.Typer(
    name="cpbench",
    help="Benchmark and auto-tune context-parallel attention (Ulysses, Ring, USP).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# No emoji codes: text from files (a documents file's line, a scenario's name) prints as it is.
console = Console(emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)
RequestT = TypeVar("RequestT")


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register a command; the one place where errors meet the process exit code: a
    CpbenchError (bad input) becomes one line on stderr and exit code 2, a RunFailure (a rank
    raised or died, a timeout) one line and exit code 1, an interrupt before the command handles
    it (Ctrl-C while torch imports) one line and 128 + the signal. Python warnings (cpbench's
    own, pandas', scipy's) print as one `cpbench: warning:` line each (`show_warning`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = show_warning
                return fn(*args, **kwargs)
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", signal.SIGINT)
            err_console.print("cpbench: interrupted", markup=False, highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED - signal.SIGINT + signum) from None
        except CpbenchError as exc:
            err_console.print(f"cpbench: error: {exc}", markup=False, highlight=False)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except RunFailure as exc:
            err_console.print(f"cpbench: failed: {exc}", markup=False, highlight=False)
            raise typer.Exit(EXIT_WRONG_RESULT) from None

    text = reflow(fn.__doc__ or "")
    return app.command(help=text, short_help=summary(text))(wrapper)


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` inside a command: the message alone on stderr, as cpbench's own
    warnings print (no module path, no source line); a library's names its category."""
    own = category is UserWarning
    text = str(message) if own else f"{category.__name__}: {message}"
    err_console.print(f"cpbench: warning: {text}", markup=False, highlight=False)


def emit(
    report: Any,
    as_json: bool,
    renderables: Callable[[], Iterable[RenderableType]],
    highlight: bool | None = None,
) -> None:
    """Print a command's report: with --json one JSON document on stdout (indent 1), else its
    renderables on the console (built only then: some import their renderer lazily)."""
    if as_json:
        print(json.dumps(report, indent=1))
        return
    for renderable in renderables():
        console.print(renderable, highlight=highlight)


def options_request(request: type[RequestT], values: Mapping[str, Any], **given: Any) -> RequestT:
    """The dataclass `request` of a command's option values (`locals()`): each field its option
    of the same name, unless `given` sets it."""
    named = {f.name: values[f.name] for f in fields(request) if f.name in values}  # type: ignore[arg-type]
    return request(**{**named, **given})


def summary(text: str) -> str:
    """The first clause of a help text (up to a `.`, `:` or `;` outside parentheses): the
    line `cpbench --help` lists a command with."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".:;" and text[i + 1 : i + 2] in (" ", "\n", ""):
            return text[:i]
    return text


def reflow(doc: str) -> str:
    """A docstring as help that wraps to the terminal: each paragraph's hard line breaks
    become spaces; a paragraph that starts with `\\b` keeps its lines."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


@app.callback()
def _root(version: Version = False) -> None:
    """cpbench: measure, model and recommend context-parallel attention configurations."""


def resolve_device(device: CliDevice) -> RunDevice:
    """The device a `--device` option means here: auto picks cuda when torch sees a GPU. (The
    commands that call it run ranks: the forkserver of CPU ranks starts first, so its imports
    run beside this process's import of torch.)"""
    from cpbench.bench.pool import start_forkserver_early  # noqa: PLC0415

    start_forkserver_early(device)
    import torch  # noqa: PLC0415 - keep `cpbench --help` fast

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CpbenchError("device 'cuda' requested but torch sees no CUDA device")
    return device
