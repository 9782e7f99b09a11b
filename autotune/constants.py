"""The few physical constants of the memory and step-time models, per GPU type.

Values live in `autotune/presets/constants.yaml`; `benchmarks/accuracy.py --fit` refits the
throughput constants against published runs, and trial measurements refit them per study.
"""

from __future__ import annotations

from functools import cache

import yaml
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from autotune.resources import resource_dir
from autotune.specs import GPUSpec


class Constants(BaseModel):
    """Calibrated constants of one accelerator type (units in the names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    gemm_efficiency: float = Field(default=0.75, gt=0, le=1)
    """Fraction of dense peak that large matrix multiplies reach."""
    gemm_half_size: float = Field(default=1024.0, gt=0)
    """Cube root of M·N·K (elements) at which a GEMM reaches half of `gemm_efficiency`."""
    elementwise_passes: float = Field(default=3.0, ge=0)
    """Times the stored activations are read or written by memory-bound kernels (fwd + bwd)."""
    hbm_efficiency: float = Field(default=0.7, gt=0, le=1)
    """Fraction of HBM bandwidth that memory-bound kernels reach."""
    comm_efficiency: float = Field(default=0.75, gt=0, le=1)
    """Fraction of link bandwidth that NCCL collectives reach (bus bandwidth / link bandwidth)."""
    latency_intra_s: float = Field(default=5e-6, ge=0)
    """Per-hop latency inside a node, seconds."""
    latency_inter_s: float = Field(default=1e-5, ge=0)
    """Per-hop latency between nodes, seconds."""
    overlap_fraction: float = Field(default=0.8, ge=0, le=1)
    """Fraction of the overlapping compute that hides data-parallel / ZeRO communication."""
    cpu_adam_params_per_s: float = Field(default=1.0e9, gt=0)
    """Parameters per second one node's CPUs update with DeepSpeedCPUAdam (offload)."""
    runtime_memory_gib: float = Field(default=1.5, ge=0)
    """CUDA context, NCCL and library workspaces per GPU, GiB (not in max_memory_allocated)."""
    activation_memory_factor: float = Field(default=1.0, gt=0)
    """Multiplier on the Korthikanti activation formula (allocator rounding, extra buffers)."""
    memory_margin: float = Field(default=0.05, ge=0, lt=1)
    """Fraction of device memory left free for fragmentation when testing `memory_fits`."""


@cache
def _table() -> dict[str, dict]:
    path = resource_dir("presets") / "constants.yaml"
    return yaml.safe_load(path.read_text()) or {}


def constants_for(gpu: GPUSpec) -> Constants:
    """The calibrated constants of a GPU preset, else the defaults."""
    return Constants(**_table().get(gpu.name, _table().get("default", {})))
