"""Runners: how a trial executes and is measured (simulate, command, local, slurm)."""

from autotune.measurement import STATUSES
from autotune.measurement import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan

__all__ = ["STATUSES", "Measurement", "Runner", "TrialPlan"]
