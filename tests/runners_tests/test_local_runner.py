"""LocalRunner without processes: options, the command it builds, what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_runners import tiny_config

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.base import TrialPlan
from autotune.runners.local import LocalRunner
from autotune.specs.inputs import load_config
from autotune.workloads.records import parse_records
from autotune.workloads.records import step_time_spread as spread


def test_bad_options_are_clear_errors(tmp_path: Path) -> None:
    """Oracle: the documented error contract: one AutotuneError naming the option and the fix."""
    with pytest.raises(AutotuneError, match="--launcher"):
        LocalRunner(launcher="mpirun")
    with pytest.raises(AutotuneError, match="warmup < steps"):
        LocalRunner(steps=2, warmup=2)
    with pytest.raises(AutotuneError, match="no pretrain_gpt.py"):
        LocalRunner(megatron_lm=tmp_path)


def test_check_refuses_what_cannot_run_here() -> None:
    """Oracle: the documented Runner.check contract: Megatron needs CUDA GPUs (megatron-core's
    GPTModel.forward does), the local runner runs one node."""
    runner = LocalRunner()
    runner.check(tiny_config())
    with pytest.raises(AutotuneError, match="--framework megatron: .* CUDA GPUs only.*deepspeed"):
        runner.check(tiny_config("megatron"))
    with pytest.raises(AutotuneError, match="runs one node"):
        runner.check(load_config("llama3-8b", "dgx-h100:2", framework="deepspeed"))


def test_command_and_environment(tmp_path: Path) -> None:
    """Oracle: torchrun's and the deepspeed launcher's documented options (--standalone,
    --nproc_per_node, --num_gpus, --module) and the environment the runner promises (threads,
    extra variables)."""
    cfg = tiny_config()
    plan = TrialPlan(cfg, Layout(dp=2, mbs=4, gas=1), 3, tmp_path)
    runner = LocalRunner(steps=5, warmup=1, threads=3, env={"EXTRA": "1"}, extra_args=["--x"])
    argv = runner.command(plan)
    assert argv[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert argv[argv.index("--nproc_per_node") + 1] == "2"
    assert argv[argv.index("--steps") + 1] == "5" and argv[argv.index("--warmup") + 1] == "1"
    assert argv[argv.index("--metrics") + 1] == str(tmp_path / "metrics.jsonl")
    assert argv[-1] == "--x"
    env = runner.environment(plan)
    assert env["OMP_NUM_THREADS"] == "3" and env["EXTRA"] == "1"
    megatron = runner.command(TrialPlan(tiny_config("megatron"), plan.layout, 3, tmp_path))
    assert "autotune.workloads.megatron_gpt" in megatron and "--ds-config" not in megatron
    assert megatron[megatron.index("--problem") + 1] == str(tmp_path / "problem.json")
    deepspeed = LocalRunner(launcher="deepspeed").command(plan)
    assert deepspeed[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert deepspeed[deepspeed.index("--num_gpus") + 1] == "2" and "--module" in deepspeed


def test_records_and_spread() -> None:
    """Oracle: values worked out by hand: JSON records found anywhere in a line (torchrun's
    [default0]: prefix, two ranks on one line, broken ones skipped); spread is (max - min) /
    median below 4 steps ([1, 2]: 1/1.5) and IQR / median from 4 on ([1, 1, 2, 2]: quartiles 1
    and 2, 1/1.5; one outlier in five leaves the quartiles at 1: 0)."""
    record = {"event": "step", "step": 1}
    assert parse_records('[default0]:{"event": "step", "step": 1}') == [record]
    assert parse_records("no json here") == [] and parse_records("{broken") == []
    # two ranks' summaries printed at once onto one line
    both = parse_records('{"event": "summary", "rank": 0}{"event": "summary", "rank": 1}')
    assert [r["rank"] for r in both] == [0, 1]
    assert parse_records('x {"a": {"b": 1}} y {bad} {"c": 2}') == [{"a": {"b": 1}}, {"c": 2}]
    assert spread([1.0]) == 0.0
    assert spread([1.0, 2.0]) == pytest.approx(1 / 1.5)
    assert spread([1.0, 1.0, 2.0, 2.0]) == pytest.approx(1 / 1.5)
    assert spread([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0  # IQR ignores one outlier
