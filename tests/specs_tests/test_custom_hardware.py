"""Custom hardware: implausible link speeds are refused, `like` inherits a preset's calibration,
and a custom GPU without it is uncalibrated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.exceptions import AutotuneError
from autotune.specs.inputs import load_cluster

H200 = {"memory_gb": 141, "peak_tflops": {"bf16": 989.4, "fp8": 1978.9}, "hbm_tb_s": 4.8}


def cluster_file(tmp_path: Path, **fields: object) -> str:
    """A two-node H200-like cluster YAML with `fields` overriding the defaults."""
    data = {"nodes": 2, "gpus_per_node": 8, "gpu": dict(H200), "intra_node_gb_s": 450,
            "inter_node_gb_s": 50, "host_memory_gb": 2048, "pcie_gb_s": 64} | fields
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_gbit_figure_read_as_gbyte_is_refused(tmp_path: Path) -> None:
    """400 'GB/s' per GPU of network is 4x an 800 Gb/s NIC (100 GB/s): refused in one line
    naming the field, the value and both fixes; accepted with unchecked_links."""
    with pytest.raises(AutotuneError) as error:
        load_cluster(cluster_file(tmp_path, inter_node_gb_s=400))
    message = str(error.value)
    assert "inter_node_gb_s 400 GB/s" in message and "\n" not in message
    assert "400 Gb/s = 50 GB/s" in message and "unchecked_links" in message
    ok = load_cluster(cluster_file(tmp_path, inter_node_gb_s=400, unchecked_links=True))
    assert ok.inter_node_gb_s == 400


@pytest.mark.parametrize(("field", "value"), [("intra_node_gb_s", 1801), ("pcie_gb_s", 257)])
def test_other_links_over_twice_the_fastest(tmp_path: Path, field: str, value: float) -> None:
    """NVLink 5 is 900 GB/s per direction, PCIe 6.0 x16 128 GB/s: just over twice is refused,
    twice is not."""
    with pytest.raises(AutotuneError, match=field):
        load_cluster(cluster_file(tmp_path, **{field: value}))
    load_cluster(cluster_file(tmp_path, **{field: value - 1}))


def test_like_inherits_and_unknown_like_is_refused(tmp_path: Path) -> None:
    """A custom GPU `like: h200-sxm-141gb` gets that preset's constants for each stack; without
    `like` it gets the defaults; an unknown preset name is refused."""
    preset = load_cluster("hgx-h200:2").gpu
    like = load_cluster(cluster_file(tmp_path, gpu={**H200, "like": "h200-sxm-141gb"})).gpu
    plain = load_cluster(cluster_file(tmp_path)).gpu
    for stack in ("megatron-core", "pytorch"):
        assert constants_for(like, stack) == constants_for(preset, stack)
    assert constants_for(plain, "megatron-core") == Constants()
    with pytest.raises(AutotuneError, match="like: 'h200' is not a GPU preset"):
        load_cluster(cluster_file(tmp_path, gpu={**H200, "like": "h200"}))


def test_cli_exit_code_is_2(tmp_path: Path) -> None:
    """The CLI turns the refusal into one line and exit 2 (a real subprocess)."""
    done = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "estimate", "-m", "llama3-8b", "-c",
         cluster_file(tmp_path, inter_node_gb_s=400), "-l", "tp=1,zero=1"],
        capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "inter_node_gb_s" in done.stderr
