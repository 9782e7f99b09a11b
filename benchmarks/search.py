"""Search quality: trials needed to come within 2 % of the best layout of an unknown truth.

Usage:
    python benchmarks/search.py [--seeds 5] [--noise 0.15] [--budget 60]

The truth is the simulate runner in noise mode: the model's constants perturbed by seeded
log-normal factors plus a per-layout jitter, so the search works on a surface it does not know.
Strategies, counting only trials that ran (rule rejections and reused duplicates are free):
- ours: `autotune.search.tune` (warm start from the model, then the model-guided sampler);
- random: uniform over the feasible layouts;
- grid: the DeepSpeed autotuner's walk, ZeRO stage ascending, then micro-batch ascending, then
  the remaining dimensions in space order.
Target: ours needs <= 10 trials in the median and beats both baselines on every scenario.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np
import optuna
from rich.console import Console
from rich.table import Table

from autotune.estimate import evaluate
from autotune.inputs import load_config
from autotune.runners.simulate import SimulateRunner
from autotune.runners.simulate import layout_jitter
from autotune.search import TuneOptions
from autotune.search import tune
from autotune.space import enumerate_layouts
from autotune.space import load_space

SCENARIOS = [
    ("llama3-8b", "dgx-h100:4", "megatron"),
    ("llama3-70b", "dgx-h100:16", "megatron"),
    ("gpt3-175b", "dgx-a100:128", "megatron"),
    ("llama3-405b", "dgx-h100:256", "megatron"),
    ("llama2-7b", "dgx-a100:2", "deepspeed"),
    ("llama2-13b", "dgx-a100:4", "deepspeed"),
    ("gpt3-13b", "hgx-h200:4", "deepspeed"),
]


def truth_throughput(cfg, feasible, runner: SimulateRunner) -> np.ndarray:
    """Tokens/s of every feasible layout on the hidden truth."""
    values = evaluate(cfg, feasible, runner.truth_constants(cfg))
    jitter = np.array([layout_jitter(row, runner.noise, runner.seed) for row in feasible.rows()])
    return values["tokens_per_s"] / jitter


def trials_to_target(measured: list[float], target: float) -> int | None:
    """1-based count of trials until the best so far reaches the target (None: never)."""
    best = 0.0
    for i, value in enumerate(measured, 1):
        best = max(best, value)
        if best >= target:
            return i
    return None


def ours(cfg, space, runner: SimulateRunner, budget: int, seed: int) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        options = TuneOptions(
            out_dir=Path(folder), trials=budget, storage="memory", seed=seed, render=False
        )
        result = tune(cfg, space, runner, options)
    ran = [r for r in sorted(result.records, key=lambda r: r["number"]) if r.get("ran")]
    return [float(r.get("measured_tokens_per_s") or 0.0) for r in ran]


def grid_order(feasible, space) -> np.ndarray:
    """DeepSpeed autotuner order: zero stage, then micro-batch, then the other dims."""
    keys = [
        feasible.sp.astype(int),
        feasible.recompute,
        feasible.offload,
        feasible.vpp,
        feasible.cp,
        feasible.pp,
        feasible.tp,
        feasible.mbs,
        feasible.zero,
    ]
    return np.lexsort(keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--noise", type=float, default=0.15)
    parser.add_argument("--budget", type=int, default=60)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("autotune").setLevel(logging.WARNING)
    table = Table(
        title=f"Trials to reach 2 % of the true best (median of {args.seeds} seeds, "
        f"noise {args.noise:g}; '>N' = not within the budget)"
    )
    for column in (
        "model",
        "cluster",
        "framework",
        "feasible",
        "ours",
        "random",
        "grid",
        "ours wins",
    ):
        table.add_column(
            column, justify="left" if column in ("model", "cluster", "framework") else "right"
        )
    all_ours = []
    every_win = True
    for model, cluster, framework in SCENARIOS:
        cfg = load_config(model, cluster, framework=framework)
        space = load_space(None, framework)
        feasible = enumerate_layouts(cfg, space).feasible
        counts: dict[str, list[float]] = {"ours": [], "random": [], "grid": []}
        for seed in range(args.seeds):
            runner = SimulateRunner(noise=args.noise, seed=1000 + seed)
            truth = truth_throughput(cfg, feasible, runner)
            target = 0.98 * truth.max()
            ours_values = ours(cfg, space, runner, args.budget, seed)
            rng = np.random.default_rng(seed)
            random_values = list(truth[rng.permutation(len(truth))])
            grid_values = list(truth[grid_order(feasible, space)])
            for name, values in (
                ("ours", ours_values),
                ("random", random_values),
                ("grid", grid_values),
            ):
                hit = trials_to_target(values, target)
                limit = args.budget if name == "ours" else len(values)
                counts[name].append(float(hit) if hit is not None else float(limit + 1))
        medians = {name: float(np.median(v)) for name, v in counts.items()}
        wins = medians["ours"] < medians["random"] and medians["ours"] < medians["grid"]
        every_win &= wins
        all_ours.extend(counts["ours"])

        size = len(feasible)

        def show(name: str, medians=medians, size=size) -> str:
            value = medians[name]
            limit = args.budget if name == "ours" else size
            return f">{limit}" if value > limit else f"{value:g}"

        table.add_row(
            model,
            cluster,
            framework,
            f"{len(feasible):,}",
            show("ours"),
            show("random"),
            show("grid"),
            "yes" if wins else "NO",
        )
    console = Console(width=130)
    console.print(table)
    overall = float(np.median(all_ours))
    console.print(
        f"ours, median over all scenarios and seeds: {overall:g} trials; "
        f"target <= 10 and a win on every scenario: "
        f"{'met' if overall <= 10 and every_win else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
