"""--verify-sizes: the chosen layout run at small sizes through the scaling sweep.

Oracles: the sweep's own points (sizes, the layout run, what each measured), arithmetic on
them (the measured / predicted ratio and the corrected days), and, for the local runner, real
DeepSpeed training of tiny-gpt in CPU processes on gloo (the measured figures come from the
processes' own step records).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.planning.build import PlanConfig
from autotune.planning.verify import PlanRun
from autotune.planning.verify import run_plan

_TINY = "tp: [1]\npp: [1]\nzero: [1]\noffload: [none]\nmbs: [2]\nrecompute: [none]\nsp: [false]\n"


def test_simulated_verification_runs_the_chosen_layout(tmp_path: Path) -> None:
    run = PlanRun(plan=PlanConfig(model="llama3-8b", clusters=("dgx-h100:1,2",), tokens="1T",
                                  price="2", deadline="200d"),
                  out=tmp_path, verify_sizes="8,16", runner={"name": "simulate", "noise": 0.1,
                                                             "seed": 1})
    outcome = run_plan(run)
    plan, verified = outcome.plan, outcome.plan.verified
    assert verified is not None and verified["label"] == "simulated"
    chosen = plan.chosen
    assert chosen is not None and verified["layout_of"] == chosen.name
    assert verified["layout"]["tp"] == chosen.layout_fields["tp"]
    assert [p["gpus"] for p in verified["points"]] == [8, 16]
    largest = verified["points"][-1]
    ratio = largest["tokens_per_s"] / largest["predicted_tokens_per_s"]
    assert verified["ratio_at_largest"] == pytest.approx(ratio)
    assert verified["corrected_days"] == pytest.approx(chosen.days / ratio)
    assert (tmp_path / "verify" / "scaling.json").is_file()
    assert json.loads((tmp_path / "plan.json").read_text())["verified"]["largest_gpus"] == 16
    md = (tmp_path / "plan.md").read_text()
    assert "## Verified at small sizes" in md and "a corrected prediction" in md


def test_sizes_below_one_replica_are_refused(tmp_path: Path) -> None:
    """Llama 3 405B's best layout on 64 H100 nodes spans far more than 4 GPUs."""
    run = PlanRun(plan=PlanConfig(model="llama3-405b", clusters=("dgx-h100:64",), tokens="1T"),
                  out=tmp_path, verify_sizes="1,2,4")
    with pytest.raises(AutotuneError, match=r"^--verify-sizes: .* needs tp·pp·cp = \d+ GPUs"):
        run_plan(run)


@pytest.mark.slow
def test_local_cpu_verification_measures_real_training(tmp_path: Path) -> None:
    """tiny-gpt on the local CPU 'cluster' (2 processes): the chosen layout trains for real
    with DeepSpeed on gloo at 1 and 2 processes."""
    space = tmp_path / "tiny.yaml"
    space.write_text(_TINY)
    run = PlanRun(plan=PlanConfig(model="tiny-gpt", clusters=("local",), tokens="100M",
                                  space=str(space),
                                  train={"framework": "deepspeed", "global_batch_size": 4}),
                  out=tmp_path / "plan", verify_sizes="1,2",
                  runner={"name": "local", "steps": 3})
    verified = run_plan(run).plan.verified
    assert verified is not None and verified["label"] == "measured"
    assert [p["status"] for p in verified["points"]] == ["ok", "ok"], verified["points"]
    for p in verified["points"]:
        assert p["tokens_per_s"] > 0 and p["step_time_s"] > 0
        record = json.loads((tmp_path / "plan" / "verify" / p["directory"] / "point.json")
                            .read_text())
        assert record["measurement"]["status"] == "ok"
    assert verified["ratio_at_largest"] > 0
