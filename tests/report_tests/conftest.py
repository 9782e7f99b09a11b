"""Report tests share one small simulated study with a sweep (and some crashed trials)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.report.data import write_run_json
from autotune.runners.base import TrialPlan
from autotune.runners.simulate import SimulateRunner
from autotune.scaling import sweep
from autotune.search.settings import TuneSettings
from autotune.search.study import default_study_name
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config


class FlakyRunner(SimulateRunner):
    """The simulate runner, except every fourth trial crashes with an NCCL error."""

    def run(self, plan: TrialPlan) -> Measurement:
        if plan.number % 4 == 3:
            return Measurement("crash", reason="NCCL error: unhandled system error",
                               log_tail="Traceback ...\nNCCL error")
        return super().run(plan)


def make_study(folder: Path, trials: int = 8) -> Path:
    """A seeded llama3-8b study on 2 DGX H100 nodes with a strong sweep over 1-8 nodes."""
    cfg = load_config("llama3-8b", "dgx-h100:2")
    storage = f"journal:{folder / 'study.journal'}"
    write_run_json(folder, study_name=default_study_name(cfg), storage=storage,
                   runner="simulate", runner_options={"noise": 0.1, "seed": 3},
                   options={"trials": trials}, command="pytest fixture")
    runner = FlakyRunner(noise=0.1, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = tune(cfg, load_space(None, "megatron"), runner,
                      TuneSettings(trials=trials, seed=0, storage=storage), folder)
    best = Layout(**result.ranked[0]["layout_fields"])
    sweep(cfg, best, [8, 16, 32, 64], "strong", SimulateRunner(noise=0.1, seed=3), folder)
    return folder


@pytest.fixture(scope="session")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study(tmp_path_factory.mktemp("tune") / "llama3-8b-run")


@pytest.fixture(scope="session")
def report_dir(study_dir: Path) -> Path:
    from autotune.report import write_report

    write_report(study_dir)
    return study_dir
