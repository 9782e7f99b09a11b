"""Top-10 predicted MFU of every dense preset on its clusters: no layout may look implausible.

Usage:
    python benchmarks/top_layouts.py [--top 10]

Each dense model preset is enumerated (default search space, bf16, the preset's sequence and
batch) on A100, H100 and H200 clusters sized to it, with both frameworks. The best published
dense bf16 runs reach about 52-57 % MFU on A100 and 40-55 % on H100 (data/published_runs.csv);
a top-10 layout above 62 % means the model has lost a cost. Target: 0 layouts above 62 %.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from rich.console import Console
from rich.table import Table

from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

LIMIT = 0.62
"""MFU no top layout may exceed (bf16)."""
NODES = {
    "gpt3-1.3b": (1, 8), "gpt3-6.7b": (1, 8), "gpt3-13b": (1, 8), "llama2-7b": (1, 8),
    "llama2-13b": (1, 8), "llama3-8b": (1, 8), "llama2-70b": (8, 32), "llama3-70b": (8, 32),
    "qwen2.5-72b": (8, 32), "gpt3-175b": (64, 128), "llama3-405b": (128, 256),
}
"""Dense presets and the node counts they are judged on."""
CLUSTERS = ("dgx-a100", "dgx-h100", "hgx-h200")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="layouts per problem")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    console = Console(width=160)
    table = Table(title=f"Top-{args.top} predicted MFU per preset, cluster and framework (bf16)")
    for column in ("model", "cluster", "framework", "feasible", "#1 layout", "#1 MFU",
                   f"top-{args.top} MFU", f"> {LIMIT:.0%}"):
        table.add_column(column, justify="left" if column in (
            "model", "cluster", "framework", "#1 layout") else "right")
    above = problems = 0
    for model, sizes in NODES.items():
        for cluster in CLUSTERS:
            for nodes in sizes:
                for framework in ("megatron", "deepspeed"):
                    cfg = load_config(model, f"{cluster}:{nodes}", framework=framework,
                                      precision="bf16")
                    result = enumerate_layouts(cfg, load_space(None, framework))
                    problems += 1
                    if not len(result):
                        table.add_row(model, cfg.cluster.name, framework, "0", "", "", "", "")
                        continue
                    mfu = np.asarray(result.estimates.mfu[: args.top])
                    count = int(np.sum(mfu > LIMIT))
                    above += count
                    table.add_row(model, cfg.cluster.name, framework, f"{len(result):,}",
                                  result.feasible.row(0).text, f"{mfu[0]:.1%}",
                                  f"{mfu.min():.1%}-{mfu.max():.1%}", str(count))
    console.print(table)
    console.print(f"top-{args.top} layouts above {LIMIT:.0%} MFU: {above} over {problems} "
                  f"problems; target 0: {'met' if above == 0 else 'NOT met'}")


if __name__ == "__main__":
    main()
