"""Shared test setup: a fixed DeepSpeed op cache so JIT builds happen once per machine."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "autotune" / "torch_extensions")
)
