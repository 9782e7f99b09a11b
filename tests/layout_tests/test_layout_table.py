"""`Layout` and `LayoutTable` derive the same degrees (one scalar, one columnar form).

Oracle: degrees worked out by hand for two layouts of 64 GPUs and a global batch of 512.
"""

from __future__ import annotations

import numpy as np

from autotune.layout import Layout
from autotune.layout import LayoutTable

SCALAR_ONLY = {"text", "id"}
"""Names of a single layout, with no columnar meaning."""


def _properties(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if isinstance(value, property)}


def test_scalar_and_columnar_layouts_derive_the_same_degrees() -> None:
    """Dense tp 4, pp 2, dp 8: model parallel 8, shard dp·cp 8, gas 512/(2·8) = 32. MoE tp 2,
    pp 4, dp 8, ep 8, etp 1: expert grid 32, edp 64/32 = 2, experts split."""
    assert _properties(Layout) - SCALAR_ONLY == _properties(LayoutTable)
    rows = [Layout(tp=4, pp=2, dp=8, mbs=2, gas=32),
            Layout(tp=2, pp=4, dp=8, mbs=1, gas=64, ep=8)]
    expected = [
        {"model_parallel": 8, "world_size": 64, "shard_degree": 8, "micro_batches": 32,
         "moe_parallel": False, "expert_grid": 2, "expert_data_parallel": 32,
         "global_batch_size": 512},
        {"model_parallel": 8, "world_size": 64, "shard_degree": 8, "micro_batches": 64,
         "moe_parallel": True, "expert_grid": 32, "expert_data_parallel": 2,
         "global_batch_size": 512},
    ]
    table = LayoutTable.from_layouts(rows)
    for name in _properties(LayoutTable):
        column = np.asarray(getattr(table, name))
        for i, row in enumerate(rows):
            assert getattr(row, name) == column[i] == expected[i][name], (name, i)
