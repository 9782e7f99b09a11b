"""Fixtures of the runner tests (helpers live in helpers_runners.py)."""

from __future__ import annotations

import pytest
from helpers_runners import tiny_config

from autotune.specs import AutotuneConfig


@pytest.fixture
def cfg() -> AutotuneConfig:
    """tiny-gpt on 2 local processes, DeepSpeed, 64 tokens x 8 sequences per step."""
    return tiny_config()
