"""Layouts experts ran: feasible under autotune's rules and memory model, and our #1 against them.

Usage:
    python benchmarks/published_layouts.py [--data CSV]

For every row of data/published_runs.csv (measured runs and recipes without throughput):
(a) Feasibility. Each choice of the dimensions the source left unpublished is tried; the row is
    feasible when one choice breaks no rule. Shown: the most memory-frugal choice, its predicted
    peak memory against the usable memory, and the rule that rejects it, if any. A run that
    happened must not be predicted to exceed the usable memory by more than 3 %; its memory is
    judged with its published sharding where the rules make autotune render another (Llama 3's
    FSDP zero2 with pp>1). A recipe without a published run that does not fit is listed apart
    with its model states (a recipe can be wrong; a run cannot).
(b) Our #1 against theirs: `enumerate_layouts` over the framework's default search space, widened
    with the published values, ranks the layouts; ratio = our #1's predicted tokens/s over the
    published layout's (its fastest feasible choice, or fastest at all when none is feasible).
    A ratio far above 1 means the model believes it beats the experts: a model error, mostly.
Rows the model cannot express (a GPU without a preset, a recompute policy or a pipeline layout
it lacks) are skipped with the reason.
(c) Mixture-of-Experts rows: the model from the released config.json where the CSV lacks
    its attention and expert shapes (`autotune.calibration.published.model_spec`), the
    published tp, pp, ep, vpp and mbs, etp = 1, the distributed optimizer, each recompute
    choice, and the token dispatcher and overlaps its launch script set
    (`autotune.calibration.published.RUN_SETTINGS`: DeepSeek-V3 ran DeepEP with the EP
    all-to-all overlap,
    which megatron-core refuses with full recompute); feasibility and predicted against
    published tokens/s per GPU (nothing fitted).
    DeepSeek-V3's 61 layers do not split over its pp8·vpp4 with Megatron's split flags: like
    the run, autotune places them with --pipeline-model-parallel-layout (7, 8 and 7 layers on
    the first, most loaded middle and last stage; the run's layout also held the
    multi-token-prediction module, which the model spec lacks).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from autotune import enumerate_layouts
from autotune import estimate
from autotune import load_space
from autotune.calibration.published import PUBLISHED_RUNS
from autotune.calibration.published import RUN_MEMORY_TOLERANCE
from autotune.calibration.published import PublishedRun
from autotune.calibration.published import label
from autotune.calibration.published import open_dimensions
from autotune.calibration.published import problem
from autotune.calibration.published import published_runs
from autotune.calibration.published import read_rows
from autotune.costmodel.constants import constants_for
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.frameworks.megatron.args import a2a_overlap
from autotune.layout import RECOMPUTES
from autotune.layout import Layout
from autotune.space.rules import violations
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import narrowed
from autotune.units import GIB


def widened_space(run: PublishedRun) -> SearchSpace:
    """The framework's default space (derived dimensions narrowed to the problem) plus every
    value the published candidates use."""
    space = narrowed(run.cfg, load_space(None, run.cfg.train.framework))
    values: dict = {"derived": []}
    for dim in ("tp", "pp", "cp", "vpp", "zero", "mbs", "recompute", "sp"):
        published = {getattr(lay, dim) for lay in run.layouts}
        values[dim] = sorted(set(getattr(space, dim)) | published, key=str)
    return space.model_copy(update=values)


def verdict_of(run: PublishedRun, over: float, broken: list[tuple[str, str]],
               states_gib: float) -> str:
    """fits / within 3 % / WRONGLY INFEASIBLE for a run that happened; a recipe (no run
    published) over the memory is reported with its model states, not counted as wrong."""
    if broken:
        return f"WRONGLY INFEASIBLE: {broken[0][0]}"
    if over <= 0:
        return "fits"
    if over <= RUN_MEMORY_TOLERANCE:
        return f"over by {over:.1%} (within 3 %)"
    if run.row["kind"] == "recipe":
        return f"recipe over by {over:.0%} (states alone {states_gib:.0f} GiB; never ran)"
    return f"WRONGLY INFEASIBLE: memory +{over:.0%}"


def assess(run: PublishedRun) -> dict:
    """Feasibility of the published layout and our #1's predicted speed-up over it.

    Memory is judged on the layout as published (`PublishedRun.as_published`: its own sharding
    where the rules substitute another); the rules on the layout autotune would render."""
    cfg = run.cfg
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    usable = usable_gpu_bytes(cfg, k)
    estimates = [estimate(cfg, lay, k) for lay in run.layouts]
    memory = [estimate(cfg, run.as_published(lay), k) for lay in run.layouts]
    frugal = min(range(len(memory)), key=lambda i: memory[i].peak_memory_bytes)
    broken = violations(cfg, run.layouts[frugal], k, memory=False)
    over = memory[frugal].peak_memory_bytes / usable - 1
    parts = memory[frugal].memory_parts
    states = (parts["weights"] + parts["gradients"] + parts["optimizer"]) / GIB
    feasible = [e for e, lay in zip(estimates, run.layouts, strict=True)
                if not violations(cfg, lay, k)]
    theirs = max(feasible or estimates, key=lambda e: e.tokens_per_s)
    verdict = verdict_of(run, over, broken, states)
    result = enumerate_layouts(cfg, widened_space(run), k)
    ours = result.feasible.row(0) if len(result) else None
    ours_tps = float(result.estimates.tokens_per_s[0]) if len(result) else float("nan")
    return {
        "layout": label(run.layouts[frugal], open_dimensions(run.layouts)),
        "peak_gib": memory[frugal].peak_memory_bytes / GIB,
        "usable_gib": usable / GIB,
        "verdict": verdict,
        "wrong": verdict.startswith("WRONGLY"),
        "theirs_tps": theirs.tokens_per_s / cfg.world_size,
        "ours": label(ours) if ours else "none feasible",
        "ours_mfu": float(result.estimates.mfu[0]) if len(result) else float("nan"),
        "ratio": ours_tps / theirs.tokens_per_s,
    }





def assess_moe(row: dict[str, str]) -> dict:
    """The published MoE layout (each recompute choice, sp on with tp > 1): feasibility and the
    fastest feasible choice's predicted tokens/s per GPU against the published figure."""
    cfg = problem(row)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    tp, pp, ep = int(row["tp"]), int(row["pp"]), int(row["ep"] or 1)
    layouts = [Layout.derived(cfg.world_size, cfg.train.global_batch_size, tp=tp, pp=pp,
                              cp=int(row["cp"] or 1), vpp=int(row["vpp"] or 1), zero=1,
                              mbs=int(row["micro_batch_size"]), recompute=r, sp=tp > 1, ep=ep)
               for r in RECOMPUTES]
    estimates = [estimate(cfg, lay, k) for lay in layouts]
    broken = [violations(cfg, lay, k) for lay in layouts]
    feasible = [e for e, b in zip(estimates, broken, strict=True) if not b]
    best = max(feasible or estimates, key=lambda e: e.tokens_per_s)
    predicted = best.tokens_per_s / cfg.world_size
    published = float(row["tokens_per_sec_per_gpu"])
    return {
        "row": row["row_id"], "gpus": cfg.world_size,
        "layout": f"{label(best.layout)} ep{ep} {cfg.train.precision}",
        "peak": best.peak_memory_bytes / GIB, "usable": usable_gpu_bytes(cfg, k) / GIB,
        "verdict": "fits" if feasible else f"WRONGLY INFEASIBLE: {min(broken)[0][0]}",
        "predicted": predicted, "published": published, "error": predicted / published - 1,
        "ep_share": best.time_parts["ep_comm"] / best.step_time_s,
        "dispatch": cfg.train.moe_token_dispatcher
        + (" + a2a overlap" if a2a_overlap(cfg, best.layout) else ""),
    }


