"""Parallel efficiency of cpbench's CP attention next to the libraries: `cpbench efficiency`
(cpbench/app/efficiency/) with, on a machine without CUDA, the tests' flash_attn stand-in
(tests/stand_ins: PyTorch's fused CPU attention behind flash-attn's private API) on the path,
so that ring-flash-attention and yunchang run in the 16-bit groups too (they refuse float32).

    python benchmarks/parallel_efficiency.py [cpbench efficiency options]
    python benchmarks/parallel_efficiency.py --world-size 2 --dtype float32 --rounds 5
    python benchmarks/parallel_efficiency.py --profile --world-size 2 --dtype float32

Efficiency = t_single / (P x t_case), t_single the single-process fused SDPA step measured in
the same run (see `cpbench efficiency --help`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    if not torch.cuda.is_available() and "--no-stand-in" not in sys.argv:
        # The ranks are spawned: they inherit sys.path.
        sys.path.insert(0, str(ROOT / "tests" / "stand_ins"))
    argv = [a for a in sys.argv[1:] if a != "--no-stand-in"]
    from cpbench.cli.main import main as cli_main  # noqa: PLC0415

    sys.argv = ["cpbench", "efficiency", *argv]
    cli_main()


if __name__ == "__main__":
    main()
