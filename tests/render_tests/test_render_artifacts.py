"""write_artifacts: the files, layout.json, manifest.json, and golden copies of every artifact.

Regenerate the golden files after an intended change with
`AUTOTUNE_UPDATE_GOLDEN=1 python -m pytest tests/render_tests/test_render_artifacts.py`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from render_samples import problem

from autotune import AutotuneError
from autotune import Layout
from autotune import estimate
from autotune import templating
from autotune.costmodel.constants import constants_for
from autotune.costmodel.memory import MEMORY_PARTS
from autotune.costmodel.step_time import TIME_PARTS
from autotune.render import TrainProgram
from autotune.render import write_artifacts
from autotune.space.rules import violations

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AUTOTUNE_UPDATE_GOLDEN") == "1"
GOLDEN_CASES = {
    # golden folder: (framework, model, cluster, layout)
    "megatron": ("megatron", "llama3-405b", "dgx-h100:2048",
                 Layout(tp=8, pp=16, cp=8, dp=16, zero=1, offload="optimizer", gas=128, sp=True,
                        recompute="selective")),
    "megatron-moe": ("megatron", "mixtral-8x7b", "dgx-h100:8",
                     Layout(tp=2, pp=4, cp=2, dp=4, zero=1, gas=256, sp=True, ep=8, etp=1)),
    "deepspeed": ("deepspeed", "llama2-7b", "dgx-h100:4",
                  Layout(tp=2, pp=1, cp=1, dp=16, zero=3, offload="optimizer+params", gas=64,
                         recompute="full")),
}
GOLDEN_FILES = {
    "megatron": ("pretrain_gpt.sh", "sbatch.sh", "layout.json", "README.md"),
    "megatron-moe": ("pretrain_gpt.sh", "layout.json"),
    "deepspeed": ("ds_config.json", "launch_deepspeed.sh", "hostfile", "sbatch.sh", "layout.json",
                  "README.md"),
}


@pytest.mark.parametrize(
    ("case", "name"),
    [(case, name) for case, names in GOLDEN_FILES.items() for name in names],
)
def test_golden(case: str, name: str, tmp_path: Path, monkeypatch) -> None:
    """Change detector, not an oracle: the committed golden copies, read by a person when they
    are regenerated. Whether the files are right is checked against DeepSpeed, megatron-core
    and bash elsewhere; this shows every change to them in review."""
    monkeypatch.setattr(templating, "__version__", "VERSION")
    framework, model, cluster, layout = GOLDEN_CASES[case]
    cfg = problem(model, cluster, framework, None)
    assert violations(cfg, layout, constants_for(cfg.cluster.gpu)) == [], "golden must be legal"
    paths = write_artifacts(cfg, layout, tmp_path, job_name="golden")
    text = paths[name].read_text()
    golden = GOLDEN / case / name
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with AUTOTUNE_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"{name} differs from {golden}; if intended, rerun with AUTOTUNE_UPDATE_GOLDEN=1"
    )


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_write_artifacts(framework: str, tmp_path: Path) -> None:
    """Oracle: the documented contract of an artifacts folder (README): the framework's files,
    scripts executable and nothing else, layout.json that reads back as the same Layout,
    manifest.json with the tool, library versions, inputs, layout, prediction, measurement and
    launch commands."""
    _, model, cluster, layout = GOLDEN_CASES[framework]
    cfg = problem(model, cluster, framework, None)
    measured = {"status": "ok", "step_time_s": 1.5, "tokens_per_s": 2.0e6}
    paths = write_artifacts(cfg, layout, tmp_path / "run", measured=measured,
                            extra_manifest={"study": "s1"})
    expected = {"sbatch.sh", "layout.json", "manifest.json", "README.md", "pytorchjob.yaml",
                "skypilot.yaml"} | (
        {"pretrain_gpt.sh"} if framework == "megatron"
        else {"ds_config.json", "launch_deepspeed.sh", "hostfile"})
    assert set(paths) == expected
    assert {p.name for p in (tmp_path / "run").iterdir()} == expected
    for name, path in paths.items():
        executable = bool(path.stat().st_mode & stat.S_IXUSR)
        assert executable == name.endswith(".sh"), name

    layout_doc = json.loads(paths["layout.json"].read_text())
    assert layout_doc["text"] == layout.text and layout_doc["id"] == layout.id
    fields = {k: v for k, v in layout_doc.items() if k not in ("text", "id")}
    assert Layout(**fields) == layout

    manifest = json.loads(paths["manifest.json"].read_text())
    assert manifest["tool"]["name"] == "autotune"
    assert manifest["framework"] == framework
    assert set(manifest["libraries"]) == {"torch", "deepspeed", "megatron-core", "optuna"}
    assert manifest["libraries"]["deepspeed"] and manifest["libraries"]["torch"]
    assert manifest["inputs"]["model"]["name"] == model
    assert manifest["inputs"]["train"]["global_batch_size"] == cfg.train.global_batch_size
    assert manifest["inputs"]["recipe"]["lr"] is None  # nothing set: the published recipe's
    assert set(manifest["recipe"]["origin"].values()) <= {"published", "autotune"}
    assert manifest["layout"] == layout_doc
    predicted = manifest["predicted"]
    assert set(predicted["memory"]["parts"]) == set(MEMORY_PARTS)
    assert set(predicted["time"]["parts"]) == set(TIME_PARTS)
    assert predicted["step_time_s"] == pytest.approx(estimate(cfg, layout).step_time_s)
    assert manifest["measured"] == measured
    assert manifest["study"] == "s1"
    assert set(manifest["artifacts"]) == expected
    scripts = {name for name in expected
               if name.endswith((".sh", ".yaml")) or name == "ds_config.json"}
    assert scripts <= set(manifest["launch"])


def test_given_estimate_is_recorded(tmp_path: Path) -> None:
    """Oracle: the documented contract of write_artifacts: a given estimate and training program
    are recorded as given."""
    _, model, cluster, layout = GOLDEN_CASES["deepspeed"]
    cfg = problem(model, cluster, "deepspeed", None)
    paths = write_artifacts(cfg, layout, tmp_path, estimate={"step_time_s": 9.0},
                            program=TrainProgram(script="my_train.py"))
    manifest = json.loads(paths["manifest.json"].read_text())
    assert manifest["predicted"] == {"step_time_s": 9.0}
    assert "my_train.py" in paths["launch_deepspeed.sh"].read_text()


def test_layout_must_match_the_cluster(tmp_path: Path) -> None:
    """Oracle: Megatron-LM's grid rule (world = tp·pp·cp·dp), worked out by hand: dp=4 on one
    node of 8 GPUs is refused, naming both sides."""
    cfg = problem("llama2-7b", "dgx-h100:1", "megatron", None)
    with pytest.raises(AutotuneError, match=r"tp \(1\) · pp \(1\) · cp \(1\) · dp \(4\) = 4, "
                       r"but the cluster has 8 GPUs"):
        write_artifacts(cfg, Layout(dp=4, gas=256), tmp_path)
