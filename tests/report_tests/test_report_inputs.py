"""Reports: simulated figures are labelled simulated, and a damaged run.json or scaling.json is
refused with one line naming the file and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.report import compare
from autotune.report import write_report
from autotune.runners.command import CommandRunner
from autotune.runners.simulate import SimulateRunner
from autotune.scaling import sweep
from autotune.specs.inputs import load_config

MEASURED = re.compile(r"\bmeasured\b")
SIMULATED = re.compile(r"\bsimulated\b")


def _sweep(folder: Path, runner) -> Path:
    cfg = load_config("llama3-8b", "dgx-h100:2")
    layout = Layout.parse("tp=2,zero=1", 16, cfg.train.global_batch_size,
        get_framework("megatron"))
    sweep(cfg, layout, [8, 16], "weak", runner, folder)
    return folder


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sweep(tmp_path_factory.mktemp("simulated"), SimulateRunner())


def test_simulate_runner_figures_are_labelled_simulated(simulated: Path, tmp_path: Path) -> None:
    """Oracle: the simulate runner trains nothing (it returns the model's own figures), so no
    figure of its report may be called measured; a command runner's figures are measured."""
    written = write_report(simulated)
    for name in ("report.md", "report.html"):
        text = written[name].read_text()
        assert not MEASURED.search(text), (name, MEASURED.findall(text))
        assert SIMULATED.search(text), name
    assert json.loads(written["summary.json"].read_text())["inputs"]["figures"] == "simulated"
    measured = _sweep(tmp_path / "measured", CommandRunner(
        "echo '{\"step_time_s\": 1.0}' # {trial_dir}"))
    written = write_report(measured)
    assert not SIMULATED.search(written["report.md"].read_text())
    assert json.loads(written["summary.json"].read_text())["inputs"]["figures"] == "measured"


@pytest.mark.parametrize(
    ("file", "damage", "match"),
    [
        ("run.json", lambda text: "{not json", r"run.json is not valid JSON \(Expecting"),
        ("scaling.json", lambda text: "[1, 2]", r"scaling.json holds a JSON list, not an object"),
        ("scaling.json", lambda text: text.replace('"gpus": 8', '"gpus": "8"', 1),
         r"scaling.json: points.0.gpus = '8': Input should be a valid integer"),
        ("scaling.json", lambda text: text.replace('"mode": "weak"', '"mode": 5'),
         r"scaling.json: mode = 5"),
        ("scaling.json", lambda text: text.replace('"tp": 2', '"tp": null', 1),
         r"scaling.json: layout.tp"),
        ("scaling.json", lambda text: text[: len(text) // 2], r"scaling.json is not valid JSON"),
    ],
)
def test_damaged_files_are_refused_in_one_line(
    simulated: Path, tmp_path: Path, file: str, damage, match: str
) -> None:
    """Oracle: the JSON grammar and the types `ScalingResult.save` and `write_run_json` write;
    before, report and compare ended in JSONDecodeError, TypeError or AttributeError."""
    folder = tmp_path / "run"
    folder.mkdir()
    text = (simulated / "scaling.json").read_text()
    (folder / "scaling.json").write_text(text)
    if file == "run.json":
        (folder / "run.json").write_text(damage(""))
    else:
        (folder / "scaling.json").write_text(damage(text))
    with pytest.raises(AutotuneError, match=match) as caught:
        write_report(folder)
    assert "\n" not in str(caught.value) and "regenerate it" in str(caught.value)
    with pytest.raises(AutotuneError, match=match):
        compare([simulated, folder], tmp_path / "compared")
