"""Writing an output file so that a failure never leaves half a file or destroys the last one,
and never overwrites an input (the measurements): one function every writer calls."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from cpbench.errors import CpbenchError


def check_output(path: str | Path, inputs: Iterable[str | Path], what: str) -> Path:
    """`path` as a file to write: CpbenchError when it is a folder, one of `inputs`, or an
    existing results file (what the page, profile and scenario writers never write)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise CpbenchError(f"{what} {target} is a directory; give a file name")
    for source in inputs:
        source_path = Path(source).expanduser()
        if target.exists() and source_path.exists() and os.path.samefile(target, source_path):
            raise CpbenchError(
                f"{what} {target} is one of the inputs ({source}): writing it would destroy "
                f"what it was made from; give another file"
            )
    if target.suffix == ".jsonl" and target.exists():  # no writer here writes results
        raise CpbenchError(
            f"{what} {target} is an existing results file (.jsonl): writing over it would "
            f"destroy its measurements; give another file"
        )
    return target


def write_atomically(
    path: str | Path,
    text: str,
    what: str,
    inputs: Iterable[str | Path] = (),
    make_parents: bool = False,
) -> Path:
    """Write `text` to `path` through a temporary file in the same folder, renamed over it once
    complete (a full disk or a kill leaves the previous file as it was). CpbenchError naming
    `what` (e.g. "--output") when `path` is a folder, is one of `inputs`, or cannot be written.
    The file gets the previous file's permissions, else the umask's (as `open` would)."""
    target = check_output(path, inputs, what)
    folder = target.parent
    if make_parents:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CpbenchError(f"cannot write {what} {target}: {exc.strerror or exc}") from None
    elif not folder.is_dir():
        raise CpbenchError(f"{what} {target}: folder {folder} does not exist")
    try:
        mode = target.stat().st_mode & 0o777 if target.exists() else _default_mode()
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise CpbenchError(f"cannot write {what} {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise CpbenchError(f"cannot write {what} {target}: {exc.strerror or exc}") from None
    return target


def _default_mode() -> int:
    """0o666 less the process's umask: what a file made by `open(..., "w")` would get."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
