"""`--cluster local` on a GPU machine: the device matched to its preset, memory in GiB, links
from `nvidia-smi topo -m`.

No GPU can run here, so torch.cuda's device queries are monkeypatched with the figures CUDA
reports on the real devices (name and total_memory as `torch.cuda.get_device_properties`
returns them) and `nvidia-smi topo -m` with its documented matrix format.
"""

from __future__ import annotations

import json
import types

import pytest
import torch
import yaml
from helpers_cli import assert_usage_error
from helpers_cli import cli

from autotune.costmodel.constants import constants_for
from autotune.resources import resource_dir
from autotune.specs import inputs
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import nvlinks

MIB = 2**20
DEVICES = {
    # name, total_memory as CUDA reports it (nvidia-smi's "MiB" column)
    "h100": ("NVIDIA H100 80GB HBM3", 81_559 * MIB),
    "h200": ("NVIDIA H200", 143_771 * MIB),
    "a100": ("NVIDIA A100-SXM4-80GB", 81_920 * MIB),
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 40_960 * MIB),
    "h100-pcie": ("NVIDIA H100 PCIe", 81_559 * MIB),
    "l4": ("NVIDIA L4", 23_034 * MIB),
}
DGX_H100_TOPOLOGY = "\n".join(
    ["\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity"]
    + [f"GPU{i}\t" + "\t".join("X" if j == i else "NV18" for j in range(8))
       + ("\t0-55\t0" if i < 4 else "\t56-111\t1") for i in range(8)]
    + ["", "Legend:", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"]
)
"""`nvidia-smi topo -m` of a DGX H100: every pair of GPUs through NVSwitch on 18 NVLinks."""


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Pretend this machine has `count` CUDA devices of a kind (torch.cuda monkeypatched)."""

    def install(kind: str, count: int = 8, topology: str | None = DGX_H100_TOPOLOGY) -> None:
        name, memory = DEVICES[kind]
        props = types.SimpleNamespace(name=name, total_memory=memory)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
        monkeypatch.setattr(inputs, "_nvidia_smi_topology", lambda: topology)

    return install


@pytest.mark.parametrize(
    ("kind", "preset"),
    [("h100", "h100-sxm-80gb"), ("h200", "h200-sxm-141gb"), ("a100", "a100-sxm-80gb")],
)
def test_gpu_matched_to_its_preset_with_memory_in_gib(gpus, kind: str, preset: str) -> None:
    """Oracle: the GPU datasheets (presets/gpus.yaml) and CUDA's byte counts: an H100 SXM
    reports 81,559 MiB = 79.65 GiB (the old reading, 81,559·2**20/1e9 = 85.5 "GB", was 7.4 %
    too much); the preset's name keys the calibrated constants (presets/constants.yaml)."""
    gpus(kind)
    cluster = load_cluster("local")
    assert cluster.gpu.name == preset and not cluster.cpu_processes
    assert cluster.gpu.memory_gb == pytest.approx(DEVICES[kind][1] / 2**30)
    assert cluster.gpu.memory_bytes == DEVICES[kind][1]
    entry = yaml.safe_load((resource_dir("presets") / "constants.yaml").read_text())[preset]
    calibrated = {name: value for name, value in entry.items() if name != "stacks"}
    k = constants_for(cluster.gpu)
    assert {name: getattr(k, name) for name in calibrated} == calibrated
    peaks = yaml.safe_load((resource_dir("presets") / "gpus.yaml").read_text())[preset]
    assert cluster.gpu.peak_tflops == peaks["peak_tflops"]


@pytest.mark.parametrize("kind", ["a100-40gb", "h100-pcie", "l4"])
def test_unknown_gpu_is_refused(gpus, kind: str) -> None:
    """Oracle: no preset has an A100 of 40 GiB, a PCIe H100 (lower clocks and peaks than SXM)
    or an L4; any of them used to get A100 peaks silently."""
    gpus(kind)
    result = cli("space", "-m", "llama3-8b", "-c", "local")
    assert_usage_error(result, "--cluster local", DEVICES[kind][0], "matches no preset",
                       "--cluster FILE")


def test_links_from_nvidia_smi_topology(gpus) -> None:
    """Oracle: the DGX H100 datasheet's 900 GB/s of NVLink per GPU both ways = 450 GB/s each
    way = 18 links × 25 GB/s, the dgx-h100 preset's intra_node_gb_s."""
    gpus("h100")
    cluster = load_cluster("local")
    assert cluster.intra_node_gb_s == 18 * 25 == load_cluster("dgx-h100:1").intra_node_gb_s
    assert cluster.gpus_per_node == 8 and cluster.world_size == 8


def test_pcie_pair_and_missing_nvidia_smi(gpus) -> None:
    """Oracle: a pair that shows PIX talks over PCIe (the preset's 64 GB/s PCIe Gen5 x16); with
    no nvidia-smi the cited node preset stands (dgx-h100: 450 GB/s)."""
    pcie = DGX_H100_TOPOLOGY.replace("GPU1\tNV18", "GPU1\tPIX", 1)
    gpus("h100", topology=pcie)
    assert load_cluster("local").intra_node_gb_s == 64
    gpus("h100", topology=None)
    assert load_cluster("local").intra_node_gb_s == 450


def test_nvlinks_reads_the_fewest_links_between_the_gpus_used() -> None:
    """Oracle: the matrix itself: GPU0-GPU1 have 12 links and the rest 18, so two GPUs see 12
    and a matrix without GPU rows cannot be read."""
    matrix = DGX_H100_TOPOLOGY.replace("GPU0\tX\tNV18", "GPU0\tX\tNV12")
    assert nvlinks(matrix, 2) == 12 and nvlinks(DGX_H100_TOPOLOGY, 4) == 18
    assert nvlinks("GPU0\tX", 2) is None and nvlinks("no matrix", 2) is None


def test_more_processes_than_gpus_is_refused(gpus) -> None:
    """Oracle: 9 worker processes cannot each own one of 8 GPUs."""
    gpus("h100")
    assert_usage_error(cli("space", "-m", "llama3-8b", "-c", "local", "--processes", "9"),
                       "--processes: 9 exceeds the 8 GPUs")


def test_estimate_on_local_gpus_equals_the_preset(gpus) -> None:
    """Oracle: the dgx-h100:1 preset: 8 H100s with the same peaks, links and calibrated
    constants predict the same step time and memory for one layout."""
    gpus("h100")
    args = ("-m", "llama3-8b", "-l", "tp=2,zero=1,recompute=selective", "--json")
    local = cli("estimate", "-c", "local", *args)
    preset = cli("estimate", "-c", "dgx-h100:1", *args)
    assert local.code == preset.code == 0, local.err
    local_data, preset_data = json.loads(local.out), json.loads(preset.out)
    assert local_data["step_time_s"] == pytest.approx(preset_data["step_time_s"])
    assert local_data["peak_memory_bytes"] == pytest.approx(preset_data["peak_memory_bytes"])
