"""Plan a training run: days, GPU-hours and cost per cluster size, with the size worth paying
for (`make_plan`), and the choice under a deadline or a budget."""

from autotune.planning.build import Plan
from autotune.planning.build import PlanConfig
from autotune.planning.build import make_plan
from autotune.planning.plan import Interval
from autotune.planning.plan import PlanPoint

__all__ = ["Interval", "Plan", "PlanConfig", "PlanPoint", "make_plan"]
