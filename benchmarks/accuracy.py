"""Predicted vs published training throughput: leave-one-source-out cross-validation.

Usage:
    python benchmarks/accuracy.py [--data CSV] [--fit]

Rows come from data/published_runs.csv (sources and conventions in data/README.md). Each
published figure becomes a step time through the FLOPs convention it was computed with; every
row is then shown in autotune's convention (Megatron-Core FLOPs with the causal-halved attention
term, model FLOPs). Where the source leaves micro-batch, virtual pipeline, recompute, sequence
parallelism or sharding unstated, the fastest candidate that fits memory stands for the run.

Headline: for each publication (source), the few physical constants of each (GPU type,
software stack) are fitted on the dense rows (bf16 and fp8) of that pair's other sources and the
source's rows are predicted (leave one source out); H200 rows are predicted by the H100 fit
(same die). Each fit starts from, and is pulled towards, the constants' physical values
(`prior`: the fused attention kernel the stack runs). The MoE constants (`MOE_FITTED`) are then
fitted on the pair's MoE rows of the same sources, the dense constants held (the same fit,
`fit_constants`), so a held-out source's MoE rows are predicted by the other sources' MoE rows.
The in-sample error (fitted on every source) is the secondary column; llm-analysis at its
README setting (`peer_llm_analysis.py`, where installed) on the same rows is the last. A
fitted constant within 1 % of a FIT_BOUNDS limit is flagged. --fit writes the constants fitted
on every source, and the cross-validated residual ranges per regime (the prediction intervals of
autotune.costmodel.uncertainty), to autotune/presets/constants.yaml.
Target: cross-validated median |error| <= 5 %, max <= 15 % for every (GPU, stack) with at
least two sources; MoE median <= 15 %. Runs of a recipe their publisher filed as a regression
(`autotune.calibration.published.KNOWN_REGRESSIONS`) are predicted and printed, with the MoE
figures they would give, but enter no fit, interval or judged figure.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
from autotune.calibration.published import KNOWN_REGRESSIONS
from autotune.calibration.published import PUBLISHED_RUNS
from autotune.calibration.published import label
from autotune.calibration.published import open_dimensions
from autotune.calibration.published import published_runs
from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.constants import fp8_from_sixteen
from autotune.costmodel.constants import table_path
from autotune.costmodel.constants import write_table
from autotune.costmodel.flops import model_flops
from autotune.costmodel.uncertainty import between_summary
from autotune.costmodel.uncertainty import regime
from autotune.costmodel.uncertainty import residual_summary
from autotune.frameworks import framework_of
from autotune.specs.inputs import load_gpu

sys.path.insert(0, str(Path(__file__).parent))
import peer_llm_analysis  # noqa: E402  (a benchmark module next to this script)

FITTED = ("gemm_efficiency", "gemm_half_size", "attention_efficiency", "elementwise_passes",
          "fp8_gemm_efficiency")
"""Constants fitted per (GPU type, software stack) (bounds: autotune.costmodel.constants.
FIT_BOUNDS); `fp8_gemm_efficiency` only where the pair has fp8 rows (otherwise it follows the
fitted `gemm_efficiency`: `fp8_from_sixteen`), `gemm_efficiency` only where it has 16-bit rows
(otherwise unidentified, it keeps its default). The collective
and overlap constants stay at their nccl-tests / SM-share values: the published runs do not
identify them (fitted, they run to opposite bounds on A100 and H100)."""

MOE_FITTED = ("grouped_gemm_efficiency", "fp8_grouped_gemm_efficiency")
"""Constants fitted on the MoE rows of a (GPU, stack), after and on top of its dense fit; each
only where the pair has MoE rows of its precision (16-bit, fp8)."""
MOE_PRIOR = {"grouped_gemm_efficiency": 0.8, "fp8_grouped_gemm_efficiency": 0.8}
"""Where the MoE fit starts and is pulled to: a grouped GEMM at 0.8 of the rate of one GEMM of
its per-expert shape (several GEMMs on a few streams, per-expert casts)."""
MOE_PRIOR_SD = {"grouped_gemm_efficiency": 2.5, "fp8_grouped_gemm_efficiency": 2.5}
"""Spread of the MoE constants' prior, in the units of `PRIOR_SD`."""

