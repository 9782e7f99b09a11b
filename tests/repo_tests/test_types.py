"""The package type-checks under `mypy --strict` with the configuration in pyproject.toml.

Oracle: mypy itself (`python -m mypy`, the checker the `mypy` command runs). It runs in its own
process: in-process (`mypy.api.run`) it would leave about 1 GiB and its own garbage-collector
thresholds in the test process, and tear its object graph down when the test run exits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_package_passes_mypy_strict() -> None:
    """`mypy` in the repository root (`[tool.mypy]`: strict, files = autotune) finds no error;
    on failure the assertion shows mypy's report."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, f"mypy exited {done.returncode}:\n{done.stdout}{done.stderr}"
