"""`autotune.run`: the policy of a run, the same for library users as for the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from helpers_cli import assert_usage_error
from helpers_cli import cli

from autotune.exceptions import AutotuneError
from autotune.run import Problem
from autotune.run import RunConfig
from autotune.run import RunnerSettings
from autotune.run import ScaleSettings
from autotune.run import resume_command
from autotune.run import scale
from autotune.run import tune
from autotune.search.settings import TuneSettings

ECHO = "echo '{\"step_time_s\": 2.0}' # {trial_dir}"
"""A command-runner trial that measures 2 s per step."""


def test_framework_default_for_local_cpu_trials() -> None:
    """Oracle: megatron-core's GPTModel needs CUDA and this machine has none
    (torch.cuda.is_available() is False), so local trials default to DeepSpeed unless a
    Megatron-LM checkout is given; simulated trials keep Megatron."""
    local = Problem(model="tiny-gpt", cluster="local")
    assert RunConfig(problem=local, runner=RunnerSettings(name="local")).framework() == "deepspeed"
    assert RunConfig(problem=local).framework() == "megatron"
    with_checkout = RunnerSettings(name="local", megatron_lm="/opt/Megatron-LM")
    assert RunConfig(problem=local, runner=with_checkout).framework() == "megatron"
    explicit = Problem(model="tiny-gpt", cluster="local", train={"framework": "megatron"})
    local_runner = RunnerSettings(name="local")
    assert RunConfig(problem=explicit, runner=local_runner).framework() == "megatron"


def test_parallel_local_trials_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """Oracle: local trials share this machine's cores; two at once would measure each other."""
    config = RunConfig(problem=Problem(model="tiny-gpt", cluster="local"),
                       runner=RunnerSettings(name="local"), tune=TuneSettings(jobs=2),
                       out=tmp_path / "out")
    with pytest.raises(AutotuneError, match="--jobs: local trials share"):
        tune(config)
    assert not (tmp_path / "out").exists()