Group = tuple[str, str]
"""(GPU preset, software stack): the unit whose constants are fitted together."""


def group(point: Measured) -> Group:
    """The (GPU, stack) a point calibrates."""
    return point.gpu, point.cfg.train.software_stack


def fitted(point: Measured) -> bool:
    """Whether a point enters the dense fit: dense models (MoE rows fit `MOE_FITTED` on top)."""
    return not point.cfg.model.num_experts


def judged(point: Measured) -> bool:
    """Whether a point is judged and fitted: not a run of a recipe its publisher filed as a
    regression (`KNOWN_REGRESSIONS`; such a point is predicted and printed all the same)."""
    return point.name not in KNOWN_REGRESSIONS


def names_for(points: Sequence[Measured]) -> tuple[str, ...]:
    """The constants these points identify (`FITTED` less the unidentified GEMM peak)."""
    fp8 = any(p.cfg.train.precision == "fp8" for p in points)
    sixteen = any(p.cfg.train.precision != "fp8" for p in points)
    return tuple(n for n in FITTED if (n != "fp8_gemm_efficiency" or fp8)
                 and (n != "gemm_efficiency" or sixteen))


def fitted_names(points: Sequence[Measured]) -> tuple[str, ...]:
    """Every constant a (GPU, stack)'s points identify: its dense names, and `MOE_FITTED` where
    it has MoE rows."""
    return names_for([p for p in points if fitted(p)]) + moe_names(points)


def moe_names(points: Sequence[Measured]) -> tuple[str, ...]:
    """The MoE constants these points identify: the grouped GEMM efficiency of each precision
    their MoE rows train in."""
    moe = [p for p in points if not fitted(p)]
    fp8 = any(p.cfg.train.precision == "fp8" for p in moe)
    sixteen = any(p.cfg.train.precision != "fp8" for p in moe)
    return tuple(n for n in MOE_FITTED if (fp8 if n.startswith("fp8") else sixteen))


BASIS = {"iteration": "iter", "tokens/s": "tok/s", "TFLOP/s": "TF", "MFU": "MFU"}
"""Short names of the published figure each measured step time comes from."""


def short_basis(basis: str) -> str:
    """'TFLOP/s (SC21_EQ3)' → 'TF SC21_EQ3'."""
    head, _, convention = basis.partition(" (")
    return " ".join([BASIS.get(head.split(" ")[0], head), convention.rstrip(")")]).strip()


SAME_DIE = {"h200-sxm-141gb": "h100-sxm-80gb"}
"""GPU presets that take the fits of the same die (their rows are then predicted out of
sample by constants fitted on the other GPU's rows only)."""


FUSED_ATTENTION_PRIOR = {("h100-sxm-80gb", "megatron-core"): 0.5}
"""Where each fit of `attention_efficiency` starts and is pulled to: the fused attention
kernel the stack runs, forward plus backward (2.5x the forward FLOPs) in model FLOPs. H100 with
Megatron-Core + Transformer Engine, cuDNN fused attention (FlashAttention-3 class; Shah et al.
2024, §4.1: causal head-dim-128 forward ~65 %, backward ~47 %): 0.5. Every other (GPU, stack)
runs FlashAttention-2 class kernels (A100; H100 with PyTorch FSDP or DeepSpeed, FA2 / SDPA):
its GPU's `flash_attention_efficiency` (its source in autotune/costmodel/constants.py)."""
PRIOR_SD = {"gemm_efficiency": 2.5, "attention_efficiency": 2.5, "elementwise_passes": 5.0,
            "fp8_gemm_efficiency": 2.5, "gemm_half_size": 15.0}
