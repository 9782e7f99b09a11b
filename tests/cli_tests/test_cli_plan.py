"""`autotune plan` through the real entry point: bad input in one line with exit 2, the JSON,
the folder, and `report` / `compare` on a plan folder. Oracle: the CLI contract (exit codes,
one `error:` line naming the option and the fix) and the plan's own JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import assert_usage_error
from helpers_cli import cli

BASE = ("plan", "-m", "llama3-8b", "-c", "dgx-h100:1,2")


@pytest.mark.parametrize(("option", "value"), [
    ("--tokens", "0"), ("--tokens", "-5T"), ("--tokens", "inf"), ("--tokens", "nan"),
    ("--price", "-1"), ("--price", "inf"), ("--price", "dgx-h100=0"),
    ("--deadline", "0d"), ("--deadline", "nan"), ("--deadline", "-3"),
    ("--budget", "-2M"), ("--budget", "1e999"), ("--max-gbs-tokens", "0"),
])
def test_not_positive_finite_numbers_are_one_line_errors(option: str, value: str,
                                                         tmp_path: Path) -> None:
    args = {"--tokens": "1T", "--price": "2", option: value}
    flat = [word for pair in args.items() for word in pair]
    result = cli(*BASE, *flat, "--out", tmp_path)
    assert_usage_error(result, f"{option}: ", "is not a positive finite number", "write e.g.")


@pytest.mark.parametrize(("args", "fragments"), [
    (("--tokens", "lots"), ("--tokens: cannot read 'lots'", "15T")),
    (("--tokens", "1T", "--deadline", "30d"), ("--deadline: needs a price per GPU-hour for "
                                               "dgx-h100",)),
    (("--tokens", "1T", "--price", "dgx-h10=2"), ("--price: dgx-h10 is not a cluster of the "
                                                  "plan (dgx-h100)",)),
    (("--tokens", "1T", "--verify-sizes", "0,8"), ("--verify-sizes: '0' is not a positive",)),
])
def test_other_bad_input_names_the_option_and_the_fix(args: tuple[str, ...],
                                                      fragments: tuple[str, ...],
                                                      tmp_path: Path) -> None:
    assert_usage_error(cli(*BASE, *args, "--out", tmp_path), *fragments)


def test_a_bad_size_list_names_the_cluster(tmp_path: Path) -> None:
    result = cli("plan", "-m", "llama3-8b", "-c", "dgx-h100:8,x", "--tokens", "1T",
                 "--out", tmp_path)
    assert_usage_error(result, "--cluster 'dgx-h100:8,x': 'x' is not a positive whole number")


def test_json_folder_report_and_compare(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    result = cli(*BASE, "--tokens", "300B", "--price", "2.5", "--budget", "$1M", "--out", out,
                 "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["schema"] == "autotune.plan/1" and doc["tokens"] == 3e11
    assert [p["name"] for p in doc["points"]] == ["dgx-h100:1", "dgx-h100:2"]
    assert doc["choices"][0]["constraint"] == "budget"
    assert json.loads((out / "plan.json").read_text())["chosen"] == doc["chosen"]
    for name in ("plan.md", "plan.html", "plan.csv"):
        assert (out / name).is_file()
    (out / "plan.md").unlink()
    regenerated = cli("report", out)
    assert regenerated.code == 0 and (out / "plan.md").is_file(), regenerated.err
    compared = cli("compare", out, "--out", tmp_path / "cmp")
    assert compared.code == 0, compared.err
    assert "plan: " in (tmp_path / "cmp" / "compare.md").read_text()


def test_the_table_marks_uncalibrated_figures(tmp_path: Path) -> None:
    """Oracle: the stored calibrations. A custom GPU without `like:` has none, so its figures
    are marked "uncalibrated", never printed bare; a calibrated preset plans as well."""
    custom = tmp_path / "cluster.yaml"
    custom.write_text("nodes: 1\ngpus_per_node: 8\ngpu: {name: my-gpu, memory_gb: 80, "
                      "peak_tflops: {bf16: 989}, hbm_tb_s: 3.35}\nintra_node_gb_s: 450\n"
                      "inter_node_gb_s: 50\nhost_memory_gb: 2048\npcie_gb_s: 64\n")
    result = cli("plan", "-m", "llama3-8b", "-c", custom, "--tokens", "1T", "--out", tmp_path)
    assert result.code == 0, result.err
    assert "uncalibrated" in result.out
    calibrated = cli(*BASE, "--tokens", "1T", "--out", tmp_path / "h100")
    assert calibrated.code == 0 and "dgx-h100:2" in calibrated.out
