"""Run the real CLI entry point (`autotune.cli.app._run`) in this process or as a subprocess."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

from autotune.cli.app import _run
from autotune.cli.app import app

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Result:
    """Exit code and what the command printed."""

    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        """The non-empty lines of stderr, less the warnings about a valid input that an error
        may follow (`Problem.warnings`)."""
        return [line for line in self.err.splitlines()
                if line.strip() and not line.startswith("warning: ")]


def cli(*args: str) -> Result:
    """`autotune ARGS` through `_run`, the function `main()` calls, with output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _run(app, [str(a) for a in args])
    return Result(code, out.getvalue(), err.getvalue())


def cli_process(*args: str, cwd: Path | None = None, timeout: float = 120) -> Result:
    """`python -m autotune.cli ARGS` in a subprocess (this checkout first on the path)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "autotune.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return Result(done.returncode, done.stdout, done.stderr)


def assert_usage_error(result: Result, *fragments: str) -> None:
    """Exit 2 with exactly one `error:` line naming every fragment, and no traceback."""
    assert result.code == 2, (result.code, result.err[-2000:])
    assert "Traceback" not in result.err + result.out
    assert len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
