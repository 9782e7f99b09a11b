"""Layouts evaluated per second: rules, memory and step-time models over whole default spaces.

Usage:
    python benchmarks/speed.py [--repeat 3]

Runs on one core (numpy threads pinned to 1 before import). Targets: dense spaces under 0.5 s
(gpt3-175b on 128 DGX A100: issue's target); DeepSeek-V3 on 2,048 GPUs, whose `auto` expert
dimensions multiply the space, under 2 s.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import time  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from autotune.space.search_space import enumerate_layouts  # noqa: E402
from autotune.space.search_space import load_space  # noqa: E402
from autotune.specs.inputs import load_config  # noqa: E402

SCENARIOS = [
    # (model, cluster, target seconds)
    ("gpt3-175b", "dgx-a100:128", 0.5),
    ("llama3-405b", "dgx-h100:2048", 0.5),
    ("deepseek-v3", "dgx-h100:256", 2.0),  # 256 nodes of 8: 2,048 GPUs
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    table = Table(title=f"Whole-space evaluation on one core (best of {args.repeat})")
    for column in (
        "model",
        "cluster",
        "framework",
        "candidates",
        "feasible",
        "seconds",
        "layouts/s",
        "target",
    ):
        table.add_column(
            column, justify="left" if column in ("model", "cluster", "framework") else "right"
        )
    for model, cluster, target in SCENARIOS:
        for framework in ("megatron", "deepspeed"):
            cfg = load_config(model, cluster, framework=framework)
            space = load_space(None, framework)
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                result = enumerate_layouts(cfg, space)
                best = min(best, time.perf_counter() - start)
            table.add_row(
                model,
                cluster,
                framework,
                f"{result.total:,}",
                f"{len(result):,}",
                f"{best:.3f}",
                f"{result.total / best:,.0f}",
                f"< {target:g} s: {'yes' if best < target else 'NO'}",
            )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
