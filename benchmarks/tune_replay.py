"""`cpbench tune`'s loop replayed on every group of the published tables cpbench ships
(ring-flash-attention's and yunchang's: `cpbench/data/published/*.csv`): per group the pick's
regret against the group's measured best, the share of exhaustive measurement spent (the measured
candidates' step times over all of the group's), and the number measured. Each group starts from
its machine's prior profile and sees only its own rows, as a user tuning that problem would.

    PYTHONPATH=$PWD python benchmarks/tune_replay.py [--refit scale|joint] [--prior-weight 3]

Issue 40's bar: every pick within 3% of the best, none worse than 10%, median share <= 30%."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpbench.app.tune import replay_published  # noqa: E402
from cpbench.model.tune import DEFAULT_SETTINGS, TuneSettings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", choices=("scale", "joint"), default=DEFAULT_SETTINGS.refit)
    parser.add_argument("--prior-weight", type=float, default=DEFAULT_SETTINGS.prior_weight)
    parser.add_argument("--no-learn-sigma", action="store_true")
    args = parser.parse_args()
    settings = TuneSettings(
        refit=args.refit, prior_weight=args.prior_weight, learn_sigma=not args.no_learn_sigma
    )
    started = time.perf_counter()
    groups = replay_published(settings=settings)
    wall = time.perf_counter() - started
    print(f"{'machine':24} {'problem':30} {'n':>3} {'runs':>4} {'regret':>7} {'share':>6}  stop")
    for g in groups:
        print(f"{g.machine[:24]:24} {g.problem[:30]:30} {g.candidates:3d} {g.runs:4d} "
              f"{g.regret:7.1%} {g.share:6.1%}  {g.stop}")  # fmt: skip
    regrets = [g.regret for g in groups]
    print(
        f"\n{len(groups)} groups in {wall:.1f} s: {sum(r <= 0.03 for r in regrets)} picks within "
        f"3% of the best, worst {max(regrets):.1%}; measured {sum(g.runs for g in groups)} of "
        f"{sum(g.candidates for g in groups)} candidates, median share of exhaustive "
        f"measurement {statistics.median(g.share for g in groups):.1%} (refit {settings.refit}, "
        f"learned sigma {settings.learn_sigma}, prior weight {settings.prior_weight:g})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
