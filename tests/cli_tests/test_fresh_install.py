"""The CLI in a virtual environment built from pyproject.toml alone, as a new user installs it.

The test environment has packages the project does not declare (click, among others); a venv
without system site packages shows what a fresh `pip install torch==X autotune` really gets.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_cli import REPO


@pytest.mark.slow
def test_usage_error_in_a_fresh_venv(tmp_path: Path) -> None:
    """Oracle: pip resolving the declared dependencies into an empty venv, and the contract:
    a usage error exits 2 in one line. typer 0.29 vendors click and does not install it, so the
    old error handler's `import click` failed there with ModuleNotFoundError (exit 1)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    python, autotune = venv / "bin" / "python", venv / "bin" / "autotune"
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"  # the wheel this machine has
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", torch_pin,
         str(REPO)], capture_output=True, text=True, timeout=1500, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('click'))"],
        capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "None"  # click is not among the dependencies

    usage = subprocess.run([str(autotune), "estimate", "-m", "llama3-8b", "-c", "dgx-h100:4"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2, usage.stderr[-3000:]
    lines = [line for line in usage.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Missing option '--layout'" in lines[0], usage.stderr
    assert "Traceback" not in usage.stderr and "click" not in usage.stderr

    works = subprocess.run([str(autotune), "estimate", "-m", "llama3-8b", "-c", "dgx-h100:4",
                            "-l", "tp=8,pp=2,zero=1", "--json"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert works.returncode == 0, works.stderr[-3000:]
    assert '"tokens_per_s"' in works.stdout
