"""Each runner's own settings model, the `RunnerSettings` that joins them, and the runner built.

Oracles: the runners' own constructors (the attributes a built runner holds), and values and
messages written by hand here.
"""

from __future__ import annotations

import pytest

from autotune.exceptions import AutotuneError
from autotune.runners.factory import RUNNER_TYPES
from autotune.runners.factory import RunnerSettings
from autotune.runners.local import LocalRunner
from autotune.runners.simulate import SimulateRunner
from autotune.runners.slurm import SlurmRunner


def test_runner_settings_are_the_runners_own_fields() -> None:
    """RunnerSettings holds the name plus every field some runner declares, nothing else, and
    run.json keeps only the fields of the runner that ran."""
    declared = {f for kind in RUNNER_TYPES.values() for f in kind.settings.model_fields}
    assert set(RunnerSettings.model_fields) == {"name", *declared}
    settings = RunnerSettings(name="local", noise=0.3, steps=8, launcher="deepspeed")
    assert settings.recorded() == {"timeout_s": 3600.0, "steps": 8, "hang_timeout_s": 300.0,
                                   "launcher": "deepspeed"}
    assert RunnerSettings(noise=0.3, seed=4).recorded() == {"noise": 0.3, "seed": 4}


def test_each_runner_is_built_from_its_settings() -> None:
    """The built runner carries the values given (warm-up: 2, or steps - 1 for 2 steps)."""
    simulate = RunnerSettings(noise=0.2, seed=5).build()
    assert isinstance(simulate, SimulateRunner) and (simulate.noise, simulate.seed) == (0.2, 5)
    local = RunnerSettings(name="local", steps=2, timeout_s=60, hang_timeout_s=7).build()
    assert isinstance(local, LocalRunner)
    assert (local.steps, local.warmup, local.timeout_s, local.hang_timeout_s) == (2, 1, 60, 7)
    slurm = RunnerSettings(name="slurm", partition="gpu", timeout_s=600).build(resume=True)
    assert isinstance(slurm, SlurmRunner)
    assert (slurm.partition, slurm.time_limit, slurm.warmup, slurm.reattach) == (
        "gpu", "15", 2, True)


@pytest.mark.parametrize(("settings", "message"), [
    (RunnerSettings(name="local", partition="gpu", slurm_opts=("qos=high",)),
     "--partition, --slurm-opt: only for --runner slurm (got --runner local)"),
    (RunnerSettings(name="slurm", steps=1), "--steps: 1 leaves no step after warm-up; use >= 2"),
    (RunnerSettings(name="command"), "--runner command needs --command 'TEMPLATE'"),
])
def test_bad_runner_settings_name_the_flag(settings: RunnerSettings, message: str) -> None:
    with pytest.raises(AutotuneError) as error:
        settings.build()
    assert str(error.value).startswith(message)


def test_an_older_run_json_runner_section_still_reads() -> None:
    """A runner section as run.json wrote it before the runners declared their own models."""
    old = {"name": "slurm", "timeout_s": 900.0, "steps": 6, "hang_timeout_s": 300.0,
           "launcher": "torchrun", "megatron_lm": None, "partition": "gpu", "account": None,
           "time_limit": None, "slurm_opts": [], "noise": 0.0, "seed": 0, "command": None}
    settings = RunnerSettings.model_validate(old)
    assert (settings.name, settings.partition, settings.timeout_s) == ("slurm", "gpu", 900.0)
