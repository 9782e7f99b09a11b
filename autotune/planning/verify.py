"""Verify a plan at small sizes, and the policy that runs a plan end to end.

`verify_chosen` runs the chosen layout (the first choice's, else the fastest size's) for real
at a few small GPU counts through the scaling sweep (`autotune.scaling.sweep`, weak mode: each
replica keeps the batch it has in the plan) with any runner, and stores the measured curve in
the plan. From the largest verified size it takes the measured / predicted throughput ratio and
gives the chosen size's days scaled by it: a correction of the prediction by a measurement,
not a measurement of the chosen size.

`run_plan` is what `autotune plan` does: plan, verify when asked, write plan.json, plan.csv,
plan.md and plan.html.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated
from typing import Any

from pydantic import BaseModel
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.planning.build import Plan
from autotune.planning.build import PlanConfig
from autotune.planning.build import cluster_sizes
from autotune.planning.build import make_plan
from autotune.planning.plan import IntervalFn
from autotune.planning.plan import PlanPoint
from autotune.planning.plan import model_interval
from autotune.planning.quantities import expand_sizes
from autotune.runners.base import Runner
from autotune.runners.factory import RunnerSettings
from autotune.runners.factory import figure_label
from autotune.scaling import resized
from autotune.scaling import sweep

VERIFY_DIR = "verify"
"""The sweep's folder inside the plan's output folder."""


def _sizes(value: Any) -> Any:
    return expand_sizes(value, "--verify-sizes") if isinstance(value, str) else value


class PlanRun(BaseModel):
    """A plan, where its files go, and the optional verification at small sizes."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    plan: PlanConfig
    """The plan's inputs."""
    out: Path = Path("autotune-plan")
    """Folder for plan.json, plan.csv, plan.md, plan.html and verify/."""
    verify_sizes: Annotated[tuple[Annotated[int, Field(ge=1)], ...],
                            BeforeValidator(_sizes)] | None = None
    """GPU counts to run the chosen layout at (1,2,4); None: no verification."""
    runner: RunnerSettings = RunnerSettings()
    """Who runs the verification (simulate, local, slurm, command)."""


def verified_point(plan: Plan) -> PlanPoint | None:
    """The point verification runs: the chosen one, else the fastest that fits."""
    ran = [p for p in plan.points if p.ok]
    return plan.chosen or min(ran, key=lambda p: p.days or float("inf"), default=None)


def verify_chosen(plan: Plan, sizes: Sequence[int], runner: Runner, out_dir: Path) -> Plan:
    """Run the chosen layout at `sizes` GPUs with `runner`; the plan with its measured curve.

    Raises:
        AutotuneError: when nothing fits, when no size holds one replica of the layout, or
            when the runner cannot run a size (before any runs).
    """
    point = verified_point(plan)
    if point is None:
        raise AutotuneError("--verify-sizes: no cluster size fits, so there is no layout to "
                            "verify")
    layout = Layout(**point.layout_fields)
    if max(sizes) < layout.model_parallel:
        raise AutotuneError(
            f"--verify-sizes: {point.layout} needs tp·pp·cp = {layout.model_parallel} GPUs per "
            f"replica; give sizes from {layout.model_parallel}, e.g. "
            f"{layout.model_parallel},{2 * layout.model_parallel}")
    family = next(c for c in cluster_sizes(plan.config) if c.name == point.cluster)
    cfg = resized(family.config, point.gpus, point.global_batch_size)
    result = sweep(cfg, layout, list(sizes), "weak", runner, out_dir / VERIFY_DIR)
    doc = result.to_dict()
    ran = [p for p in result.points if p.ok and p.tokens_per_s and p.predicted_tokens_per_s]
    ratio = None
    if ran and ran[-1].tokens_per_s and ran[-1].predicted_tokens_per_s:
        ratio = ran[-1].tokens_per_s / ran[-1].predicted_tokens_per_s
    doc.update({
        "label": figure_label(runner.name),
        "layout_of": point.name,
        "ratio_at_largest": ratio,
        "largest_gpus": ran[-1].gpus if ran else None,
        "corrected_days": point.days / ratio if ratio and point.days else None,
        "directory": VERIFY_DIR,
    })
    return dataclasses.replace(plan, verified=doc)


@dataclasses.dataclass(frozen=True)
class PlanOutcome:
    """A finished `autotune plan`: the plan and the files written."""

    plan: Plan
    written: dict[str, Path]

    @property
    def ok(self) -> bool:
        """True when some size fits (else the work failed)."""
        return any(p.ok for p in self.plan.points)


def run_plan(run: PlanRun, *, interval: IntervalFn = model_interval) -> PlanOutcome:
    """Plan, verify when asked, write every file.

    Raises:
        AutotuneError: on bad input, before any size is planned or any trial runs.
    """
    from autotune.report.plan import write_plan_report
    from autotune.run import prepare_out

    runner = run.runner.build() if run.verify_sizes else None
    out = prepare_out(run.out)
    plan = make_plan(run.plan, interval=interval)
    if runner is not None and run.verify_sizes:
        plan = verify_chosen(plan, run.verify_sizes, runner, out)
    written = plan.save(out)
    written.update(write_plan_report(plan.to_dict(), out))
    return PlanOutcome(plan, written)
