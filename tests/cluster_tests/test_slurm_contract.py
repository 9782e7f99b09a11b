"""The runner contract (autotune.testing.RunnerContract) for the slurm runner, on the real
one-node Slurm that tests/services/slurm.sh starts: real sbatch jobs training tiny-gpt with
DeepSpeed on CPU processes. Oracles: Slurm's own job states and the contract's checks."""

from __future__ import annotations

import pytest
from helpers_cluster import first_layout
from helpers_cluster import tiny_config

from autotune.runners.slurm import SlurmRunner
from autotune.testing import RunnerContract

pytestmark = pytest.mark.slow


class TestSlurmRunner(RunnerContract):
    @pytest.fixture
    def problem(self, slurm: str):
        return tiny_config()

    @pytest.fixture
    def runner(self, slurm: str):
        return SlurmRunner(poll_s=0.5, steps=4, warmup=1, hang_timeout_s=300)

    @pytest.fixture
    def ok_layout(self, problem):
        return first_layout(problem)

    @pytest.fixture
    def failing(self, ok_layout, slurm: str):
        return SlurmRunner(poll_s=0.5, steps=4, warmup=1, extra_args=("--inject", "nan")), \
            ok_layout

    @pytest.fixture
    def refused(self, problem):  # megatron-core needs GPUs; this Slurm has none
        return problem.model_copy(update={"train": problem.train.model_copy(
            update={"framework": "megatron"})})
