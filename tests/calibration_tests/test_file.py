"""The calibration file: round trip, refusal of another GPU type or stack, and its use."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from autotune.calibration.file import Calibration
from autotune.calibration.file import FittedConstant
from autotune.calibration.file import Point
from autotune.calibration.file import Software
from autotune.calibration.file import apply_calibration
from autotune.calibration.file import load_calibration
from autotune.calibration.file import stack_mismatch
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs.inputs import load_config

STACK = Software(python="3.11.7", torch="2.13.0+cu128", backend="nccl 2.27.3", cuda="12.8",
                 deepspeed="0.19.8", megatron_core="0.16.1")


def _calibration(gpu_name: str = "h100-sxm-80gb", **constants: float) -> Calibration:
    cfg = load_config("llama3-8b", "dgx-h100:1")
    gpu = cfg.cluster.gpu.model_copy(update={"name": gpu_name})
    fitted = {name: FittedConstant(value=value, before=0.8, points=3, median_residual=0.01,
                                   max_residual=0.02) for name, value in constants.items()}
    point = Point(kind="gemm", op="mm", dtype="bf16", shape={"m": 4096, "n": 4096, "k": 4096},
                  ranks=[0], seconds=2e-4, rate=6.9e14)
    return Calibration(created=datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC),
                       source="microbenchmarks", cluster="dgx-h100:1", gpu=gpu, software=STACK,
                       points=[point], constants=fitted)


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    """Oracle: the object written is the object read back (YAML through yaml.safe_load)."""
    calibration = _calibration(gemm_efficiency=0.7, comm_efficiency=0.6)
    path = tmp_path / "cal" / "calibration.yaml"
    calibration.write(path)
    assert load_calibration(path) == calibration
    assert "gemm_efficiency" in path.read_text()


def test_constants_reach_every_estimate() -> None:
    """Oracle: the estimate of the calibrated problem (constants found through its GPU) equals
    the estimate of the plain problem given the file's constants explicitly, and differs from
    the preset's."""
    cfg = load_config("llama3-8b", "dgx-h100:1")
    table = LayoutTable.from_layouts([Layout(tp=8, mbs=1)])
    calibrated = apply_calibration(cfg, _calibration(gemm_efficiency=0.4, comm_efficiency=0.6),
                                   "cal.yaml", here=STACK)
    assert calibrated.cluster.gpu.calibration == "cal.yaml"
    explicit = constants_for(cfg.cluster.gpu, cfg.train.software_stack).model_copy(
        update={"gemm_efficiency": 0.4, "comm_efficiency": 0.6})
    assert constants_for(calibrated.cluster.gpu, cfg.train.software_stack) == explicit
    found = evaluate(calibrated, table).step_time_s[0]
    assert found == evaluate(cfg, table, explicit).step_time_s[0]
    assert found > evaluate(cfg, table).step_time_s[0]


def test_other_gpu_type_is_refused_in_one_line() -> None:
    """A file made on an A100 is refused for an H100 problem, naming both; the override uses
    it anyway."""
    cfg = load_config("llama3-8b", "dgx-h100:1")
    other = _calibration("a100-sxm-80gb", gemm_efficiency=0.6)
    with pytest.raises(AutotuneError) as error:
        apply_calibration(cfg, other, "a100.yaml", here=STACK)
    message = str(error.value)
    assert "\n" not in message
    assert "a100-sxm-80gb" in message and "h100-sxm-80gb" in message
    assert "--ignore-calibration-mismatch" in message
    forced = apply_calibration(cfg, other, "a100.yaml", here=STACK, ignore_mismatch=True)
    assert constants_for(forced.cluster.gpu).gemm_efficiency == 0.6


@pytest.mark.parametrize(
    ("here", "named"),
    [
        (STACK.model_copy(update={"torch": "2.12.1+cu128"}), "torch 2.13.0+cu128"),
        (STACK.model_copy(update={"backend": "nccl 2.21.5"}), "backend nccl 2.27.3"),
        (STACK.model_copy(update={"deepspeed": "0.18.0"}), "deepspeed 0.19.8"),
    ],
)
def test_other_software_stack_is_refused(here: Software, named: str) -> None:
    """The first differing component (major.minor) is named; patch releases and a component
    one side lacks are not a mismatch."""
    cfg = load_config("llama3-8b", "dgx-h100:1")
    with pytest.raises(AutotuneError, match=re.escape(named)):
        apply_calibration(cfg, _calibration(gemm_efficiency=0.7), "cal.yaml", here=here)
    patch = STACK.model_copy(update={"torch": "2.13.1+cu128", "megatron_core": None})
    assert stack_mismatch(STACK, patch) is None


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ("gemm_efficiency:\n    value: 0.7", "gemm_efficiency"),
        ("source: microbenchmarks", "source"),
    ],
)
def test_bad_file_is_one_line(tmp_path: Path, edit: str, named: str) -> None:
    """A constant out of its physical range, or an unknown source, names the field."""
    path = tmp_path / "bad.yaml"
    _calibration(gemm_efficiency=0.7).write(path)
    text = path.read_text()
    broken = {"gemm_efficiency": text.replace(edit, "gemm_efficiency:\n    value: 1.7"),
              "source": text.replace(edit, "source: guesses")}[named]
    path.write_text(broken)
    with pytest.raises(AutotuneError) as error:
        load_calibration(path)
    assert "\n" not in str(error.value) and named in str(error.value)


def test_incomplete_run_is_refused() -> None:
    """A run that lost a worker is kept for its points but never applied."""
    broken = _calibration().model_copy(update={"complete": False, "failure": "worker 1 died"})
    with pytest.raises(AutotuneError, match="worker 1 died"):
        apply_calibration(load_config("llama3-8b", "dgx-h100:1"), broken, "x.yaml", here=STACK)
