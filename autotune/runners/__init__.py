"""Runners: how a trial executes and is measured (simulate, command, local, slurm)."""

from autotune.runners.base import STATUSES
from autotune.runners.base import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan

__all__ = ["STATUSES", "Measurement", "Runner", "TrialPlan"]
