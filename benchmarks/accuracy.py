"""Predicted vs published training throughput: leave-one-source-out cross-validation.

Usage:
    python benchmarks/accuracy.py [--data CSV] [--fit]

Rows come from data/published_runs.csv (sources and conventions in data/README.md). Each
published figure becomes a step time through the FLOPs convention it was computed with; every
row is then shown in autotune's convention (Megatron-Core FLOPs with the causal-halved attention
term, model FLOPs). Where the source leaves micro-batch, virtual pipeline, recompute, sequence
parallelism or sharding unstated, the fastest candidate that fits memory stands for the run.

Headline: for each publication (source), the few physical constants of each GPU type are fitted
on the bf16/fp16 rows of all other sources and that source's rows are predicted. The in-sample
error (fitted on every source) is the secondary line. fp8 rows are never fitted: they are
predicted with the GPU's bf16 constants. A fitted constant within 1 % of a FIT_BOUNDS limit is
flagged. --fit writes the constants fitted on every source to autotune/presets/constants.yaml.
Target: cross-validated median |error| <= 5 %, max <= 12 %.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from autotune.calibration.fit import Measured
from autotune.calibration.fit import as_point
from autotune.calibration.fit import at_bounds
from autotune.calibration.fit import best_layout
from autotune.calibration.fit import fit_constants
from autotune.calibration.fit import leave_one_source_out
from autotune.calibration.fit import predicted_step_s
from autotune.calibration.published import PUBLISHED_RUNS
from autotune.calibration.published import label
from autotune.calibration.published import open_dimensions
from autotune.calibration.published import published_runs
from autotune.costmodel.constants import Constants
from autotune.costmodel.flops import model_flops
from autotune.frameworks import framework_of
from autotune.resources import resource_dir

FITTED = ("gemm_efficiency", "gemm_half_size", "attention_efficiency", "elementwise_passes")
"""Constants fitted per GPU type (bounds: autotune.costmodel.constants.FIT_BOUNDS). The collective
and
overlap constants stay at their nccl-tests / SM-share values: the published runs do not
identify them (fitted, they run to opposite bounds on A100 and H100)."""


def fitted(point: Measured) -> bool:
    """Whether a point may enter a fit (fp8 rows never do)."""
    return point.cfg.train.precision != "fp8"


BASIS = {"iteration": "iter", "tokens/s": "tok/s", "TFLOP/s": "TF", "MFU": "MFU"}
"""Short names of the published figure each measured step time comes from."""


def short_basis(basis: str) -> str:
    """'TFLOP/s (SC21_EQ3)' → 'TF SC21_EQ3'."""
    head, _, convention = basis.partition(" (")
    return " ".join([BASIS.get(head.split(" ")[0], head), convention.rstrip(")")]).strip()


SAME_DIE = {"h200-sxm-141gb": "h100-sxm-80gb"}
"""GPU presets without bf16 rows that borrow the constants of the same die."""


def fit_per_gpu(points: Sequence[Measured]) -> dict[str, Constants]:
    """Constants fitted per GPU type on the fit-eligible points (plus same-die borrowers)."""
    gpus = sorted({p.gpu for p in points if fitted(p)})
    fits = {
        g: fit_constants([p for p in points if p.gpu == g and fitted(p)], Constants(), FITTED)
        for g in gpus
    }
    return fits | {g: fits[d] for g, d in SAME_DIE.items() if d in fits and g not in fits}


def cross_validate(points: Sequence[Measured]) -> tuple[dict[str, float], Counter]:
    """Predicted step time of every point with the constants fitted without its source, and how
    many folds put each (GPU, constant, side) on a bound. Points whose GPU type has no other
    source are left out."""
    predicted: dict[str, float] = {}
    on_bound: Counter = Counter()
    for _, train, held_out in leave_one_source_out(points):
        fits = fit_per_gpu(train)
        for gpu, k in fits.items():
            on_bound.update((gpu, *hit) for hit in at_bounds(k, FITTED) if gpu not in SAME_DIE)
        for p in held_out:
            if p.gpu in fits:
                predicted[p.name] = predicted_step_s(p, fits[p.gpu])
    return predicted, on_bound


def write_constants(fits: dict[str, Constants]) -> Path:
    """Store fitted constants per GPU preset; H200 shares the H100's Hopper die."""
    path = resource_dir("presets") / "constants.yaml"
    table = yaml.safe_load(path.read_text()) or {}
    table.setdefault("default", {})
    for gpu, k in sorted(fits.items()):
        table[gpu] = {**table.get(gpu, {}), **{n: round(getattr(k, n), 4) for n in FITTED}}
    # H200 has no bf16 published rows: it takes the H100 fit (same die) and keeps what a GPU
    # measurement (benchmarks/gpu_check.py --refit) set for its other constants
    if "h100-sxm-80gb" in table:
        fitted_h100 = {n: table["h100-sxm-80gb"][n] for n in FITTED}
        table["h200-sxm-141gb"] = {**table.get("h200-sxm-141gb", {}), **fitted_h100}
    header = (
        "# Calibrated constants per GPU preset (autotune/costmodel/constants.py: meaning,\n"
        "# unit, source, fit bounds). Written by `python benchmarks/accuracy.py --fit`\n"
        "# from the published runs in data/published_runs.csv (bf16/fp16 rows, robust least\n"
        "# squares on log step time); H200 reuses the H100 fit (same die). Unlisted constants\n"
        "# keep their defaults.\n"
    )
    path.write_text(header + yaml.safe_dump(table, sort_keys=False))
    return path


