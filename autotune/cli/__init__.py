"""The `autotune` command line: a thin Typer app over the API (parse, call, print with rich)."""

from autotune.cli import plan as _plan  # noqa: F401  (registers `autotune plan`)
from autotune.cli.app import app
from autotune.cli.app import main

__all__ = ["app", "main"]
