"""Failed trials of the local runner: each classified, killed and reaped; the study goes on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers_runners import SPACE
from helpers_runners import leftovers
from helpers_runners import pin_trials

from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.runners.base import TrialPlan
from autotune.runners.local import LocalRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.specs import AutotuneConfig
from autotune.testing import run_trial

PLAN = {
    "ok": Layout(dp=2, zero=0, mbs=4, gas=1),
    "nan": Layout(dp=2, zero=1, mbs=4, gas=1),
    "hang": Layout(dp=2, zero=2, mbs=4, gas=1),
    "rejected": Layout(dp=2, zero=3, mbs=4, gas=1),
    "pruned": Layout(dp=2, zero=0, mbs=1, gas=4),
}
"""What each pinned layout is made to do."""
SCRIPT = {layout.id: action for action, layout in PLAN.items()}


class ScriptedRunner(LocalRunner):
    """The local runner with a failure provoked per layout (through the workload's --inject, a
    ds_config that DeepSpeed refuses, or a pruner that always says stop)."""

    def command(self, plan: TrialPlan) -> list[str]:
        argv = super().command(plan)
        action = SCRIPT.get(plan.layout.id, "ok")
        return [*argv, "--inject", action] if action in ("nan", "hang", "oom") else argv

    def run(self, plan: TrialPlan) -> Measurement:
        action = SCRIPT.get(plan.layout.id, "ok")
        if action == "rejected":  # a value DeepSpeed's config model refuses at initialize
            path = plan.artifacts["ds_config.json"]
            config = json.loads(path.read_text())
            config["zero_optimization"]["reduce_bucket_size"] = -1
            path.write_text(json.dumps(config))
        if action == "pruned":
            plan = dataclasses.replace(plan, report=lambda step, value: True)
        return super().run(plan)


@pytest.mark.slow
def test_failures_are_classified_and_the_study_completes(
    tmp_path: Path, cfg: AutotuneConfig
) -> None:
    """Oracle: real DeepSpeed trials on 2 CPU processes, each made to fail for real (a NaN loss and
    a hang through the workload's --inject, a ds_config value DeepSpeed's own config model
    refuses, a pruner that says stop): each ends with its class and reason, and the study
    completes with the healthy trial first."""
    layouts = list(PLAN.values())
    pin_trials(tmp_path, cfg, SPACE, layouts)
    runner = ScriptedRunner(steps=3, warmup=1, hang_timeout_s=20, startup_timeout_s=600)
    # no pruning by throughput: the 'pruned' trial is stopped by its scripted pruner
    options = TuneSettings(trials=len(layouts), resume=True, top_k=0, pruner_tolerance=1.0)

    result = tune(cfg, SPACE, runner, options, tmp_path)

    ran = {SCRIPT[r["layout_id"]]: r for r in result.records if r.get("ran")}
    print("\ntrial  layout                          status    step s  reason")
    for r in result.records:
        step = r.get("measured_step_time_s")
        print(f"{r['number']:<6} {r['layout_id']:<31} {r['status']:<9} "
              f"{f'{step:.3f}' if step else '-':>6}  {r.get('reason', '')[:60]}")
    assert {action: r["status"] for action, r in ran.items()} == {a: a for a in PLAN}
    assert "NaN" in ran["nan"]["reason"]
    assert "hang timeout (20 s)" in ran["hang"]["reason"]
    assert "DeepSpeedZeroConfig" in ran["rejected"]["reason"]  # DeepSpeed refused the value
    assert ran["pruned"]["state"] == "PRUNED"
    assert result.ranked[0]["layout_id"] == PLAN["ok"].id
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_trial_that_exhausts_its_memory_limit_is_oom(
    tmp_path: Path, cfg: AutotuneConfig
) -> None:
    """Oracle: a real trial under a real 3 GiB address-space limit (ulimit -v) with a model too big
    for it: torch's allocator refuses, and the trial is oom."""
    big = cfg.model.model_copy(
        update={
            "name": "big",
            "hidden_size": 1024,
            "num_layers": 8,
            "ffn_hidden_size": 4096,
            "vocab_size": 32000,
        }
    )  # ~190 M parameters: 0.77 GB of fp32 weights alone per rank
    folder = tmp_path / "trial"
    runner = LocalRunner(steps=3, warmup=1, memory_limit_bytes=3 << 30, startup_timeout_s=600)

    measurement = run_trial(runner, cfg.model_copy(update={"model": big}),
                            Layout(dp=2, mbs=4, gas=1), folder).measurement

    assert measurement.status == "oom", measurement.reason
    assert "can't allocate memory" in measurement.reason
    assert "ulimit -v 3145728" in (folder / "command.sh").read_text()
    assert leftovers(tmp_path) == []