def tflops(point: Measured, step_s: float) -> float:
    """TFLOP/s per GPU in autotune's convention for one step of `step_s` seconds."""
    cfg = point.cfg
    vocab = framework_of(cfg).padded_vocab(cfg.model.vocab_size, point.layouts[0].tp)
    flops = model_flops(cfg.model, cfg.train.seq_length, cfg.train.global_batch_size, vocab)
    return float(flops) / step_s / cfg.world_size / 1e12


def layout_text(point: Measured, k: Constants) -> str:
    """The model's pick among the candidates, '*' marking the dimensions the source left open."""
    return label(best_layout(point, k), open_dimensions(point.layouts))


def summary_row(label: str, points: list[Measured], cv: dict[str, float],
                insample: dict[str, float]) -> list[str]:
    """GPU type, rows, sources, CV and in-sample median/max |error|."""
    def stats(predicted: dict[str, float]) -> str:
        errors = [abs(p.step_time_s / predicted[p.name] - 1)
                  for p in points if p.name in predicted]
        if not errors:
            return "n/a"
        return f"{np.median(errors):.1%} / {np.max(errors):.1%}"

    sources = len({p.source for p in points})
    return [label, str(len(points)), str(sources), stats(cv), stats(insample)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=PUBLISHED_RUNS)
    parser.add_argument("--fit", action="store_true", help="refit and write constants.yaml")
    args = parser.parse_args()
    console = Console(width=200)
    runs = published_runs(args.data)
    skipped = Counter(
        run.skip or ("recipe: no throughput published" if run.row["kind"] == "recipe"
                     else "no measured figure convertible to a step time")
        for run in runs if run.skip or run.step_time_s is None
    )
    points = [as_point(run) for run in runs if run.skip is None and run.step_time_s is not None]
    basis = {run.name: short_basis(run.basis) for run in runs}
    fits = fit_per_gpu(points)
    if args.fit:
        console.print(f"wrote {write_constants(fits)}")
    insample = {p.name: predicted_step_s(p, fits[p.gpu]) for p in points if p.gpu in fits}
    cv, on_bound = cross_validate(points)
    folds = len({p.source for p in points})

    table = Table(title="Published vs predicted TFLOP/s per GPU (autotune's convention: "
                        "Megatron-Core causal model FLOPs); CV = source left out of the fit")
    for column in ("row", "source", "model", "GPUs", "prec", "layout (* = model's pick)",
                   "from", "measured", "CV pred", "CV err", "in-sample err"):
        table.add_column(column, no_wrap=column in ("row", "layout (* = model's pick)", "from"),
                         justify="right" if column in (
            "GPUs", "measured", "CV pred", "CV err", "in-sample err") else "left")
    for p in points:
        k = fits.get(p.gpu, Constants())
        cv_cells = ["n/a", "n/a"]
        if p.name in cv:
            cv_cells = [f"{tflops(p, cv[p.name]):.0f}", f"{p.step_time_s / cv[p.name] - 1:+.1%}"]
        in_cell = f"{p.step_time_s / insample[p.name] - 1:+.1%}" if p.name in insample else "n/a"
        table.add_row(p.name, p.source, p.cfg.model.name, str(p.cfg.world_size),
                      p.cfg.train.precision, layout_text(p, k), basis[p.name],
                      f"{tflops(p, p.step_time_s):.0f}", *cv_cells, in_cell)
    console.print(table)

    summary = Table(title="Error summary: |predicted/measured throughput - 1|, median / max")
    for column in ("GPU (rows fitted)", "rows", "sources", "CV (leave one source out)",
                   "in-sample"):
        summary.add_column(column)
    in_fit = [p for p in points if fitted(p)]
    for gpu in sorted({p.gpu for p in in_fit}):
        summary.add_row(*summary_row(gpu, [p for p in in_fit if p.gpu == gpu], cv, insample))
    summary.add_row(*summary_row("all bf16/fp16", in_fit, cv, insample))
    fp8 = [p for p in points if not fitted(p)]
    if fp8:
        summary.add_row(*summary_row("fp8 (never fitted)", fp8, cv, insample))
    console.print(summary)

    constants = Table(title="Constants fitted on every source (in-sample)")
    for column in ("GPU", *FITTED):
        constants.add_column(column)
    for gpu, k in fits.items():
        constants.add_row(gpu, *(f"{getattr(k, n):.4g}" for n in FITTED))
    console.print(constants)
    for gpu, k in fits.items():
        for name, side, bound in at_bounds(k, FITTED) if gpu not in SAME_DIE else ():
            console.print(f"[bold red]WARNING: {gpu}: {name}={getattr(k, name):.4g} sits on its "
                          f"{side} bound {bound:g} (FIT_BOUNDS): the fit absorbs a missing or "
                          "wrong term[/]")
    for (gpu, name, side, bound), count in sorted(on_bound.items()):
        console.print(f"[bold red]WARNING: cross-validation: {gpu} {name} on its {side} bound "
                      f"{bound:g} in {count} of {folds} folds[/]")
    console.print(f"skipped {sum(skipped.values())} of {len(runs)} rows:")
    for reason, count in skipped.most_common():
        console.print(f"  {count:3d}  {reason}")
    errors = np.array([abs(p.step_time_s / cv[p.name] - 1) for p in in_fit if p.name in cv])
    ok = errors.size and np.median(errors) <= 0.05 and np.max(errors) <= 0.12
    console.print(f"target (cross-validated) median <= 5 %, max <= 12 %: "
                  f"{'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
