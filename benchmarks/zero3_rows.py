"""ZeRO-3 rows: what the measured step times say about the network ZeRO-3 reached.

Usage:
    python benchmarks/zero3_rows.py

For every measured ZeRO-3 row of data/published_runs.csv (DeepSpeed, PyTorch FSDP), with the
constants autotune ships for (GPU, stack), the table shows the layout the model picks, the
predicted compute and ZeRO-3 seconds per step, the throughput error, and the network efficiency
that would reproduce the measured step time with every other term as it is (`implied`, solved by
bisection on `comm_efficiency`, 0.005-1), with the bus bandwidth per GPU it means (the ring's
node-crossing hops share the node's NICs: gpus_per_node · NIC · efficiency, NVLink-bound). A
model that charges the right traffic and overlap shows an implied efficiency near the fitted
0.8 on every row; one that misses a term shows it drifting with the ranks or the model.
In-sample constants: a diagnosis, not an accuracy figure (that is accuracy.py's).
"""

from __future__ import annotations

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
from autotune.costmodel.collectives import bus_bandwidth
from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.step_time import estimate_time
from autotune.layout import LayoutTable


def implied_network(point: Measured, k: Constants) -> float | None:
    """The comm_efficiency at which the model's fastest candidate takes the measured step time
    (None when no value within 0.005-1 does)."""
    return implied_constant(point, k, "comm_efficiency", 0.005, 1.0, xtol=1e-5)


def main() -> None:
    console = Console(width=200)
    table = Table(title="ZeRO-3 rows: predicted parts and the network efficiency the measured "
                        "step implies")
    for column in ("row", "GPU", "stack", "GPUs", "layout (* = model's pick)", "measured s",
                   "compute s", "zero3 s", "err", "implied eff", "GB/s per GPU"):
        table.add_column(column, justify="left" if column in ("row", "GPU", "stack") or
                         column.startswith("layout") else "right")
    for p in published_points():
        if not any(lay.zero == 3 for lay in p.layouts):
            continue
        cfg = p.cfg
        k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
        pick = best_layout(p, k)
        est = estimate_time(cfg, LayoutTable.from_layouts([pick]), k)
        err = p.step_time_s / predicted_step_s(p, k) - 1
        value = implied_network(p, k)
        rate = "n/a"
        if value is not None:
            ranks = np.array([pick.dp * pick.cp])
            per_node = np.array([max(cfg.cluster.gpus_per_node // pick.tp, 1)])
            at = k.model_copy(update={"comm_efficiency": value})
            rate = f"{float(bus_bandwidth(ranks, per_node, cfg, at)[0]) / 1e9:.0f}"
        table.add_row(p.name, cfg.cluster.gpu.name.split("-")[0], cfg.train.software_stack,
                      str(cfg.world_size), label(pick, open_dimensions(p.layouts)),
                      f"{p.step_time_s:.2f}", f"{float(est.parts['compute'][0]):.2f}",
                      f"{float(est.parts['zero3_gather'][0]):.2f}", f"{err:+.1%}",
                      "n/a" if value is None else f"{value:.3f}", rate)
    console.print(table)


if __name__ == "__main__":
    main()
