"""Where the predicted step time of each published MoE run goes, beside its measured step.

Usage:
    python benchmarks/moe_breakdown.py [--data CSV]

For every measured MoE row of data/published_runs.csv (the model's fastest candidate where the
source leaves settings open), with the stored constants of its (GPU, stack): the measured and
predicted step time, the error in throughput (measured/predicted step − 1, + = predicted too
fast), the step-time parts (`autotune.costmodel.step_time.TIME_PARTS`, shares of the step), and
inside one MoE layer's forward on the slowest rank (ms): the routed-expert grouped GEMMs, the
other GEMMs, attention and the memory-bound kernels, with the tokens per local expert (M of the
grouped GEMM) and the fraction of the training precision's peak the expert up-projection
reaches ("eff": `gemm_efficiency` at its shape times the grouped GEMM efficiency). These are
predictions, not measurements: the published runs state only their throughput.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from autotune.calibration.fit import as_point
from autotune.calibration.fit import best_layout
from autotune.calibration.published import PUBLISHED_RUNS
from autotune.calibration.published import published_runs
from autotune.costmodel.constants import constants_for
from autotune.costmodel.kernels import gemm_efficiency
from autotune.costmodel.kernels import gemm_seconds
from autotune.costmodel.kernels import layer_gemms
from autotune.costmodel.kernels import layer_times
from autotune.costmodel.step_time import TIME_PARTS
from autotune.costmodel.step_time import estimate_time
from autotune.layout import LayoutTable

SHOWN = ("compute", "ep_comm", "pp_bubble", "dp_comm", "tp_comm")
"""Step parts with their own column; the others are summed as 'rest'."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=PUBLISHED_RUNS)
    args = parser.parse_args()
    table = Table(title="MoE rows: predicted step parts (share of the predicted step) and one MoE "
                        "layer's forward on the slowest rank (ms); stored constants")
    for column in ("row", "layout", "meas s", "pred s", "err", *SHOWN, "rest", "M/expert",
                   "eff", "experts", "other GEMM", "attn", "memory"):
        table.add_column(column, justify="left" if column in ("row", "layout") else "right")
    for run in published_runs(args.data):
        if run.skip or run.step_time_s is None or not run.row["num_experts"]:
            continue
        point = as_point(run)
        cfg = point.cfg
        k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
        layout = best_layout(point, k)
        one = LayoutTable.from_layouts([layout])
        time = estimate_time(cfg, one, k)
        total = float(time.total[0])
        shares = [float(time.parts[name][0]) / total for name in TIME_PARTS]
        rest = sum(s for name, s in zip(TIME_PARTS, shares, strict=True) if name not in SHOWN)
        gemms = layer_gemms(cfg, one, k, moe=True)
        seconds = [float(np.squeeze(gemm_seconds(cfg, g, k)[0])) for g in gemms]
        expert_s = sum(s for g, s in zip(gemms, seconds, strict=True) if g.routed)
        other_s = sum(s for g, s in zip(gemms, seconds, strict=True) if not g.routed)
        up = next(g for g in gemms if g.routed)
        fp8 = cfg.train.precision == "fp8"
        grouped = k.fp8_grouped_gemm_efficiency if fp8 else k.grouped_gemm_efficiency
        eff = grouped * float(np.squeeze(gemm_efficiency(up.m * up.slow, up.n, up.k, k, fp8)))
        layer = layer_times(cfg, one, k, moe=True)
        table.add_row(
            run.name, layout.text,
            f"{point.step_time_s:.2f}", f"{total:.2f}", f"{point.step_time_s / total - 1:+.0%}",
            *(f"{shares[TIME_PARTS.index(name)]:.0%}" for name in SHOWN), f"{rest:.0%}",
            f"{float(np.squeeze(up.m)):.0f}", f"{eff:.2f}", f"{expert_s * 1e3:.2f}",
            f"{other_s * 1e3:.2f}", f"{float(layer.attention_forward[0]) * 1e3:.2f}",
            f"{float(layer.memory_forward[0]) * 1e3:.2f}")
    Console(width=220).print(table)


if __name__ == "__main__":
    main()
