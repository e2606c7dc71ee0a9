"""`python -m tests.mutation [--fast] [--only NAME ...] [--jobs N] [--list] [--markdown FILE]`: run the
mutation check (tests/mutation/runner.py); exit 0 when every mutant is caught, 1 when one
survives (or is stale, errs or times out), 2 when the unmutated tree fails the tests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.mutation.mutants import MUTANTS
from tests.mutation.runner import BaselineFailed, markdown_table, run_mutants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    parser.add_argument("--fast", action="store_true", help="only the fast subset (CI's)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--markdown", type=Path, help="also write the results table here")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="mutants run side by side (1 for the full list: its multi-rank tests time faults)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if (m.fast or not args.fast)]
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"unknown mutant(s) {', '.join(unknown)}; --list names them")
        chosen = [m for m in chosen if m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:36} {'fast' if m.fast else 'full'}  {m.file}: {m.why}")
        return 0
    try:
        results = run_mutants(chosen, args.timeout, progress=True, jobs=args.jobs)
    except BaselineFailed as exc:
        print(exc, file=sys.stderr)
        return 2
    table = markdown_table(results)
    print(table)
    caught = sum(r.outcome == "caught" for r in results)
    print(f"\n{caught} of {len(results)} mutants caught")
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
