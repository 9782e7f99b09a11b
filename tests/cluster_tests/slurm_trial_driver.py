"""Run one slurm-runner trial in this process, to be killed by the test (a tuner that dies).

    python slurm_trial_driver.py OUT LAYOUT_TEXT STEPS PROCESSES
"""

from __future__ import annotations

import sys
from pathlib import Path

from helpers_cluster import first_layout
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan

from autotune.runners.slurm import SlurmRunner


def main(argv: list[str]) -> int:
    out, text, steps, processes = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    cfg = tiny_config(processes=processes)
    runner = SlurmRunner(poll_s=0.5, steps=steps, warmup=1)
    runner.prepare()
    measurement = runner.run(trial_plan(cfg, first_layout(cfg, text), out, number=0))
    print(measurement.status, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