def test_simulated_study_writes_run_json_and_skips_the_refit(tmp_path: Path) -> None:
    """Oracle: the config given (run.json repeats it) and the study itself, read back with
    Optuna (the status counts are its trials')."""
    config = RunConfig(problem=Problem(model="llama3-8b", cluster="dgx-h100:1"),
                       runner=RunnerSettings(noise=0.05, seed=3), tune=TuneSettings(trials=3),
                       out=tmp_path, command="autotune tune -m llama3-8b -c dgx-h100:1")
    outcome = tune(config)
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["runner"] == "simulate" and info["runner_options"] == {"noise": 0.05, "seed": 3}
    # every study setting, so a run can be repeated from its record (repeat included)
    assert info["options"] == {**TuneSettings().model_dump(mode="json"), "trials": 3}
    assert info["command"] == config.command
    assert outcome.ok and outcome.refit is None and outcome.scaled is None
    study = optuna.load_study(study_name=outcome.result.study_name,
                              storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert sum(outcome.statuses.values()) == len(study.trials)
    ran = sum(1 for t in study.trials if t.user_attrs.get("ran"))
    assert ran == 3 and outcome.statuses["ok"] == ran
    assert (tmp_path / "report.html").is_file() and (tmp_path / "best").is_dir()


def test_real_study_is_refitted(tmp_path: Path) -> None:
    """Oracle: every trial of the command runner takes 2 s a step (the command says so), so the
    refit sees exactly the trials that ran, each with a measured step time of 2 s."""
    config = RunConfig(problem=Problem(model="tiny-gpt", cluster="dgx-h100:1"),
                       runner=RunnerSettings(name="command", command=ECHO),
                       tune=TuneSettings(trials=2), out=tmp_path)
    outcome = tune(config)
    assert outcome.refit is not None
    assert [t.measured_step_s for t in outcome.refit.trials] == [2.0, 2.0]
    assert json.loads((tmp_path / "run.json").read_text())["runner_options"]["command"] == ECHO


def test_scale_forwards_the_runner_options(tmp_path: Path) -> None:
    """Oracle: the runner factory: Slurm options with another runner are a usage error, and the
    command runner's 2 s per step is what every point of the sweep measures."""
    problem = Problem(model="tiny-gpt", cluster="dgx-h100:2")
    sweep = ScaleSettings(layout="tp=1", gpus="8,16")
    with pytest.raises(AutotuneError, match="--partition: only for --runner slurm"):
        scale(RunConfig(problem=problem, scale=sweep, out=tmp_path / "x",
                        runner=RunnerSettings(partition="gpu")))
    outcome = scale(RunConfig(problem=problem, scale=sweep, out=tmp_path / "y",
                              runner=RunnerSettings(name="command", command=ECHO)))
    assert outcome.ok and [p.step_time_s for p in outcome.result.points] == [2.0, 2.0]
    assert [p.gpus for p in outcome.result.points] == [8, 16]


def test_scale_command_takes_tune_s_runner_options(tmp_path: Path) -> None:
    """Oracle: as above, through `autotune scale` (it used to lack --partition and friends)."""
    args = ("scale", "-m", "tiny-gpt", "-c", "dgx-h100:2", "-l", "tp=1", "--gpus", "8,16",
            "--out", tmp_path)
    assert_usage_error(cli(*args, "--partition", "gpu", "--account", "a"),
                       "--partition, --account: only for --runner slurm")
    result = cli(*args, "--runner", "command", "--command", ECHO, "--steps", "3", "--json")
    assert result.code == 0, result.err
    assert [p["step_time_s"] for p in json.loads(result.out)["points"]] == [2.0, 2.0]


def test_resume_command_repeats_the_command_line_once_with_resume() -> None:
    """Oracle: shell quoting (shlex) of the words given, --resume added once."""
    config = RunConfig(problem=Problem(model="m", cluster="c"),
                       command="autotune tune -m m -c c --command 'echo {x}' --resume")
    assert resume_command(config) == "autotune tune -m m -c c --command 'echo {x}' --resume"
    assert "resume = True" in resume_command(RunConfig(problem=Problem(model="m", cluster="c")))


def test_a_run_repeats_from_its_own_record(tmp_path: Path) -> None:
    """Oracle: the first run's Optuna study. `tune --config DIR/run.json` holds every setting of
    the run (model, training, runner, study, repeat), so the second run measures the same
    layouts with the same simulated figures."""
    first = cli("tune", "-m", "llama3-8b", "-c", "dgx-h100:2", "--seq", "2048", "--trials", "3",
                "--repeat", "2", "--runner", "simulate", "--noise", "0.1", "--seed", "4",
                "--out", tmp_path / "a", "--json")
    assert first.code == 0, first.err
    record = json.loads((tmp_path / "a" / "run.json").read_text())
    assert record["config"]["tune"]["repeat"] == 2
    assert record["config"]["problem"]["train"]["seq_length"] == 2048
    again = cli("tune", "--config", tmp_path / "a" / "run.json", "--out", tmp_path / "b", "--json")
    assert again.code == 0, again.err
    runs = [json.loads(r.out)["best"] for r in (first, again)]
    assert runs[0]["layout_id"] == runs[1]["layout_id"]
    assert runs[0]["measured_tokens_per_s"] == runs[1]["measured_tokens_per_s"]


def test_flags_override_the_config_file_and_bad_files_are_one_line(tmp_path: Path) -> None:
    """Oracle: the file as written by hand; a flag wins over the file's value, and a file
    field out of bounds is told as the flag it stands for."""
    run = tmp_path / "run.yaml"
    run.write_text("problem:\n  model: llama3-8b\n  cluster: dgx-h100:1\n"
                   "  train: {seq_length: 8192, global_batch_size: 64}\n")
    shown = json.loads(cli("space", "--config", run, "--seq", "4096", "--top", "1", "--json").out)
    assert shown["inputs"]["train"]["seq_length"] == 4096
    assert shown["inputs"]["train"]["global_batch_size"] == 64
    run.write_text("problem:\n  model: llama3-8b\n  cluster: dgx-h100:1\n"
                   "  train: {seq_length: -5}\n")
    assert_usage_error(cli("space", "--config", run), "--seq", "greater than or equal to 1")
    run.write_text("- just a list\n")
    assert_usage_error(cli("space", "--config", run), "--config", "no mapping")
    assert_usage_error(cli("space", "-c", "dgx-h100:1"), "--model", "required")
