"""`tune` prints every predicted tokens/s with its range, or the uncalibrated mark, in its
table and in its report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from autotune.specs.inputs import load_cluster
from tests.cli_tests.helpers_cli import REPO
from tests.cli_tests.helpers_cli import cli

H200 = {"memory_gb": 141, "peak_tflops": {"bf16": 989.4, "fp8": 1978.9}, "hbm_tb_s": 4.8}


def _stored_range() -> tuple[float, float]:
    """H100 / megatron-core's bf16 range as constants.yaml stores it (the input, read here
    without the code that uses it)."""
    doc = yaml.safe_load((REPO / "autotune/presets/constants.yaml").read_text())
    entry = doc["h100-sxm-80gb"]["stacks"]["megatron-core"]["intervals"]["bf16"]
    return float(entry["low"]), float(entry["high"])


def test_a_preset_gpu_prints_the_range_worked_out_from_the_stored_residuals(
        tmp_path: Path) -> None:
    """Oracle: tokens/s range = predicted / high … predicted / low, with low and high the
    stored measured / predicted step-time ratios (a step slower by `high` is a rate lower by
    it)."""
    out = tmp_path / "run"
    done = cli("tune", "-m", "llama3-8b", "-c", "dgx-h100:2", "--trials", "3", "--out", out,
               "--json")
    assert done.code == 0, done.err
    best = json.loads(done.out)["best"]
    low, high = _stored_range()
    predicted = best["predicted"]["tokens_per_s"]
    expected = f"{predicted:,.0f} ({predicted / high:,.0f}–{predicted / low:,.0f})"
    report = (out / "report.md").read_text()
    assert f"predicted {expected} tokens/s" in report
    assert f"| {expected} |" in report


def test_a_custom_gpu_without_like_is_marked_uncalibrated(tmp_path: Path) -> None:
    """A custom GPU mapping with no `like` has no published runs: the table's caption and the
    report say uncalibrated and no predicted figure carries a range."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": 1, "gpus_per_node": 8, "gpu": H200,
                                       "intra_node_gb_s": 450, "inter_node_gb_s": 50,
                                       "host_memory_gb": 2048, "pcie_gb_s": 64}))
    load_cluster(str(cluster))  # the mapping itself is valid
    out = tmp_path / "run"
    done = cli("tune", "-m", "llama3-8b", "-c", cluster, "--trials", "3", "--out", out)
    assert done.code == 0, done.err
    table = done.out[done.out.index("Top layouts"):]
    assert "uncalibrated" in table and "–" not in table
    report = (out / "report.md").read_text()
    assert "Predicted figures are uncalibrated" in report
    assert not re.search(r"predicted [\d,]+ \(", report)

