"""Test suites for code that plugs into autotune (runners), reusable in your own tests."""

from autotune.testing.runner_contract import RunnerContract
from autotune.testing.runner_contract import run_trial

__all__ = ["RunnerContract", "run_trial"]
