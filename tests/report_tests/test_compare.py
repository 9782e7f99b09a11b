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


def test_compare_names_mode_seq_and_batch_and_warns_when_they_differ(tmp_path: Path) -> None:
    """Oracle: the two sweeps' inputs worked out by hand: a weak sweep of 8 → 32 GPUs keeps the
    base's 64 / dp 4 = 16 sequences per replica, so at dp 16 the batch is 256; a strong one
    keeps 64; their
    modes and batches differ, their sequence length (8,192) does not, and compare says so."""
    cfg = load_config("llama3-8b", "dgx-h100:1", global_batch_size=64)
    layout = Layout.parse("tp=2,zero=1,recompute=selective", 8, 64, get_framework("megatron"))
    weak, strong = tmp_path / "weak", tmp_path / "strong"
    sweep(cfg, layout, [8, 16, 32], "weak", SimulateRunner(), weak)
    sweep(cfg, layout, [8, 16, 32], "strong", SimulateRunner(), strong)
    written = compare([weak, strong], tmp_path / "cmp")
    md = written["compare.md"].read_text()
    assert "| scaling mode | weak | strong |" in md
    assert "| sequence length | 8,192 | 8,192 |" in md
    assert "| global batch (sequences) | 64 → 256 | 64 |" in md
    caveats = json.loads(written["compare.json"].read_text())["caveats"]
    assert len(caveats) == 2 and caveats[0].startswith("weak and strong sweeps")
    assert "global batches (64, 64 → 256)" in caveats[1]
    assert "Not like for like" in written["compare.html"].read_text()
