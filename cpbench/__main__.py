"""`python -m cpbench`."""

from cpbench.cli.main import main

main()