"""Spread of each constant's log-normal prior around its source value (`fit_constants`), in
units where the Cauchy loss's scale is one run 10 % off (`ROBUST_SCALE`): moving the GEMM or
attention efficiency by e^0.25 (28 %) from its kernel-benchmark value costs as much as one run
predicted 10 % off; the memory-bound passes are known to a factor e^0.5 (1.6), the GEMM half
size (tile and wave quantization, shape-dependent cuBLAS heuristics) only to e^1.5 (4.5)."""


def prior(g: Group) -> Constants:
    """The physical starting point of a (GPU, stack) fit."""
    flash = constants_for(load_gpu(g[0], "accuracy")).flash_attention_efficiency
    return Constants(attention_efficiency=FUSED_ATTENTION_PRIOR.get(g, flash))


def fit_group(points: Sequence[Measured]) -> Constants:
    """Constants of one (GPU, stack): the dense ones fitted on its dense points from its prior,
    then `MOE_FITTED` on its MoE points with the dense ones held. A row whose source left
    settings open (several candidates) bounds the model from one side (`fit_constants`'
    `open_as_bound`) wherever rows stating every setting anchor the fit. Known regressions
    (`judged`) enter neither fit."""
    points = [p for p in points if judged(p)]
    train = [p for p in points if fitted(p)]
    if not train:
        return Constants()
    anchored = any(len(p.layouts) == 1 for p in train)  # bounds alone pin nothing
    names = names_for(train)
    k = fit_constants(train, prior(fit_source(train[0])), names,
                      prior_sd=PRIOR_SD, open_as_bound=anchored)
    if "fp8_gemm_efficiency" not in names:  # FP8 GEMMs follow the measured 16-bit ones
        k = fp8_from_sixteen(k, train[0].cfg.cluster.gpu.peak_tflops)
    moe = [p for p in points if not fitted(p)]
    if not moe:
        return k
    anchored = any(len(p.layouts) == 1 for p in moe)
    return fit_constants(moe, k.model_copy(update=MOE_PRIOR), moe_names(moe),
                         prior_sd=MOE_PRIOR_SD, open_as_bound=anchored, midpoint_start=True)


def fit_groups(points: Sequence[Measured]) -> dict[Group, Constants]:
    """Constants fitted per (GPU, stack) on the fit-eligible points, a same-die borrower's rows
    with its donor's (the borrower takes the donor's fit)."""
    groups = sorted({fit_source(p) for p in points if fitted(p)})
    fits = {g: fit_group([p for p in points if fit_source(p) == g]) for g in groups}  # MoE too
    return fits | {(b, stack): k for (gpu, stack), k in fits.items()
                   for b, die in SAME_DIE.items() if die == gpu}


def fit_source(point: Measured) -> Group:
    """The (GPU, stack) whose fit predicts a point (a same-die borrower's donor)."""
    gpu, stack = group(point)
    return SAME_DIE.get(gpu, gpu), stack


def cross_validate(points: Sequence[Measured]) -> tuple[dict[str, float], Counter]:
    """Predicted step time of every point with the constants of its (GPU, stack) fitted without
    its source, and how many folds put each (GPU, stack, constant, side) on a bound. Points whose
    (GPU, stack) has no other source are left out (uncalibrated)."""
    predicted: dict[str, float] = {}
    on_bound: Counter = Counter()
    for _, train, held_out in leave_one_source_out(points):
        for g in sorted({fit_source(p) for p in held_out}):
            rest = [p for p in train if fit_source(p) == g]
            if not any(fitted(p) for p in rest):
                continue
            k = fit_group(rest)
            on_bound.update((g, *hit) for hit in at_bounds(k, fitted_names(rest)))
            for p in held_out:
                if fit_source(p) == g:
                    predicted[p.name] = predicted_step_s(p, k)
    return predicted, on_bound


MOE_LEFT_OUT = "its source left out and again with its model left out, the worse of the two"
"""How the MoE intervals are held out: a user's MoE model is mostly one no row shows, and a
source (a release) of the MoE rows ran the same models as the other releases."""


