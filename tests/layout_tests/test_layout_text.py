"""`Layout.text`, the one notation of a layout that every table, report and script prints."""

from __future__ import annotations

import pytest

from autotune import enumerate_layouts
from autotune import load_config
from autotune import load_space
from autotune.frameworks import get_framework
from autotune.layout import Layout

PROBLEMS = (
    ("llama3-8b", "dgx-h100:2", "megatron"),
    ("llama3-8b", "dgx-h100:2", "deepspeed"),
    ("mixtral-8x7b", "dgx-h100:4", "megatron"),
)
"""Dense layouts of both frameworks, and expert-parallel ones (ep and etp in the text)."""


@pytest.mark.parametrize(("model", "cluster", "framework"), PROBLEMS)
def test_the_printed_text_of_every_feasible_layout_reads_back(
    model: str, cluster: str, framework: str
) -> None:
    """Oracle: `Layout.parse`, the reader of `--layout`: the text printed for every layout the
    enumeration keeps (each one, not a sample) reads back as that same layout, so a user can
    paste any layout a table shows into `--layout`."""
    cfg = load_config(model, cluster, framework=framework)
    rows = enumerate_layouts(cfg, load_space(None, framework)).feasible.rows()
    assert rows
    bundle = get_framework(framework)
    world, gbs = cfg.world_size, cfg.train.global_batch_size
    assert any(r.moe_parallel for r in rows) == (model == "mixtral-8x7b")
    for layout in rows:
        assert layout.text.count("=") == len(layout.text.split(","))
        assert Layout.parse(layout.text, world, gbs, bundle) == layout

