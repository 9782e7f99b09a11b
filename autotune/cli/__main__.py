"""`python -m autotune.cli ARGS` runs the command line as the `autotune` script does."""

from autotune.cli.app import main

main()
