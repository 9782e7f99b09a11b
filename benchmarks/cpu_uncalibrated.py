"""The uncalibrated CPU path against a validation run's real trials, without running any.

Reads a `benchmarks/cpu_validation.py --out DIR` run (`DIR/rows.json`: each trial's measured
step time and the uncalibrated prediction the run printed) and predicts every layout again
without a calibration file: the `cpu` constants of presets/constants.yaml and the figures of
`autotune.specs.inputs.local_cluster`, whose peak is measured here and now (printed). Prints,
per layout, the measured step, the run's uncalibrated prediction and this tree's, with errors,
then median and max |error| of both and the signed range over all rows and over the pp 2 rows;
with `--parts`, this tree's time parts of each row.

    python benchmarks/cpu_uncalibrated.py DIR [--parts]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def _summary(label: str, errors: list[float], pp: list[float]) -> str:
    worst = max(abs(e) for e in errors)
    median = statistics.median(abs(e) for e in errors)
    return (f"{label}: median |error| {median:.1%}, max {worst:.1%}, signed {min(errors):+.1%} "
            f"to {max(errors):+.1%}; pp 2 rows {min(pp):+.1%} to {max(pp):+.1%} over "
            f"{len(errors)} trials")


def main(argv: list[str] | None = None) -> int:
    """Print the table (see the module docstring)."""
    from autotune.costmodel.estimate import estimate
    from autotune.frameworks import framework_of
    from autotune.layout import Layout
    from autotune.specs.inputs import load_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--parts", action="store_true")
    args = parser.parse_args(argv)
    rows = [r for r in json.loads((args.out / "rows.json").read_text())
            if r["status"] == "ok" and r["measured_s"]]
    configs: dict[str, Any] = {}
    then: list[float] = []
    now: list[float] = []
    print("| model | layout | measured (s) | uncalibrated then (s) | error | uncalibrated now "
          "(s) | error |" + (" parts now (s) |" if args.parts else ""))
    print("|---|---|---:|---:|---:|---:|---:|" + ("---|" if args.parts else ""))
    for row in rows:
        model = row["model"]
        if model not in configs:
            configs[model] = load_config(model, "local", framework="deepspeed", processes=2)
        cfg = configs[model]
        layout = Layout.parse(row["layout"], cfg.world_size, cfg.train.global_batch_size,
                              framework_of(cfg))
        predicted = estimate(cfg, layout)
        measured = float(row["measured_s"])
        then.append(float(row["plain_s"]) / measured - 1)
        now.append(predicted.step_time_s / measured - 1)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in predicted.time_parts.items() if v >= 0.005)
        print(f"| {model} | {row['layout']} | {measured:.3f} | {row['plain_s']:.3f} | "
              f"{then[-1]:+.1%} | {predicted.step_time_s:.3f} | {now[-1]:+.1%} |"
              + (f" {parts} |" if args.parts else ""))
    pp = [i for i, row in enumerate(rows) if "pp=2" in row["layout"]]
    print(_summary("uncalibrated then", then, [then[i] for i in pp]))
    print(_summary("uncalibrated now", now, [now[i] for i in pp]))
    cluster = next(iter(configs.values())).cluster
    print(f"now: peak {cluster.gpu.peak_tflops['fp32']:.4f} TFLOP/s fp32 per worker (measured "
          f"here), memory {cluster.gpu.hbm_tb_s * 1e3:.0f} GB/s, link "
          f"{cluster.intra_node_gb_s:.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