def intervals(points: Sequence[Measured], cv: dict[str, float],
              unseen: dict[str, float]) -> dict[Group, dict[str, Any]]:
    """Per (GPU, stack): the cross-validated residual summary per regime and over its dense rows
    (`all`), `autotune.costmodel.uncertainty.residual_summary` of measured / predicted step
    time; an MoE row counts with the prediction further from it of its source left out (`cv`)
    and its model left out (`unseen`)."""
    out: dict[Group, dict[str, Any]] = {}
    for g in sorted({group(p) for p in points}):
        held = [p for p in points if group(p) == g and p.name in cv and judged(p)]
        by_regime: dict[str, list[Measured]] = {"all": [p for p in held if fitted(p)]}
        for p in held:
            by_regime.setdefault(regime(p.cfg), []).append(p)
        out[g] = {name: residual_summary([held_out_ratio(p, cv, unseen) for p in rows],
                                         len({p.source for p in rows}),
                                         MOE_LEFT_OUT if name.endswith("-moe") else None)
                  for name, rows in sorted(by_regime.items()) if rows}
    return {g: v for g, v in out.items() if v}


def held_out_ratio(p: Measured, cv: dict[str, float], unseen: dict[str, float]) -> float:
    """Measured / predicted step time of `p` held out: its source left out, and for an MoE row
    also its model left out, whichever is further from 1 (in log)."""
    ratios = [p.step_time_s / cv[p.name]]
    if not fitted(p) and p.name in unseen:
        ratios.append(p.step_time_s / unseen[p.name])
    return max(ratios, key=lambda r: abs(math.log(r)))


def between_layouts(points: Sequence[Measured],
                    cv: dict[str, float]) -> dict[Group, dict[str, float | int]]:
    """Per (GPU, stack): `autotune.costmodel.uncertainty.between_summary` of the held-out
    measured / predicted step times, grouped by source, model and regime (the runs one
    publication made of one setup at several layouts or sizes)."""
    runs: dict[tuple[Group, str, str, str], list[float]] = {}
    for p in points:
        if p.name in cv and judged(p):
            key = (group(p), p.source, p.cfg.model.name, regime(p.cfg))
            runs.setdefault(key, []).append(p.step_time_s / cv[p.name])
    out: dict[Group, dict[str, float | int]] = {}
    for g in sorted({k[0] for k in runs}):
        summary = between_summary([v for k, v in runs.items() if k[0] == g])
        if summary:
            out[g] = summary
    return out


def by_model(points: Sequence[Measured]) -> dict[str, list[Measured]]:
    """Points grouped by model name."""
    out: dict[str, list[Measured]] = {}
    for p in points:
        out.setdefault(p.cfg.model.name, []).append(p)
    return out


def leave_one_model_out(moe: Sequence[Measured],
                        fits: dict[Group, Constants]) -> dict[str, float]:
    """Predicted step time of every MoE point with the MoE constants fitted on the other
    models' MoE rows of its (GPU, stack) (its dense constants from every source): a stricter
    test than leaving a source out, whose other releases ran the same model. A precision no
    other model trains in keeps its prior (`MOE_PRIOR`); known regressions are predicted, never
    fitted."""
    predicted: dict[str, float] = {}
    for name, rows in by_model(moe).items():
        for g in sorted({fit_source(p) for p in rows}):
            rest = [p for p in moe
                    if fit_source(p) == g and p.cfg.model.name != name and judged(p)]
            k = fits[g].model_copy(update=MOE_PRIOR)
            if rest:
                k = fit_constants(rest, k, moe_names(rest), prior_sd=MOE_PRIOR_SD,
                                  midpoint_start=True)
            predicted |= {p.name: predicted_step_s(p, k) for p in rows if fit_source(p) == g}
    return predicted


