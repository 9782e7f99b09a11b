"""The one trial pipeline: rules → estimate → render → run → record, for `tune` and `scale`.

`TrialPipeline.violations` checks a layout against the framework's named rules;
`TrialPipeline.run` predicts it, renders its configs (and problem.json) into the trial folder
when the runner reads them, runs it with the runner and returns prediction and measurement
together. The search and the scaling sweep record the result their own way.

Example:
    >>> from autotune import Layout, load_config
    >>> from autotune.runners.simulate import SimulateRunner
    >>> cfg = load_config("llama3-8b", "dgx-h100:1")
    >>> pipeline = TrialPipeline(cfg, SimulateRunner())
    >>> layout = Layout(tp=2, dp=4, zero=1, gas=128, recompute="selective", sp=True)
    >>> pipeline.violations(layout)
    []
    >>> pipeline.run(layout, number=0, directory=Path("/tmp/trial")).measurement.status
    'ok'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate
from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.measurement import validated
from autotune.runners.base import Noter
from autotune.runners.base import Reporter
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.base import run_guarded
from autotune.runners.validity import gate
from autotune.space.rules import violations
from autotune.specs import AutotuneConfig
from autotune.workloads import write_problem


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """One layout that ran: what the model predicted and what the runner measured."""

    layout: Layout
    prediction: Estimate
    measurement: Measurement
    directory: Path
    artifacts: dict[str, Path]


class TrialPipeline:
    """Checks, predicts, renders and runs layouts of one problem with one runner.

    Args:
        cfg: The problem (model, cluster, training setup).
        runner: Runs each trial.
        constants: The model's constants (default: the cluster's GPU's calibrated ones).
    """

    def __init__(self, cfg: AutotuneConfig, runner: Runner,
                 constants: Constants | None = None) -> None:
        self.cfg, self.runner = cfg, runner
        self.constants = constants or constants_for(cfg.cluster.gpu, cfg.train.software_stack)

    def violations(self, layout: Layout) -> list[tuple[str, str]]:
        """The named rules the layout breaks, with their reasons (empty: it may run)."""
        return violations(self.cfg, layout, self.constants)

    def run(
        self,
        layout: Layout,
        *,
        number: int,
        directory: Path,
        report: Reporter | None = None,
        attrs: Mapping[str, Any] | None = None,
        note: Noter | None = None,
    ) -> TrialResult:
        """Predict, render (when the runner reads configs) and run one layout that passed the
        rules; the runner's failures come back as the measurement's status, never raised (a
        runner that raises makes a `crash`, and a measurement that is not one — NaN, zero,
        negative figures — is a `crash` with the reason: `autotune.measurement.validated`; one
        the framework did not run as asked, or that no hardware can reach, is `invalid`:
        `autotune.runners.validity.gate`)."""
        prediction = estimate(self.cfg, layout, self.constants)
        artifacts: dict[str, Path] = {}
        if self.runner.needs_artifacts:
            from autotune.render import write_artifacts

            directory.mkdir(parents=True, exist_ok=True)
            artifacts = write_artifacts(self.cfg, layout, directory, estimate=prediction,
                                        trial=True)
            artifacts["problem.json"] = write_problem(self.cfg, directory)
        plan = TrialPlan(
            self.cfg, layout, number, directory, artifacts,
            report or (lambda step, value: False), attrs=dict(attrs or {}),
            note=note or (lambda key, value: None),
        )
        measurement = gate(self.cfg, layout, validated(run_guarded(self.runner, plan)))
        return TrialResult(layout, prediction, measurement, directory, artifacts)
