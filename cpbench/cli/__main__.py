"""`python -m cpbench.cli ...`, e.g. under `torchrun -m cpbench.cli`."""

from cpbench.cli.main import main

main()
