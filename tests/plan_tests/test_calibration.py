"""--calibration: a plan on constants refitted to a study's measured trials, and what is
refused. Oracle: a real `tune` study whose trials a command (a real subprocess) measures as
the model with a known lower GEMM efficiency (0.55 instead of the preset's): the refit must
lower the plan's throughput for that GPU and leave other GPUs on their presets."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.planning.build import PlanConfig
from autotune.planning.build import make_plan
from autotune.run import Problem
from autotune.run import RunConfig
from autotune.run import TuneSettings
from autotune.run import tune

TRUTH = """
import json, sys
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import estimate
from autotune.layout import Layout
from autotune.specs.inputs import load_config
doc = json.load(open(sys.argv[1]))
layout = Layout(**{k: doc[k] for k in Layout.__dataclass_fields__})
cfg = load_config("llama3-8b", "dgx-h100:1")
k = constants_for(cfg.cluster.gpu).model_copy(update={"gemm_efficiency": 0.55})
print(json.dumps({"step_time_s": estimate(cfg, layout, k).step_time_s}))
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("study")
    script = out / "truth.py"
    script.write_text(TRUTH)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{layout_json}}"
    config = RunConfig(problem=Problem(model="llama3-8b", cluster="dgx-h100:1"),
                       runner={"name": "command", "command": command, "timeout_s": 120},
                       tune=TuneSettings(trials=4, top_k=0), out=out)
    assert tune(config).ok
    return out


def test_a_plan_uses_the_refitted_constants_and_says_so(study: Path) -> None:
    plain = make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1", "dgx-a100:1"),
                                 tokens="1T"))
    fitted = make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1", "dgx-a100:1"),
                                  tokens="1T", calibration=study))
    assert fitted.constants.startswith("refitted to 4 measured trials of ")
    assert "h100-sxm-80gb" in fitted.constants and "gemm_efficiency" in fitted.constants
    h100_plain, a100_plain = plain.points
    h100_fitted, a100_fitted = fitted.points
    assert h100_fitted.tokens_per_s < 0.95 * h100_plain.tokens_per_s
    assert a100_fitted.tokens_per_s == a100_plain.tokens_per_s


def test_a_simulated_study_or_a_file_is_refused(tmp_path: Path) -> None:
    config = RunConfig(problem=Problem(model="llama3-8b", cluster="dgx-h100:1"),
                       tune=TuneSettings(trials=2, top_k=0), out=tmp_path / "sim")
    tune(config)
    with pytest.raises(AutotuneError, match="holds no measured study .*simulate"):
        make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T",
                             calibration=tmp_path / "sim"))
    file = tmp_path / "calibration.yaml"
    file.write_text("constants: {}\n")
    with pytest.raises(AutotuneError, match="reads no calibration files yet"):
        make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T",
                             calibration=file))
    with pytest.raises(AutotuneError, match="is neither a folder nor a file"):
        make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T",
                             calibration=tmp_path / "missing"))
