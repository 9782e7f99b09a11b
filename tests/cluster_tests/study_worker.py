"""One `tune` worker of a shared study, run as a subprocess by test_shared_study.py.

    python study_worker.py STORAGE STUDY OUT TRIALS [--resume]

Trials run `fake_trial.sh` through the command runner: it records which worker ran it (the
WORKER variable) in the trial folder, sleeps TRIAL_SLEEP_S seconds and prints a throughput that
depends only on the layout, so the study's answer is the same whoever runs what.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from autotune.runners.command import CommandRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

HERE = Path(__file__).resolve().parent
SPACE_FILE = HERE / "space8.yaml"
"""Eight feasible Megatron layouts of tiny-gpt on one DGX node (tp 1-8 × mbs 1-2)."""


def config():  # noqa: ANN201 - test helper
    """The study's inputs: tiny-gpt on one 8-GPU node, Megatron rules."""
    return load_config("tiny-gpt", "dgx-h100:1", framework="megatron")


def main(argv: list[str]) -> int:
    storage, study, out, trials = argv[0], argv[1], Path(argv[2]), int(argv[3])
    logging.basicConfig(level=logging.INFO, format=f"{os.environ.get('WORKER', '?')} %(message)s")
    sleep_s = os.environ.get("TRIAL_SLEEP_S", "3")
    runner = CommandRunner(f"sh {HERE / 'fake_trial.sh'} {{layout}} {sleep_s}", timeout_s=400)
    options = TuneSettings(trials=trials, storage=storage, study=study,
                           resume="--resume" in argv, render=False)
    result = tune(config(), load_space(str(SPACE_FILE), "megatron"), runner, options, out)
    ran = sum(1 for r in result.records if r.get("ran"))
    print(f"done: {ran} trials ran in the study", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
