"""Does `verify` tell a correct layout from a numerical bug? Real CPU DeepSpeed runs.

Usage:
    python benchmarks/verify_check.py [--steps 4]

tiny-gpt on 2 local processes, fp32: the winner tp=2 (AutoTP) against the reference pure data
parallelism (dp=2), once as it is and once with the test-only grad_bug fault (tensor-parallel
rank 1 scales its gradients by 4). Prints each run's loss curve, the largest relative
difference and the verdict. Target: the correct layout passes (difference <= 1e-4), the bug
fails.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autotune.layout import Layout
from autotune.runners.local import LocalRunner
from autotune.specs.inputs import load_config
from autotune.verify import verify
from autotune.workloads.instruments import FAULTS_ENV


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    cfg = load_config("tiny-gpt", "local", processes=2, framework="deepspeed", seq_length=64,
                      global_batch_size=8)
    winner = Layout(tp=2, dp=1, zero=1, mbs=2, gas=4)
    table = Table(title="verify: winner tp=2 against pure dp=2 (fp32, tolerance 1e-4)")
    for column in ("case", "winner losses", "reference losses", "max rel diff", "verdict"):
        table.add_column(column)
    with tempfile.TemporaryDirectory() as tmp:
        for case, env in (("correct", {}), ("grad_bug", {FAULTS_ENV: "grad_bug"})):
            runner = LocalRunner(steps=args.steps, warmup=0, timeout_s=900, env=env)
            result = verify(cfg, winner, runner, Path(tmp) / case)
            worst = "-" if result.max_rel_diff is None else f"{result.max_rel_diff:.2e}"
            table.add_row(case, " ".join(f"{v:.6f}" for v in result.winner_losses),
                          " ".join(f"{v:.6f}" for v in result.reference_losses), worst,
                          "pass" if result.passed else "FAIL")
    Console(width=170).print(table)


if __name__ == "__main__":
    main()
