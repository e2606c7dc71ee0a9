"""The long run of tests/test_fuzz_readers.py: every reader of a user's file fed N generated and
mutated files (the same strategies, tests/fuzz_inputs.py), spread over the readers; prints each
reader's examples and failures, and exits 1 on a failure (a traceback or a stray file).

    python benchmarks/fuzz_readers.py --examples 100000 [--seed 0] [--seconds 180] [--cli]

--seconds stops early when the time is spent (the examples run so far are reported); --cli adds
the commands through the CLI (slower: report, validate, recommend, formulas)."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fuzz_inputs as fz  # noqa: E402

Check = Callable[[Path, Any], None]
INPUTS = {"r.jsonl", "s.toml", "p.toml"} | {
    f"{stem}{suffix}" for stem in ("docs", "t") for suffix in (".txt", ".json", ".csv", ".jsonl")
}


READERS: dict[str, tuple[st.SearchStrategy[Any], Check]] = {
    "results": (fz.results_files(), fz.check_results),
    "scenario": (fz.mutated_toml(fz.SCENARIO), fz.check_scenario),
    "profile": (st.sampled_from(fz.PROFILES).flatmap(fz.mutated_toml), fz.check_profile),
    "documents": (fz.documents_files(), lambda f, x: fz.check_documents(f, *x)),
    "table": (fz.table_files(), lambda f, x: fz.check_table(f, *x)),
}
CLI: dict[str, tuple[st.SearchStrategy[Any], Check]] = {
    "results (CLI)": (fz.results_files(), fz.check_results_commands),
    "documents (CLI)": (fz.documents_files(), fz.check_documents_command),
}


class OutOfTime(Exception):
    """The --seconds budget is spent."""


SLOW = 10
"""Seconds one input may take: beyond, it is a failure (a reader that hangs)."""


def _too_slow(signum: int, frame: object) -> None:
    raise TimeoutError(f"one input took over {SLOW} s")


def run(
    name: str, strategy: st.SearchStrategy[Any], check: Check, examples: int, seed: int,
    deadline: float,
) -> tuple[int, list[str]]:  # fmt: skip
    """Run `check` on up to `examples` inputs until `deadline`; (inputs run, failures)."""
    done, failures = 0, []

    @hypothesis.seed(seed)
    @settings(
        max_examples=examples, deadline=None, database=None,
        suppress_health_check=list(HealthCheck), phases=[Phase.generate],
    )  # fmt: skip
    @given(strategy)
    def one(value: Any) -> None:
        nonlocal done
        if time.monotonic() > deadline:
            raise OutOfTime
        done += 1
        with tempfile.TemporaryDirectory() as folder:
            signal.alarm(SLOW)
            try:
                check(Path(folder), value)
                stray = {p.name for p in fz.files_in(Path(folder))} - INPUTS
                assert not stray, f"files written beside the input: {sorted(stray)}"
            except Exception:  # noqa: BLE001 - every failure is reported, the run goes on
                failures.append(f"{name}: {traceback.format_exc(limit=-3)}input: {value!r:.300}")
            finally:
                signal.alarm(0)

    try:
        one()
    except OutOfTime:
        pass
    return done, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100_000, help="inputs in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=None, help="stop when spent")
    parser.add_argument("--cli", action="store_true", help="also the commands through the CLI")
    parser.add_argument("--only", default=None, help="the readers whose name contains this")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _too_slow)
    readers = {**READERS, **(CLI if args.cli else {})}
    readers = {k: v for k, v in readers.items() if args.only is None or args.only in k}
    start = time.monotonic()
    total_failures: list[str] = []
    for index, (name, (strategy, check)) in enumerate(readers.items()):
        left = len(readers) - index
        budget = (args.seconds - (time.monotonic() - start)) / left if args.seconds else None
        deadline = time.monotonic() + budget if budget is not None else float("inf")
        per_reader = args.examples // len(readers)
        began = time.monotonic()
        done, failures = run(name, strategy, check, per_reader, args.seed + index, deadline)
        total_failures += failures
        seconds = time.monotonic() - began
        print(f"{name:16} {done:7} inputs {len(failures):5} failures {seconds:8.1f} s", flush=True)
    for failure in total_failures[:20]:
        print("\n" + failure)
    print(f"\n{len(total_failures)} failures in {time.monotonic() - start:.0f} s")
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
