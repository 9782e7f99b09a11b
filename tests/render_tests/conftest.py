"""Render tests: a test that takes `megatron_case` or `deepspeed_case` runs once per sampled
(config, layout) of render_samples.py; `megatron_moe_case` / `deepspeed_moe_case` once per
sampled layout of a Mixture-of-Experts model."""

from __future__ import annotations

import pytest
from render_samples import sample


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for framework in ("megatron", "deepspeed"):
        fixture = f"{framework}_case"
        if fixture in metafunc.fixturenames:
            cases = sample(framework)
            metafunc.parametrize(fixture, cases, ids=[case.name for case in cases])
        if f"{framework}_moe_case" in metafunc.fixturenames:
            cases = tuple(case for case in sample(framework) if case.cfg.model.moe)
            metafunc.parametrize(f"{framework}_moe_case", cases, ids=[c.name for c in cases])
