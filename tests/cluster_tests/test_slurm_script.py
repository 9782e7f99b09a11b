"""The slurm runner's job script, without a cluster: sbatch options, sizing, quoting."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from helpers_cluster import first_layout
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.runners.slurm import SlurmRunner
from autotune.runners.slurm import sbatch_directives
from autotune.runners.slurm import trial_sbatch_script
from autotune.runners.slurm_client import parse_slurm_opts
from autotune.specs.inputs import load_config


def test_directives_are_checked() -> None:
    """Oracle: sbatch's option syntax (`--key=value`, `--flag`), written out by hand."""
    assert parse_slurm_opts(["qos=high", "exclusive", "constraint=a100&ib"]) == {
        "qos": "high", "exclusive": None, "constraint": "a100&ib"}
    assert sbatch_directives({"qos": "high", "exclusive": None}) == ["--qos=high", "--exclusive"]
    for bad in ({"qos": "a b"}, {"qos": "x#y"}, {"Bad Key": "1"}, {"mail-user": "'q'"}):
        with pytest.raises(AutotuneError, match="--slurm-opt"):
            sbatch_directives(bad)
    runner = SlurmRunner(partition="gpu", account="proj", time_limit="0:30:00",
                         options={"qos": "high"})
    assert runner.directives == ["--partition=gpu", "--account=proj", "--time=0:30:00",
                                 "--qos=high"]
    assert "--time=35" in SlurmRunner(timeout_s=1800).directives  # 30 min + 5


def _lint(shellcheck: str, script: str, path: Path) -> None:
    path.write_text(script)
    lint = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True,
                          text=True, check=False)
    assert lint.returncode == 0, lint.stdout


def test_script_is_sized_from_the_layout(tmp_path: Path, shellcheck: str) -> None:
    """16 GPUs of 8-GPU nodes → 2 nodes × 8; 2 CPU processes → 1 node, 2 CPUs. Oracles: the
    arithmetic by hand, and shellcheck on both scripts."""
    gpu = load_config("tiny-gpt", "dgx-h100:2", framework="deepspeed")
    layout = Layout.parse("tp=1,pp=1,zero=1,mbs=1", 16, gpu.train.global_batch_size,
                          get_framework("deepspeed"))
    plan = trial_plan(gpu, layout, tmp_path)
    runner = SlurmRunner(partition="gpu", options={"qos": "high"})
    script = trial_sbatch_script(plan, job_name="j", directives=runner.directives,
                                 python="python", args=runner.program_args(plan))
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --exclusive" in script and "--nproc_per_node 8" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --qos=high" in script
    assert "MALLOC_ARENA_MAX" not in script
    _lint(shellcheck, script, tmp_path / "gpu.sbatch")
    cpu = tiny_config()
    plan = trial_plan(cpu, first_layout(cpu), tmp_path / "cpu")
    script = trial_sbatch_script(plan, job_name="j", directives=[], python="python", args=[])
    assert "#SBATCH --nodes=1" in script and "#SBATCH --cpus-per-task=2" in script
    assert "gpus" not in script and "--nproc_per_node 2" in script
    assert 'export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-1}"' in script  # CPU_ALLOCATOR_ENV
    _lint(shellcheck, script, tmp_path / "cpu.sbatch")
    megatron = gpu.model_copy(update={"train": gpu.train.model_copy(
        update={"framework": "megatron"})})
    plan = trial_plan(megatron, layout, tmp_path / "megatron")
    script = trial_sbatch_script(plan, job_name="j", directives=[], python="python",
                                 args=["--train-iters", "6"], checkout=tmp_path / "Megatron LM")
    assert f"export MEGATRON_LM={shlex.quote(str(tmp_path / 'Megatron LM'))}" in script
    assert "pretrain_gpt.sh" in script and "torch.distributed.run" not in script
    _lint(shellcheck, script, tmp_path / "megatron.sbatch")


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_script_quotes_every_value(tmp_path: Path) -> None:
    """Run the job script as task 1 of a 2-node allocation, which the one-node test cluster
    cannot give: stand-ins for scontrol, srun and python. Oracle: the argv the stand-in python
    received (written by hand below) and no file made by the shell syntax in the values. On the
    real cluster, test_slurm_outcomes.py runs every trial in such a folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "scontrol", "#!/bin/sh\necho node-a\necho node-b\n")
    # srun: drop its own options, run the task as node 1 of 2
    _executable(bin_dir / "srun", "#!/bin/sh\nwhile [ \"${1#--}\" != \"$1\" ]; do shift; done\n"
                                  "SLURM_NODEID=1 SLURM_NNODES=2 exec \"$@\"\n")
    _executable(bin_dir / "fake python", "#!/usr/bin/env python3\nimport json, os, sys\n"
                "json.dump([sys.argv[1:], os.environ['MASTER_ADDR']], open('argv.json', 'w'))\n")
    cfg = tiny_config()
    odd = tmp_path / "it's a $(touch pwned) `touch pwned2` folder"
    plan = trial_plan(cfg, first_layout(cfg), odd)
    args = ["--model", "a b", "--x", "$(touch pwned3)", "'; touch pwned4 #"]
    script = trial_sbatch_script(plan, job_name="j", directives=[],
                                 python=str(bin_dir / "fake python"), args=args)
    path = plan.directory / "trial.sbatch"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "node-[a-b]"}
    done = subprocess.run(["bash", str(path)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    argv, master = json.loads((plan.directory / "argv.json").read_text())
    assert master == "node-a"
    assert argv[:6] == ["-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1"]
    assert argv[-len(args) - 2:] == ["-m", "autotune.workloads.deepspeed_gpt", *args]
    assert "--master_port" in argv and argv[argv.index("--master_port") + 1] == "20007"
    assert (plan.directory / "exit_code").read_text().strip() == "0"
    assert not list(tmp_path.rglob("pwned*")), "a value was executed by the shell"
    start = json.loads((plan.directory / "metrics.jsonl").read_text().splitlines()[0])
    assert start == {"event": "job_start", "job_id": "7", "restart": 0, "master": "node-a:20007"}
