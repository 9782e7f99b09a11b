"""The `autotune` command line: a thin Typer app over the API (parse, call, print with rich)."""

from autotune.cli import calibrate as _calibrate  # noqa: F401  (registers `autotune calibrate`)
from autotune.cli import plan as _plan  # noqa: F401  (registers `autotune plan`)
from autotune.cli import verify as _verify  # noqa: F401  (registers `autotune verify`)
from autotune.cli.app import app
from autotune.cli.app import main

__all__ = ["app", "main"]
