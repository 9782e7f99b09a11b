"""The runner contract (autotune.testing.RunnerContract) for simulate, command and local.

The slurm runner passes it in tests/cluster_tests/test_slurm_contract.py (it needs the localhost
Slurm). Oracles: the contract's own checks (figures against the problem's tokens per step and
the GPU's peak; real processes; real DeepSpeed training for `local`).
"""

from __future__ import annotations

import shlex
import sys

import pytest
from helpers_runners import tiny_config

from autotune.layout import Layout
from autotune.runners.command import CommandRunner
from autotune.runners.local import LocalRunner
from autotune.runners.simulate import SimulateRunner
from autotune.specs.inputs import load_config
from autotune.testing import RunnerContract

STEPS = (
    "import json, sys, time\n"
    "for step in range(3):\n"
    "    time.sleep(0.2)\n"
    "    print(json.dumps({'event': 'step', 'tokens_per_s': 1000.0}), flush=True)\n"
    "print(json.dumps({'step_time_s': 60.0, 'peak_memory_gb': 1.0}))\n"
)
"""A trial program that reports three steps, then its step time (60 s for Llama 3 8B's 512 ×
8192 tokens on 8 H100s: MFU ~45 %; 0.5 s would be 5,455 % and the gate rejects it)."""


class TestSimulateRunner(RunnerContract):
    @pytest.fixture
    def problem(self):
        return load_config("llama3-8b", "dgx-h100:1")

    @pytest.fixture
    def runner(self):
        return SimulateRunner()

    @pytest.fixture
    def ok_layout(self, problem):
        return Layout.derived(8, problem.train.global_batch_size, tp=2, zero=1,
                              recompute="selective", sp=True)

    @pytest.fixture
    def failing(self, ok_layout):
        return SimulateRunner(hidden_memory_gib=80.0), ok_layout  # the GPU is already full

    @pytest.fixture
    def refused(self, problem):
        a100 = load_config("llama3-8b", "dgx-a100:1").cluster
        return problem.model_copy(update={"cluster": a100, "train": problem.train.model_copy(
            update={"precision": "fp8"})})


class TestCommandRunner(RunnerContract):
    @pytest.fixture
    def problem(self):
        return load_config("llama3-8b", "dgx-h100:1", framework="deepspeed")

    @pytest.fixture
    def runner(self, tmp_path):
        program = tmp_path / "program.py"
        program.write_text(STEPS)
        return CommandRunner(f"{shlex.quote(sys.executable)} {shlex.quote(str(program))} "
                             "--config {ds_config}", timeout_s=60)

    @pytest.fixture
    def ok_layout(self, problem):
        return Layout.derived(8, problem.train.global_batch_size, zero=3)

    @pytest.fixture
    def failing(self, ok_layout):
        return CommandRunner("echo {layout}; exit 7", timeout_s=60), ok_layout

    @pytest.fixture
    def refused(self, problem):
        return problem.model_copy(update={"train": problem.train.model_copy(
            update={"framework": "megatron"})})  # {ds_config} is not rendered for megatron


@pytest.mark.slow
class TestLocalRunner(RunnerContract):
    """Real DeepSpeed training of tiny-gpt on 2 CPU processes (gloo)."""

    @pytest.fixture
    def problem(self):
        return tiny_config()

    @pytest.fixture
    def runner(self):
        return LocalRunner(steps=4, warmup=1, hang_timeout_s=120, startup_timeout_s=600)

    @pytest.fixture
    def ok_layout(self, problem):
        return Layout.derived(2, problem.train.global_batch_size, zero=1, mbs=4)

    @pytest.fixture
    def failing(self, ok_layout):
        runner = LocalRunner(steps=4, warmup=1, hang_timeout_s=120, startup_timeout_s=600,
                             extra_args=("--inject", "nan"))
        return runner, ok_layout

    @pytest.fixture
    def refused(self):
        return load_config("tiny-gpt", "dgx-h100:2", framework="deepspeed")  # two nodes