def write_constants(fits: dict[Group, Constants], bands: dict[Group, dict[str, Any]],
                    between: dict[Group, dict[str, float | int]],
                    moe_groups: dict[Group, tuple[str, ...]]) -> Path:
    """Store the fitted constants, cross-validated intervals and between-layout ratios per GPU
    preset and stack (the MoE constants `moe_groups` names for the pairs with MoE rows)."""
    path = table_path()
    table = yaml.safe_load(path.read_text()) or {}
    table.setdefault("default", {})
    for (gpu, stack), k in sorted(fits.items()):
        names = FITTED + moe_groups.get((SAME_DIE.get(gpu, gpu), stack), ())
        entry: dict[str, Any] = {n: round(getattr(k, n), 4) for n in names}
        if (gpu, stack) in bands:
            entry["intervals"] = bands[(gpu, stack)]
        donor = (SAME_DIE.get(gpu, gpu), stack)
        if "intervals" not in entry and donor in bands:  # the same die's, marked as such
            entry["intervals"] = copy.deepcopy(bands[donor])
            entry["intervals_from"] = donor[0]
        if (gpu, stack) in between or donor in between:
            entry["between_layouts"] = dict(between.get((gpu, stack)) or between[donor])
        table.setdefault(gpu, {}).setdefault("stacks", {})[stack] = entry
    write_table(table, path)
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
                insample: dict[str, float], peer: dict[str, float]) -> list[str]:
    """GPU type, rows, sources, CV and in-sample median/max |error|, and llm-analysis's on the
    rows autotune has a CV prediction for."""
    def stats(predicted: dict[str, float]) -> str:
        errors = [abs(p.step_time_s / predicted[p.name] - 1)
                  for p in points if p.name in predicted]
        if not errors:
            return "n/a"
        return f"{np.median(errors):.1%} / {np.max(errors):.1%}"

    sources = len({p.source for p in points})
    judged = {name: step for name, step in peer.items() if name in cv}
    return [label, str(len(points)), str(sources), stats(cv), stats(insample), stats(judged)]


def cv_errors(points: Sequence[Measured], cv: dict[str, float]) -> np.ndarray:
    """|measured / CV-predicted throughput − 1| of the points that have a CV prediction."""
    return np.array([abs(p.step_time_s / cv[p.name] - 1) for p in points if p.name in cv])


