"""Apply each mutant to a copy of the tree under the system's temp folder (never to the working
tree), run its tests there, and say which test caught it.

The copy holds the files git tracks or would track (`git ls-files -co --exclude-standard`), made
once per run; each mutant replaces its exact `old` text (which must occur exactly once: a stale
mutant is an error, not a pass) and the file is restored before the next. With `jobs` > 1, each
job has its own copy and worker and takes every jobs-th run. Tests run as
`pytest -x` in a child forked from one worker process (`tests.mutation.worker`: torch imported
once, cpbench never before the fork) with the copy first on sys.path, its bytecode compiled once
and checked against each source's hash, and none written, so no module of another mutant (or of
the working tree) is imported. Before any mutant, the union of the selected mutants' tests runs
on the unmutated copy: a baseline that fails makes every "caught" meaningless, so the run stops
there.
"""

from __future__ import annotations

import compileall
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tests.mutation.mutants import Mutant

ROOT = Path(__file__).resolve().parents[2]
"""The repository the copy is made from."""

Outcome = Literal["caught", "survived", "stale", "error", "timeout"]
"""caught: the tests failed (pytest exit 1); survived: they passed; stale: the mutant's old text
does not occur exactly once; error: pytest could not run them (exit 2-5); timeout: they ran past
the limit."""


@dataclass(frozen=True)
class Result:
    """One mutant's run."""

    mutant: Mutant
    """The planted defect."""
    outcome: Outcome
    """What its tests did (see `Outcome`)."""
    catching_test: str | None
    """The first failing test's node id (caught only)."""
    seconds: float
    """Wall time of its pytest run."""


@contextmanager
def tree_copy(root: Path = ROOT) -> Iterator[Path]:
    """A copy of the tree's tracked and untracked-but-not-ignored files, removed afterwards."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    with tempfile.TemporaryDirectory(prefix="cpbench-mutants-") as tmp:
        target = Path(tmp)
        for name in filter(None, listed):
            source = root / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
        # Bytecode checked against each source's hash (not its mtime and size, which a mutant
        # of equal length written in the same second would keep): a child compiles only the
        # mutated file, not the whole package again (0.35 s of a unit-level run's ~1 s).
        for package in ("cpbench", "tests"):
            compileall.compile_dir(target / package, quiet=2,
                                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        yield target


def _start_worker(
    tree: Path,
    runs: list[dict[str, Any]],
    timeout_s: float,
    progress: bool = False,
) -> subprocess.Popen[str]:
    """`tests.mutation.worker` on `runs` in `tree` (one process; one fork per run); its
    progress lines go to this process's stderr when `progress`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Not CI's split (tests/ci_split.py): every test a mutant names runs, torch-free or not.
    env.pop("CPBENCH_CI", None)
    spec = tree / ".mutation-runs.json"
    spec.write_text(json.dumps({"runs": runs, "timeout": timeout_s}))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.mutation.worker", str(spec)],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        text=True,
    )


def _answers(worker: subprocess.Popen[str], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worker's answers, once it has ended. It stops after a failing run marked
    `must_pass`: then the answers end with it."""
    stdout, stderr = worker.communicate()
    answers = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    stopped = any(
        run.get("must_pass") and answer["code"] != 0
        for run, answer in zip(runs, answers, strict=False)
    )
    if len(answers) != len(runs) and not stopped:
        raise RuntimeError(
            f"the mutation worker answered {len(answers)} of {len(runs)} runs "
            f"(exit {worker.returncode}):\n{(stderr or '(its stderr is above)')[-3000:]}"
        )
    return answers


_FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def first_failure(output: str) -> str | None:
    """The node id of the first FAILED/ERROR line of pytest's short summary."""
    match = _FAILED.search(output)
    return match.group(1) if match else None


class BaselineFailed(RuntimeError):
    """The unmutated tree fails the mutants' tests."""


def run_mutants(
    mutants: Sequence[Mutant],
    timeout_s: float = 900.0,
    root: Path = ROOT,
    progress: bool = False,
    jobs: int = 1,
) -> list[Result]:
    """Every mutant, one at a time per job, on `jobs` copies of `root` (see the module
    docstring); a line per finished run on stderr when `progress`. Jobs run side by side: more
    than one only where the tests' own timing allows it (the fast subset's unit-level tests)."""
    options = sorted({t for m in mutants for t in m.tests if t.startswith("-")})
    if options:  # one would apply to the whole baseline, not to its mutant's tests
        raise ValueError(f"mutant tests must be node ids or files, not options: {options}")
    if jobs < 1:
        raise ValueError(f"jobs ({jobs}) must be at least 1")
    with ExitStack() as stack:
        trees = [stack.enter_context(tree_copy(root)) for _ in range(jobs)]
        union = list(dict.fromkeys(t for m in mutants for t in m.tests))
        stale = {m.name for m in mutants if (trees[0] / m.file).read_text().count(m.old) != 1}
        chosen = [m for m in mutants if m.name not in stale]
        # Each job: one worker (one import of torch and the rest) for its share of the runs,
        # each mutant applied in that job's own copy; the baseline is the first job's first run
        # (that worker stops after a failing baseline).
        baseline_run = {"name": "baseline", "tests": union, "must_pass": True}
        shares: list[list[dict[str, Any]]] = [[baseline_run], *([] for _ in trees[1:])]
        for i, m in enumerate(chosen, start=1):  # every jobs-th run, counting the baseline
            job = i % jobs
            shares[job].append({"name": m.name, "file": str(trees[job] / m.file), "old": m.old,
                                "new": m.new, "tests": list(m.tests)})  # fmt: skip
        started = [
            (_start_worker(tree, share, timeout_s, progress), share)
            for tree, share in zip(trees, shares, strict=True)
            if share
        ]
        answers = [answer for worker, share in started for answer in _answers(worker, share)]
        baseline = answers.pop(0)
        if baseline["code"] != 0:
            raise BaselineFailed(
                f"the unmutated tree fails the mutants' tests (pytest exit {baseline['code']}):"
                f"\n{baseline['output'][-3000:]}"
            )
        if len(answers) != len(chosen):
            raise RuntimeError(
                f"the mutation workers answered {len(answers)} of {len(chosen)} runs"
            )
        by_name = {a["name"]: a for a in answers}
    results: list[Result] = []
    for mutant in mutants:
        if mutant.name in stale:
            results.append(Result(mutant, "stale", None, 0.0))
            continue
        answer = by_name[mutant.name]
        code = answer["code"]
        outcome: Outcome
        if code is None:
            outcome = "timeout"
        elif code == 1:
            outcome = "caught"
        elif code == 0:
            outcome = "survived"
        else:
            outcome = "error"
        catching = first_failure(answer["output"]) if outcome == "caught" else None
        results.append(Result(mutant, outcome, catching, answer["seconds"]))
    return results


def markdown_table(results: Sequence[Result]) -> str:
    """The results as the Markdown table docs/mutation.md carries."""
    lines = [
        "| mutant | file | outcome | catching test | seconds |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        test = f"`{r.catching_test}`" if r.catching_test else "-"
        lines.append(
            f"| `{r.mutant.name}` | `{r.mutant.file}` | {r.outcome} | {test} | {r.seconds:.1f} |"
        )
    return "\n".join(lines)