def moe_table(path: Path) -> tuple[Table, int]:
    """Predicted against published throughput of the MoE rows, and how many are infeasible."""
    table = Table(title="Published MoE runs: the published layout under autotune's model")
    for column in ("row", "GPUs", "layout (fastest recompute)", "peak/usable GiB", "verdict",
                   "EP dispatch", "predicted tok/s/GPU", "published", "error",
                   "EP share of step"):
        table.add_column(column, no_wrap=True)
    wrong = 0
    for row in read_rows(path):
        if not row["num_experts"]:
            continue
        found = assess_moe(row)
        wrong += found["verdict"].startswith("WRONGLY")
        table.add_row(found["row"], str(found["gpus"]), found["layout"],
                      f"{found['peak']:.1f} / {found['usable']:.1f}", found["verdict"],
                      found["dispatch"], f"{found['predicted']:.0f}", f"{found['published']:.0f}",
                      f"{found['error']:+.0%}", f"{found['ep_share']:.0%}")
    return table, wrong


def source_summary(results: list[dict]) -> Table:
    """Per source: layouts, how many fit, fit within 3 %, are wrongly infeasible, and the median
    ours/theirs ratio."""
    table = Table(title="Published layouts per source")
    for column in ("source", "layouts", "fit", "within 3 %", "wrongly infeasible",
                   "recipes over", "median ours/theirs", "our #1 > 62 % MFU"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source in sorted({r["source"] for r in results}):
        rows = [r for r in results if r["source"] == source]
        ratios = [r["ratio"] for r in rows if np.isfinite(r.get("ratio", np.nan))]
        table.add_row(
            source, str(len(rows)), str(sum(r.get("verdict") == "fits" for r in rows)),
            str(sum(r.get("verdict", "").startswith("over by") for r in rows)),
            str(sum(r["wrong"] for r in rows)),
            str(sum(r.get("verdict", "").startswith("recipe over") for r in rows)),
            f"{np.median(ratios):.2f}" if ratios else "n/a",
            str(sum(r.get("ours_mfu", 0) > 0.62 for r in rows)),
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=PUBLISHED_RUNS)
    args = parser.parse_args()
    console = Console(width=230)
    runs = published_runs(args.data)
    table = Table(title="Published layouts under autotune's rules and memory model, and our #1 "
                        "(* = dimension the source left open; the most memory-frugal choice)")
    numbers = ("GPUs", "peak/usable GiB", "theirs tok/s/GPU", "our MFU", "ours/theirs")
    for column in ("row", "GPUs", "published layout", "peak/usable GiB", "verdict",
                   "theirs tok/s/GPU", "our #1", "our MFU", "ours/theirs"):
        table.add_column(column, no_wrap=True, justify="right" if column in numbers else "left")
    skipped: Counter = Counter()
    results = []
    for run in runs:
        if run.broken_rule:
            results.append({"wrong": True, "source": run.source})
            table.add_row(run.name, run.row["num_gpus"], "", "",
                          f"WRONGLY INFEASIBLE: {run.broken_rule}", "", "", "", "")
            continue
        if run.skip:
            skipped[run.skip] += 1
            continue
        found = assess(run) | {"source": run.source}
        results.append(found)
        table.add_row(run.name, str(run.cfg.world_size), found["layout"],
                      f"{found['peak_gib']:.1f} / {found['usable_gib']:.1f}", found["verdict"],
                      f"{found['theirs_tps']:.0f}", found["ours"], f"{found['ours_mfu']:.0%}",
                      f"{found['ratio']:.2f}")
    console.print(table)
    console.print(source_summary(results))
    ratios = np.array([r["ratio"] for r in results if "ratio" in r and np.isfinite(r["ratio"])])
    wrong = sum(r["wrong"] for r in results)
    console.print(f"layouts assessed: {len(results)} (skipped {sum(skipped.values())})")
    console.print(f"wrongly infeasible (a published layout predicted not to fit by more than "
                  f"3 %, or rejected by a rule): {wrong}")
    console.print(f"ours/theirs predicted throughput: median {np.median(ratios):.2f}, "
                  f"max {np.max(ratios):.2f}, rows above 1.10: {int(np.sum(ratios > 1.10))}")
    mfu = np.array([r["ours_mfu"] for r in results if "ours_mfu" in r])
    console.print(f"our #1 above 62 % MFU: {int(np.sum(mfu > 0.62))} of {len(mfu)}")
    for reason, count in skipped.most_common():
        console.print(f"  skipped {count:3d}: {reason}")
    moe, moe_wrong = moe_table(args.data)
    console.print(moe)
    console.print(f"MoE rows wrongly infeasible: {moe_wrong}")
    console.print(f"target: 0 wrongly infeasible: "
                  f"{'met' if wrong + moe_wrong == 0 else 'NOT met'}")


if __name__ == "__main__":
    main()
