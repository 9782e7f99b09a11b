"""Where it trains: `GPUSpec` and `ClusterSpec` (nodes, links, hosts)."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import Field
from pydantic import StrictBool
from pydantic import model_validator

from autotune.specs.types import FROZEN
from autotune.specs.types import DevicesPerNode
from autotune.specs.types import FiniteFloat
from autotune.specs.types import GpuHourPrice
from autotune.specs.types import GpuMemoryGiB
from autotune.specs.types import HostMemoryGB
from autotune.specs.types import LinkGBs
from autotune.specs.types import MemoryTBs
from autotune.specs.types import NodeCount
from autotune.specs.types import Precision
from autotune.specs.types import TFlops
from autotune.units import GIB


class GPUSpec(BaseModel):
    """One accelerator: memory, dense peak throughput per precision, memory bandwidth."""

    model_config = FROZEN

    name: str = "custom-gpu"
    """Preset name or free text."""
    like: str | None = None
    """A GPU preset whose calibrated constants this (custom) GPU inherits, e.g. h100-sxm-80gb
    for an H100 with other clocks or memory; without it a custom GPU is uncalibrated."""
    memory_gb: GpuMemoryGiB
    """Device memory as the datasheet states it ("80GB"); vendors' figures match what CUDA
    reports in GiB (A100 80GB: 81,920 MiB; H200 141GB: 143,771 MiB), so it is read as GiB."""
    peak_tflops: dict[Precision, TFlops] = Field(min_length=1)
    """Dense (no sparsity) peak in TFLOP/s per precision; a missing key means unsupported."""
    hbm_tb_s: MemoryTBs
    """Device memory bandwidth in TB/s."""
    constants: dict[str, FiniteFloat] = Field(default_factory=dict)
    """Cost-model constants measured on this device, over the preset's
    (`autotune.costmodel.constants`): set by a calibration file, empty otherwise."""
    calibration: str = ""
    """The calibration file these figures and constants come from ('' = presets only)."""

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (memory_gb read as GiB, as CUDA reports it)."""
        return self.memory_gb * GIB


PLAUSIBLE_GB_S = {"intra_node_gb_s": (900.0, "NVLink 5, 900 GB/s per GPU and direction"),
                  "inter_node_gb_s": (100.0, "an 800 Gb/s NIC per GPU, 100 GB/s"),
                  "pcie_gb_s": (128.0, "PCIe 6.0 x16, 128 GB/s per direction")}
"""The fastest link of each kind shipping today (per GPU and direction): a cluster claiming over
twice as much is refused unless `unchecked_links` is set (a Gb/s figure read as GB/s is the
usual slip: 400 Gb/s is 50 GB/s)."""


class ClusterSpec(BaseModel):
    """Nodes of identical GPUs, their links and their hosts."""

    model_config = FROZEN

    name: str = "custom"
    """Display name (preset:nodes, a file name, or local)."""
    nodes: NodeCount
    """Number of nodes."""
    gpus_per_node: DevicesPerNode
    """Accelerators (or CPU worker processes, for `local` without GPUs) per node."""
    gpu: GPUSpec
    """The accelerator."""
    intra_node_gb_s: LinkGBs
    """Per-GPU, per-direction bandwidth inside a node (NVLink), GB/s."""
    inter_node_gb_s: LinkGBs
    """Per-GPU, per-direction network bandwidth between nodes (InfiniBand), GB/s."""
    host_memory_gb: HostMemoryGB
    """CPU memory per node, GB."""
    pcie_gb_s: LinkGBs
    """Per-GPU host link bandwidth per direction, GB/s."""
    cpu_processes: StrictBool = False
    """True when the 'GPUs' are CPU processes on gloo (the `local` cluster without CUDA)."""
    price_per_gpu_hour: GpuHourPrice | None = None
    """What one GPU-hour of this cluster costs, in the currency of the plan (`autotune plan`
    multiplies GPU-hours by it); None: not known (give `--price`)."""
    unchecked_links: StrictBool = False
    """Accept link speeds over twice the fastest shipping link (`PLAUSIBLE_GB_S`)."""

    @model_validator(mode="after")
    def _check_links(self) -> ClusterSpec:
        if self.unchecked_links:
            return self
        for field, (fastest, what) in PLAUSIBLE_GB_S.items():
            value = getattr(self, field)
            if value > 2 * fastest:
                raise ValueError(
                    f"{field} {value:g} GB/s per GPU and direction is over twice {what}; "
                    f"give GB/s, not Gb/s ({value:g} Gb/s = {value / 8:g} GB/s), or set "
                    "unchecked_links: true")
        return self

    @property
    def world_size(self) -> int:
        """All accelerators in the cluster."""
        return self.nodes * self.gpus_per_node
