"""compare: side-by-side table, efficiency table and overlaid curves of several folders."""

from __future__ import annotations

import json
from pathlib import Path

from helpers_report import EXTERNAL

from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.report import compare
from autotune.runners.simulate import SimulateRunner
from autotune.scaling import sweep
from autotune.specs.inputs import load_config


def test_compare_tune_and_scale_folders(report_dir: Path, tmp_path: Path) -> None:
    """Oracle: the documented contract of compare: one column per folder in order, the best of a
    scale-only folder taken from its largest size, both plots inline and as files, no network
    reference."""
    scale_dir = tmp_path / "a100-scale"
    cfg = load_config("llama3-8b", "dgx-a100:1")
    layout = Layout.parse("tp=2,zero=1,recompute=selective", 8, 512, get_framework("megatron"))
    sweep(cfg, layout, [8, 16, 32], "weak", SimulateRunner(), scale_dir)
    written = compare([report_dir, scale_dir], tmp_path / "cmp")
    md = written["compare.md"].read_text()
    assert "|  | llama3-8b-run | a100-scale |" in md
    assert "sweep at 32 GPUs" in md and "## Scaling efficiency" in md
    html = written["compare.html"].read_text()
    assert not EXTERNAL.search(html)
    for name in ("compare_best", "compare_scaling"):
        assert f'id="plot-{name}"' in html
        assert (tmp_path / "cmp" / "plots" / f"{name}.svg").exists()
    doc = json.loads(written["compare.json"].read_text())
    assert [r["name"] for r in doc["runs"]] == ["llama3-8b-run", "a100-scale"]
    assert doc["runs"][1]["best"]["source"] == "sweep at 32 GPUs"
    assert doc["runs"][0]["scaling"]["mode"] == "strong"
