"""`python -m cpbench`."""

from cpbench.cli import main

main()
