"""Predicted vs published training throughput, per row of the calibration data.

Usage:
    python benchmarks/accuracy.py [--data CSV] [--fit]

Each row's layout is taken as published; where the source leaves micro-batch, virtual pipeline or
recompute unstated, the fastest candidate by the model stands for the run. TFLOP/s are compared in
the row's own FLOPs convention. --fit refits the throughput constants per GPU type (least
squares) and writes them to autotune/presets/constants.yaml. Target: median |error| <= 5 %,
max <= 12 %.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from autotune import constants as constants_module
from autotune.calibration import best_layout
from autotune.calibration import fit_constants
from autotune.calibration import predicted_step_s
from autotune.calibration import published_points
from autotune.constants import Constants
from autotune.constants import constants_for
from autotune.resources import resource_dir

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "published_runs_calibration.csv"
FITTED = ("gemm_efficiency", "gemm_half_size", "elementwise_passes", "comm_efficiency")


def write_constants(fitted: dict[str, Constants]) -> Path:
    """Store fitted constants per GPU preset; H200 shares the H100's Hopper die."""
    path = resource_dir("presets") / "constants.yaml"
    table = yaml.safe_load(path.read_text()) or {}
    table.setdefault("default", {})
    for gpu, k in sorted(fitted.items()):
        table[gpu] = {**table.get(gpu, {}), **{n: round(getattr(k, n), 4) for n in FITTED}}
    # H200 has no published rows: it starts from the H100 fit (same die) and keeps whatever
    # a GPU measurement (benchmarks/gpu_check.py --refit) set for it
    if "h100-sxm-80gb" in table:
        table["h200-sxm-141gb"] = {**table["h100-sxm-80gb"], **table.get("h200-sxm-141gb", {})}
    header = (
        "# Calibrated constants per GPU preset (autotune/constants.py gives meaning and units).\n"
        "# Written by `python benchmarks/accuracy.py --fit` from the published runs in\n"
        "# ../shared/data/published_runs_calibration.csv; H200 reuses the H100 fit (same die).\n"
    )
    path.write_text(header + yaml.safe_dump(table, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--fit", action="store_true", help="refit and write constants.yaml")
    args = parser.parse_args()
    points = published_points(args.data)
    gpus = sorted({p.gpu for p in points})
    if args.fit:
        fitted = {
            g: fit_constants([p for p in points if p.gpu == g], Constants(), FITTED) for g in gpus
        }
        print(f"wrote {write_constants(fitted)}")
        constants_module._table.cache_clear()
    console = Console(width=140)
    table = Table(title="Predicted vs published throughput (TFLOP/s per GPU, row's convention)")
    for column in (
        "row",
        "model",
        "GPUs",
        "layout (model's pick where unpublished)",
        "published",
        "predicted",
        "error",
    ):
        table.add_column(
            column,
            justify="right" if column in ("GPUs", "published", "predicted", "error") else "left",
        )
    errors: dict[str, list[float]] = {g: [] for g in gpus}
    for p in points:
        k = constants_for(p.cfg.cluster.gpu)
        predicted = p.step_time_s / predicted_step_s(p, k)
        published = p.reported_tflops
        error = predicted - 1
        errors[p.gpu].append(error)
        layout = best_layout(p, k)
        table.add_row(
            p.name,
            p.cfg.model.name,
            str(p.cfg.world_size),
            layout.id,
            f"{published:.1f}",
            f"{published * predicted:.1f}",
            f"{error:+.1%}",
        )
    console.print(table)
    summary = Table(title="Error summary (|predicted/published - 1|)")
    for column in ("GPU", "rows", "median", "max"):
        summary.add_column(column)
    everything = np.abs(np.concatenate([np.array(v) for v in errors.values()]))
    for g in gpus:
        e = np.abs(np.array(errors[g]))
        summary.add_row(g, str(len(e)), f"{np.median(e):.1%}", f"{np.max(e):.1%}")
    summary.add_row(
        "all", str(len(everything)), f"{np.median(everything):.1%}", f"{np.max(everything):.1%}"
    )
    console.print(summary)
    ok = np.median(everything) <= 0.05 and np.max(everything) <= 0.12
    console.print(f"target median <= 5 %, max <= 12 %: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
