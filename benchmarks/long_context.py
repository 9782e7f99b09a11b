"""Long-context rows: a missing context-parallel or sequence-length term, or the attention rate?

Usage:
    python benchmarks/long_context.py [--min-seq 8192]

For every measured dense H100 Megatron-Core row of data/published_runs.csv at or above
--min-seq tokens (or with cp > 1), with the constants autotune ships for (GPU, stack), the table
shows the layout the model picks (its fastest candidate where the source left settings open),
the share of the predicted step spent in attention and in the cp ring, the throughput error, and
the attention efficiency that would reproduce the measured step time with every other term as
it is (`implied`, solved by bisection on `attention_efficiency`, or on
`flash_attention_efficiency` for rows that ran Transformer Engine's FlashAttention-2 backend: the
`kernel` column, `TrainSpec.attention_backend`). A missing cp or long-sequence
term would show as an implied efficiency that drifts with cp or sequence length; a kernel that
runs at another rate than the fitted one shows as a flat implied efficiency away from the fitted
value. In-sample constants: a diagnosis, not an accuracy figure (that is accuracy.py's).
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from autotune.calibration.fit import Measured
from autotune.calibration.fit import best_layout
from autotune.calibration.fit import implied_constant
from autotune.calibration.fit import predicted_step_s
from autotune.calibration.fit import published_points
from autotune.calibration.published import label
from autotune.calibration.published import open_dimensions
from autotune.costmodel.constants import FIT_BOUNDS
from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.step_time import estimate_time
from autotune.layout import LayoutTable


def attention_constant(point: Measured) -> str:
    """The constant the row's attention kernel runs at: FlashAttention-2's where the run told
    Transformer Engine to use it (`TrainSpec.attention_backend`), else the fused kernel's."""
    flash = point.cfg.train.attention_backend == "flash"
    return "flash_attention_efficiency" if flash else "attention_efficiency"


def implied_attention(point: Measured, k: Constants) -> float | None:
    """The attention efficiency at which the model's fastest candidate takes the measured step
    time, other constants fixed (None when no value within 0.05-1 does)."""
    return implied_constant(point, k, attention_constant(point), 0.05, 1.0, xtol=1e-4)


def shares(point: Measured, k: Constants) -> tuple[float, float]:
    """(attention, cp ring) share of the predicted step of the model's pick."""
    table = LayoutTable.from_layouts([best_layout(point, k)])
    est = estimate_time(point.cfg, table, k)
    name = attention_constant(point)
    slow = k.model_copy(update={name: getattr(k, name) / 2})
    twice = estimate_time(point.cfg, table, slow)
    # halving the efficiency doubles attention time: the difference is the attention time
    attention = float(twice.total[0] - est.total[0])
    return attention / float(est.total[0]), float(est.parts["cp_comm"][0] / est.total[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-seq", type=int, default=8192)
    args = parser.parse_args()
    console = Console(width=200)
    table = Table(title="Long-context rows (H100, megatron-core): implied attention efficiency")
    for column in ("row", "seq", "GPUs", "prec", "kernel", "layout (* = model's pick)",
                   "attention", "cp ring", "err", "implied"):
        table.add_column(column, justify="left" if column in ("row", "prec", "kernel") or
                         column.startswith("layout") else "right")
    implied: dict[str, list[float]] = {}
    in_use: dict[str, float] = {}
    for p in published_points():
        cfg = p.cfg
        long = cfg.train.seq_length >= args.min_seq or max(lay.cp for lay in p.layouts) > 1
        if (cfg.cluster.gpu.name != "h100-sxm-80gb" or cfg.train.software_stack != "megatron-core"
                or cfg.model.num_experts or not long):
            continue
        k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
        name = attention_constant(p)
        in_use[name] = getattr(k, name)
        att, ring = shares(p, k)
        value = implied_attention(p, k)
        if value is not None and att > 0.3:
            implied.setdefault(name, []).append(value)
        err = p.step_time_s / predicted_step_s(p, k) - 1
        table.add_row(p.name, str(cfg.train.seq_length), str(cfg.world_size),
                      cfg.train.precision, cfg.train.attention_backend,
                      label(best_layout(p, k), open_dimensions(p.layouts)),
                      f"{att:.0%}", f"{ring:.1%}", f"{err:+.1%}",
                      "n/a" if value is None else f"{value:.3f}")
    console.print(table)
    low, high = FIT_BOUNDS["attention_efficiency"]
    for name, values in sorted(implied.items()):
        console.print(f"rows with attention > 30 % of the step running {name}: implied "
                      f"{np.min(values):.3f}-{np.max(values):.3f} (median "
                      f"{np.median(values):.3f}, {len(values)} rows); in use {in_use[name]:.3f}"
                      + (f" (fitted, bounds {low:g}-{high:g})"
                         if name == "attention_efficiency" else " (FlashAttention-2, not fitted)"))


if __name__ == "__main__":
    main()
