"""The dispatch counters, against counts worked out by hand for two-line programs."""

from __future__ import annotations

import torch

from autotune.workloads.dispatch import ElementwiseCount
from autotune.workloads.dispatch import saved_bytes


def test_count_skips_views_gemms_and_factories() -> None:
    """x + y on 4 fp32 elements reads 16 + 16 B and writes 16 B; the view, the mm and the
    ones() do not count; a mul by a broadcast scalar tensor reads 16 + 4 B and writes 16."""
    x, y = torch.ones(4), torch.ones(4)
    with ElementwiseCount() as count:
        z = (x + y).view(2, 2)
        torch.mm(z, z)
        torch.ones(3)
        _ = x * torch.tensor(2.0)
    assert count.names == {"add": 1, "mul": 1}
    assert count.ops == 2
    assert count.bytes == (16 + 16 + 16) + (16 + 4 + 16)


def test_saved_bytes_counts_each_storage_once_without_the_parameters() -> None:
    """x * w with both needing gradients saves x and w (16 B each); x * x saves x once; the
    parameter w is left out when named."""
    x = torch.ones(4, requires_grad=True)
    w = torch.ones(4, requires_grad=True)
    assert saved_bytes(lambda: x * w) == 32
    assert saved_bytes(lambda: x * x) == 16
    assert saved_bytes(lambda: x * w, exclude=[w]) == 16
