"""Every feasible layout of an enumeration as CSV rows, streamed (no cap on the count).

One row per layout, fastest predicted first: its `--layout` text, the id (a file-safe form),
each dimension, and the predicted figures, each with its interval (`interval` names it; the
`_low`/`_high` columns are empty and `interval` says "uncalibrated" where no cross-validated
interval exists for the GPU and software stack).
"""

from __future__ import annotations

import csv
from pathlib import Path

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.uncertainty import UNCALIBRATED
from autotune.costmodel.uncertainty import Interval
from autotune.exceptions import AutotuneError
from autotune.layout import DIMS
from autotune.space.search_space import Enumeration
from autotune.units import GIB

DIMENSIONS = tuple(d.name for d in DIMS)
"""The layout columns, in `Layout` order."""
COLUMNS = ("rank", "layout", "layout_id", *DIMENSIONS,
           "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high",
           "step_time_s", "step_time_s_low", "step_time_s_high",
           "tflops_per_gpu", "mfu", "mfu_low", "mfu_high", "peak_memory_gib", "interval")
"""The CSV header."""


def _pair(low_high: tuple[float, float] | None, fmt: str) -> list[str]:
    """An interval's two ends formatted, or two empty cells (uncalibrated)."""
    return ["", ""] if low_high is None else [format(x, fmt) for x in low_high]


def _row(rank: int, e: Estimate, band: Interval | None) -> list[object]:
    fields = e.layout.to_dict()
    tokens, step, mfu = e.tokens_per_s, e.step_time_s, e.mfu
    return [rank, e.layout.text, e.layout.id, *(fields[d] for d in DIMENSIONS),
            f"{tokens:.1f}", *_pair(band.throughput(tokens) if band else None, ".1f"),
            f"{step:.6g}", *_pair(band.step_s(step) if band else None, ".6g"),
            f"{e.tflops_per_gpu:.2f}", f"{mfu:.4f}",
            *_pair(band.throughput(mfu) if band else None, ".4f"),
            f"{e.peak_memory_bytes / GIB:.2f}",
            band.text() if band else UNCALIBRATED]


def write_layouts_csv(path: Path, result: Enumeration, band: Interval | None,
                      count: int | None = None) -> int:
    """Write the first `count` layouts (all when None) of `result` to `path`, row by row;
    returns how many rows were written.

    Raises:
        AutotuneError: the file cannot be written (naming it and the reason).
    """
    total = len(result) if count is None else min(count, len(result))
    try:
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            for i in range(total):
                writer.writerow(_row(i + 1, result.estimates.row(i), band))
    except OSError as error:
        raise AutotuneError(
            f"--csv: cannot write {path} ({error.strerror or error}); give a writable file path"
        ) from error
    return total
