"""Shared test setup: a fixed DeepSpeed op cache so JIT builds happen once per machine, and
the shellcheck command."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "autotune" / "torch_extensions")
)


@pytest.fixture
def shellcheck() -> str:
    """The shellcheck command. CI installs it (.ci/run), so there a missing one fails the test;
    elsewhere (the CI variable unset) the test is skipped, saying so."""
    path = shutil.which("shellcheck")
    if path is None and os.environ.get("CI"):
        pytest.fail("shellcheck is not installed; CI lints the rendered scripts with it "
                    "(.ci/run installs the Debian package shellcheck)")
    if path is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); outside CI the "
                    "lint is skipped, in CI (CI set) it fails")
    return path
