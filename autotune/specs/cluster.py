"""Where it trains: `GPUSpec` and `ClusterSpec` (nodes, links, hosts)."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import Field
from pydantic import StrictBool

from autotune.specs.types import FROZEN
from autotune.specs.types import DevicesPerNode
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
    memory_gb: GpuMemoryGiB
    """Device memory as the datasheet states it ("80GB"); vendors' figures match what CUDA
    reports in GiB (A100 80GB: 81,920 MiB; H200 141GB: 143,771 MiB), so it is read as GiB."""
    peak_tflops: dict[Precision, TFlops] = Field(min_length=1)
    """Dense (no sparsity) peak in TFLOP/s per precision; a missing key means unsupported."""
    hbm_tb_s: MemoryTBs
    """Device memory bandwidth in TB/s."""

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (memory_gb read as GiB, as CUDA reports it)."""
        return self.memory_gb * GIB


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

    @property
    def world_size(self) -> int:
        """All accelerators in the cluster."""
        return self.nodes * self.gpus_per_node