def half_verdict(rows: Sequence[Measured], cv: dict[str, float],
                 peer: dict[str, float]) -> str:
    """llm-analysis's median / max on `rows` and whether ours is at most half of both."""
    if not rows:
        return ""
    ours, theirs = cv_errors(rows, cv), cv_errors(rows, peer)
    half = np.median(ours) <= np.median(theirs) / 2 and np.max(ours) <= np.max(theirs) / 2
    return (f"; llm-analysis {np.median(theirs):.1%} / {np.max(theirs):.1%} on the same "
            f"{len(rows)} rows: at most half its error {'met' if half else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=PUBLISHED_RUNS)
    parser.add_argument("--fit", action="store_true",
                        help="refit and write constants and intervals to constants.yaml")
    args = parser.parse_args()
    console = Console(width=240)  # the per-row table: its figures are never cut
    runs = published_runs(args.data)
    skipped = Counter(
        run.skip or {"recipe": "recipe: no throughput published",
                     "ran": "ran (time to train only): no throughput published"}.get(
            run.row["kind"], "no measured figure convertible to a step time")
        for run in runs if run.skip or run.step_time_s is None
    )
    points = [as_point(run) for run in runs if run.skip is None and run.step_time_s is not None]
    basis = {run.name: short_basis(run.basis) for run in runs}
    fits = fit_groups(points)
    insample = {p.name: predicted_step_s(p, fits[fit_source(p)])
                for p in points if fit_source(p) in fits}
    cv, on_bound = cross_validate(points)
    peer: dict[str, float] = {}
    if peer_llm_analysis.available():
        for p in points:
            step = peer_llm_analysis.step_s(p, best_layout(p, fits.get(fit_source(p),
                                                                        Constants())))
            if step is not None:
                peer[p.name] = step
    every_moe = [p for p in points if not fitted(p)]
    unseen = leave_one_model_out(every_moe, fits)
    if args.fit:
        moe_groups = {g: moe_names([p for p in points if fit_source(p) == g])
                      for g in {fit_source(p) for p in points if not fitted(p)}}
        written = write_constants(fits, intervals(points, cv, unseen),
                                  between_layouts(points, cv), moe_groups)
        console.print(f"wrote {written}")
    folds = Counter(g for g, _ in {(fit_source(p), p.source) for p in points})

    table = Table(title="Published vs predicted TFLOP/s per GPU (autotune's convention: "
                        "Megatron-Core causal model FLOPs); CV = source left out of the fit "
                        "of its (GPU, stack)")
    figures = ("measured", "CV pred", "CV err", "in-sample err")  # never cut to an ellipsis
    for column in ("row", "source", "model", "GPUs", "stack", "prec",
                   "layout (* = model's pick)", "from", *figures):
        table.add_column(column, no_wrap=column in ("row", "layout (* = model's pick)", "from"),
                         min_width=7 if column in figures else None,
                         justify="right" if column in ("GPUs", *figures) else "left")
    for p in points:
        k = fits.get(fit_source(p), Constants())
        cv_cells = ["n/a", "n/a"]
        if p.name in cv:
            cv_cells = [f"{tflops(p, cv[p.name]):.0f}", f"{p.step_time_s / cv[p.name] - 1:+.1%}"]
        in_cell = f"{p.step_time_s / insample[p.name] - 1:+.1%}" if p.name in insample else "n/a"
        table.add_row(p.name, p.source, p.cfg.model.name, str(p.cfg.world_size),
                      p.cfg.train.software_stack, p.cfg.train.precision, layout_text(p, k),
                      basis[p.name], f"{tflops(p, p.step_time_s):.0f}", *cv_cells, in_cell)
    console.print(table)

    summary = Table(title="Error summary: |predicted/measured throughput - 1|, median / max; "
                          "dense rows, bf16 and fp8 together")
    for column in ("GPU / stack", "rows", "sources", "CV (leave one source out)", "in-sample",
                   "llm-analysis (README setting)" if peer else "llm-analysis (not installed)"):
        summary.add_column(column)
    dense = [p for p in points if fitted(p)]
    for g in sorted({group(p) for p in dense}):
        rows = [p for p in dense if group(p) == g]
        summary.add_row(*summary_row(" / ".join(g), rows, cv, insample, peer))
        for precision in ("bf16", "fp8"):
            part = [p for p in rows if regime(p.cfg) == precision]
            if part and len(part) < len(rows):
                summary.add_row(*summary_row(f"  {precision}", part, cv, insample, peer))
        stated = [p for p in rows if len(p.layouts) == 1]
        if stated and len(stated) < len(rows):
            summary.add_row(*summary_row("  every setting stated", stated, cv, insample, peer))
    summary.add_row(*summary_row("all dense", dense, cv, insample, peer))
    moe = [p for p in every_moe if judged(p)]
    for g in sorted({group(p) for p in moe}):
        rows = [p for p in moe if group(p) == g]
        summary.add_row(*summary_row(f"MoE {' / '.join(g)}", rows, cv, insample, peer))
        for precision in ("bf16-moe", "fp8-moe"):
            part = [p for p in rows if regime(p.cfg) == precision]
            if part and len(part) < len(rows):
                summary.add_row(*summary_row(f"  {precision}", part, cv, insample, peer))
        regressed = [p for p in every_moe if group(p) == g]
        if len(regressed) > len(rows):
            summary.add_row(*summary_row("  with the known regressions", regressed, cv,
                                         insample, peer))
    console.print(summary)

    if moe:
        per_row = Table(title="MoE rows: measured / predicted step − 1 (+ = predicted too fast)")
        for column in ("row", "model", "source", "prec", "CV err", "in-sample err",
                       "model left out err", "judged"):
            per_row.add_column(column)
        for p in every_moe:
            cells = [f"{p.step_time_s / got[p.name] - 1:+.1%}" if p.name in got else "n/a"
                     for got in (cv, insample, unseen)]
            per_row.add_row(p.name, p.cfg.model.name, p.source, p.cfg.train.precision, *cells,
                            "yes" if judged(p) else "no: known regression")
        console.print(per_row)
        for p in every_moe:
            if not judged(p):
                console.print(f"known regression {p.name}: {KNOWN_REGRESSIONS[p.name]}")

    constants = Table(title="Constants fitted on every source (in-sample); '-' = not identified")
    for column in ("GPU / stack", *FITTED, *MOE_FITTED):
        constants.add_column(column)
    for g, k in fits.items():
        if g[0] in SAME_DIE:
            continue
        names = fitted_names([p for p in points if group(p) == g])
        constants.add_row(" / ".join(g), *(f"{getattr(k, n):.4g}" if n in names else "-"
                                           for n in FITTED + MOE_FITTED))
    console.print(constants)
    for g, k in fits.items():
        names = fitted_names([p for p in points if group(p) == g])
        for name, side, bound in at_bounds(k, names) if g[0] not in SAME_DIE else ():
            console.print(f"[bold red]WARNING: {' / '.join(g)}: {name}={getattr(k, name):.4g} "
                          f"sits on its {side} bound {bound:g} (FIT_BOUNDS): the fit absorbs a "
                          "missing or wrong term[/]")
    for (g, name, side, bound), count in sorted(on_bound.items()):
        console.print(f"[bold red]WARNING: cross-validation: {' / '.join(g)} {name} on its "
                      f"{side} bound {bound:g} in {count} of {folds[g]} folds[/]")
    console.print(f"skipped {sum(skipped.values())} of {len(runs)} rows:")
    for reason, count in skipped.most_common():
        console.print(f"  {count:3d}  {reason}")
    verdicts = []
    for g in sorted({group(p) for p in dense}):
        rows = [p for p in dense if group(p) == g]
        errors = cv_errors(rows, cv)
        if len({p.source for p in rows}) < 2 and g[0] not in SAME_DIE or not errors.size:
            verdicts.append(f"{' / '.join(g)}: one source, not judged")
            continue
        ok = np.median(errors) <= 0.05 and np.max(errors) <= 0.15
        line = (f"{' / '.join(g)}: {np.median(errors):.1%} / {np.max(errors):.1%} "
                f"{'met' if ok else 'NOT met'}")
        line += half_verdict([p for p in rows if p.name in cv and p.name in peer], cv, peer)
        verdicts.append(line)
        stated = [p for p in rows if len(p.layouts) == 1 and p.name in cv and p.name in peer]
        if stated and len(stated) < len(rows):
            ours = cv_errors(stated, cv)
            verdicts.append(f"  every setting stated: {np.median(ours):.1%} / {np.max(ours):.1%}"
                            + half_verdict(stated, cv, peer))
    console.print("target per (GPU, stack) with >= 2 sources, cross-validated median <= 5 %, "
                  "max <= 15 %:")
    for line in verdicts:
        console.print(f"  {line}")
    moe_errors = cv_errors(moe, cv)
    if moe_errors.size:
        console.print(f"MoE target CV median <= 15 %: {np.median(moe_errors):.1%} "
                      f"{'met' if np.median(moe_errors) <= 0.15 else 'NOT met'} "
                      f"(max {np.max(moe_errors):.1%}, {moe_errors.size} rows, "
                      f"{len({p.source for p in moe})} sources)")
        if len(every_moe) > len(moe):
            every = cv_errors(every_moe, cv)
            console.print(f"  with the {len(every_moe) - len(moe)} known regressions: "
                          f"{np.median(every):.1%} / {np.max(every):.1%} ({every.size} rows)")
        errors = cv_errors(moe, unseen)
        console.print(f"MoE leave one model out (the MoE constants fitted without every row of "
                      f"the model, dense constants in-sample): {np.median(errors):.1%} / "
                      f"{np.max(errors):.1%}; per model: " + ", ".join(
                          f"{name} {np.median(cv_errors(rows, unseen)):.1%}"
                          for name, rows in by_model(moe).items()))


if __name__ == "__main__":
    main()
