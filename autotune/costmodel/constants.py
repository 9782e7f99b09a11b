"""The physical constants of the memory and step-time models, per GPU type.

Every constant has a physical meaning, a unit, a source, and (when `benchmarks/accuracy.py --fit`
may move it) fit bounds: the physically plausible range, stored as the field's `fit` metadata.
A fitted value on its bound means the model lacks a term. Values live in
`autotune/presets/constants.yaml`; trial measurements may refit them per study.

Sources named below:
- NCCL: NVIDIA/nccl `src/graph/tuning.cc` @ 5067397c2676d5aed50042fc39e5c8ee96eb0027
  (baseLatencies, hwLatencies: the latency model NCCL itself uses to pick algorithms).
- FA2: Dao 2023, "FlashAttention-2", arXiv:2307.08691, §4.1 (50-73 % of A100 peak forward,
  lower backward). FA3: Shah et al. 2024, "FlashAttention-3", arXiv:2407.08608, §4.1 (H100 BF16
  forward up to 740 TFLOP/s, 75 %).
- cuBLAS: NVIDIA "Matrix Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/
  performance/dl-performance-matrix-multiplication): tile and wave quantization make small GEMMs
  reach a fraction of the large-GEMM rate.
- nccl-tests: NVIDIA/nccl-tests `doc/PERFORMANCE.md` (bus bandwidth: the per-link rate a
  collective reaches, comparable with the link's hardware bandwidth).
- Loss-Free Balancing: Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for
  Mixture-of-Experts", arXiv:2408.15664, §4 (MaxVio: the most loaded expert's excess over the
  mean load, measured per training batch, with an auxiliary loss and with expert biases).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any
from typing import cast

import yaml
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from autotune.resources import resource_dir
from autotune.specs import GPUSpec


def _fitted(default: float, low: float, high: float, **kwargs: Any) -> Any:
    """A constant the fit may move within [low, high] (its physical range)."""
    extra: dict[str, Any] = {"fit": (low, high)}
    return Field(default=default, json_schema_extra=extra, **kwargs)


class Constants(BaseModel):
    """Constants of one accelerator type (meaning, unit, source, fit bounds: each docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    # --- compute ----------------------------------------------------------------------------
    gemm_efficiency: float = _fitted(0.8, 0.5, 0.95, gt=0, le=1)
    """Fraction of the dense 16-bit peak that large GEMMs reach. Unit: dimensionless. Source:
    cuBLAS (large square BF16 GEMMs reach 75-90 % of peak on A100/H100). Fit bounds 0.5-0.95."""
    gemm_half_size: float = _fitted(512.0, 64.0, 4096.0, gt=0)
    """Cube root of M·N·K at which a GEMM reaches half of `gemm_efficiency`: tile and wave
    quantization of small GEMMs. Unit: elements. Source: cuBLAS. Fit bounds 64-4096."""
    fp8_gemm_efficiency: float = _fitted(0.65, 0.3, 0.95, gt=0, le=1)
    """Fraction of the dense FP8 peak that large FP8 GEMMs reach. Unit: dimensionless. Source:
    Transformer Engine FP8 GEMMs on H100 run about 1.7x their BF16 rate (the FP8 peak is 2x, and
    per-tensor scaling kernels reach a lower fraction of it; `FP8_GEMM_SPEEDUP`, which sets it
    where no fp8 rows identify it: `fp8_from_sixteen`). Fit bounds 0.3-0.95 (fp8 rows)."""
    attention_efficiency: float = _fitted(0.5, 0.1, 0.8, gt=0, le=1)
    """Fraction of the dense 16-bit peak that fused (flash) attention reaches, forward plus
    backward, in model FLOPs (the backward's recompute of the scores is inside it); it runs at
    16 bits even in FP8 training. Unit: dimensionless. Source: FA2 (50-73 % forward on A100,
    backward slower; on H100 FA2 reaches ~35 % forward, FA3's baseline), FA3 (up to 75 %
    forward on H100). Fit bounds 0.1-0.8: LLM Foundry's `attn_impl: triton` (its Triton
    FlashAttention kernel, on the triton-pre-mlir fork) reaches about 0.16 on H100
    (its benchmark table, MPT-3B on 8 H100 in bf16: 512 to 8,192 tokens adds 24.6 µs per
    token for 3.78 GFLOP of causal attention)."""
    flash_attention_efficiency: float = Field(default=0.3, gt=0, le=1)
    """`attention_efficiency` of FlashAttention-2 (the flash-attn package) where Transformer
    Engine is told to run it instead of its fused backend (`TrainSpec.attention_backend`
    flash). Unit: dimensionless. Source: FA2 on A100 (~60 % forward, ~45 % backward: 0.45);
    FA3's FA2 baseline on H100 (~35 % forward, ~30 % backward: 0.3; FA2 has no Hopper
    kernels). Not fitted: no (GPU, stack) has enough rows that state this backend."""
    elementwise_passes: float = _fitted(1.0, 0.5, 4.0, ge=0)
    """Memory-bound traffic relative to the counted minimum: 1 = every tensor a norm,
    activation, rotary, residual/dropout, cast or loss kernel touches is read or written once
    per pass (`autotune.costmodel.kernels.elementwise_bytes`); more when kernels are not
    fused. Unit: dimensionless. Source: the kernels' tensor sizes. Fit bounds 0.5-4."""
    eager_efficiency: float = Field(default=0.5, gt=0, le=1)
    """Fraction of the streaming bandwidth (`hbm_tb_s` · `hbm_efficiency`) that a layer's
    unfused eager elementwise ops reach (`autotune.costmodel.eager`: CPU workers only): their
    reductions, transcendentals and broadcasts run slower than a plain add. Unit:
    dimensionless. Source: `autotune calibrate`'s eager microbenchmark (the workload's norm,
    rotary, SwiGLU and residual ops, forward and backward, at several sizes). Not fitted by
    the step-time fit."""
    eager_op_s: float = Field(default=1e-5, ge=0)
    """Dispatch cost of one eager elementwise op (Python, autograd and ATen overhead before
    the kernel moves a byte), CPU workers (`autotune.costmodel.eager`), and each rank's copy
    of a list collective under DeepSpeed v0.3-v0.5.5's ZeRO-3 (`zero3.list_copies_s`). Unit:
    s. Source: the eager microbenchmark's intercept (10-12 µs per op on one core of a shared
    2-core cloud VM). Not fitted by the step-time fit."""
    first_touch_s_per_gb: float = Field(default=0.5, ge=0)
    """Seconds per GB a CPU worker spends the first time it writes a freshly mapped tensor
    (page faults and the kernel's zeroing of each page): glibc's malloc maps every request
    of at least its largest mmap threshold (`DEFAULT_MMAP_THRESHOLD_MAX`, 32 MiB on 64-bit)
    anew and unmaps it on free, so such a tensor pays this at every use
    (`autotune.costmodel.eager.first_touch_s`). CPU workers only. Unit: s/GB. Source:
    `autotune calibrate`'s first-touch microbenchmark (0.55 ms per MiB on one core of a 2-core
    cloud VM). Not fitted by the step-time fit."""
    hbm_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Fraction of the HBM datasheet bandwidth that streaming kernels reach. Unit:
    dimensionless. Source: copy kernels reach 80-90 % on A100/H100 (CUDA `bandwidthTest`).
    Not fitted."""

    # --- communication ----------------------------------------------------------------------
    comm_efficiency: float = _fitted(0.8, 0.5, 0.95, gt=0, le=1)
    """NCCL bus bandwidth of large collectives across nodes as a fraction of the NICs'
    bandwidth. Unit: dimensionless. Source: nccl-tests (busbw / link rate, 80-90 % on
    InfiniBand). Fit bounds 0.5-0.95 (trial refits; the published runs do not identify it)."""
    nvlink_efficiency: float = Field(default=0.8, gt=0, le=1)
    """NCCL bus bandwidth inside a node as a fraction of the NVLink bandwidth per GPU. Unit:
    dimensionless. Source: nccl-tests on 8-GPU NVSwitch nodes (~80 %). Not fitted."""
    latency_base_s: float = Field(default=8.4e-6, ge=0)
    """Fixed latency of one NCCL collective. Unit: s. Source: NCCL baseLatencies (Ring and
    Tree, Simple protocol, 8.4 µs). Not fitted."""
    latency_intra_s: float = Field(default=3.4e-6, ge=0)
    """Latency of one ring step over NVLink. Unit: s. Source: NCCL
    hwLatencies[NVLINK][Ring][Simple] (3.4 µs). Not fitted."""
    latency_inter_s: float = Field(default=1.4e-5, ge=0)
    """Latency of one ring or tree step across the network. Unit: s. Source: NCCL
    hwLatencies[NET][Ring][Simple] (14 µs). Not fitted."""
    all_gather_bandwidth: float = Field(default=1.0, gt=0)
    """Bus bandwidth of an all-gather relative to an all-reduce's (`collectives.collective_s`).
    Unit: dimensionless. Source: nccl-tests (NCCL's ring ops reach one bus bandwidth: 1);
    gloo on CPU workers: `autotune calibrate` fits it (its all-gather into one tensor copies
    through a temporary tensor per rank). Not fitted by the step-time fit."""
    reduce_scatter_bandwidth: float = Field(default=1.0, gt=0)
    """`all_gather_bandwidth` of a reduce-scatter (gloo: a full-buffer reduction, then the
    shards). Unit: dimensionless. Source: as `all_gather_bandwidth`."""
    all_to_all_bandwidth: float = Field(default=1.0, gt=0)
    """`all_gather_bandwidth` of an all-to-all's and a point-to-point send's bytes
    (`collectives.exchange_s`, `send_s`). Unit: dimensionless. Source: as
    `all_gather_bandwidth`."""
    overlap_fraction: float = _fitted(0.9, 0.5, 1.0, ge=0, le=1)
    """Fraction of the communication running under compute that costs nothing; the rest slows
    the compute it overlaps (NCCL kernels take SMs and HBM bandwidth). Unit: dimensionless.
    Source: NCCL runs 8-16 channels (one SM each) of the GPU's 108-132 SMs while it overlaps,
    about a tenth. Fit bounds 0.5-1 (trial refits; the published runs do not identify it)."""
    grouped_gemm_efficiency: float = _fitted(1.0, 0.2, 1.0, gt=0, le=1)
    """Rate of a routed-expert grouped GEMM relative to one GEMM of the same per-expert shape
    (`gemm_efficiency` at that size): the grouped kernels (Transformer Engine's GroupedLinear,
    one cuBLAS GEMM per local expert on a few streams, with per-expert FP8 casts and scales;
    the grouped_gemm / CUTLASS grouped kernels in 16 bits) lose tile occupancy across experts
    and host launch time per expert. Unit: dimensionless (1 = as fast as one GEMM). Source:
    fitted on the 16-bit MoE rows of data/published_runs.csv (`benchmarks/accuracy.py`).
    Fit bounds 0.2-1."""
    fp8_grouped_gemm_efficiency: float = _fitted(1.0, 0.2, 1.0, gt=0, le=1)
    """`grouped_gemm_efficiency` of FP8 training's routed experts (relative to one FP8 GEMM of
    the same shape): Transformer Engine quantizes each expert's inputs and gradients in its own
    kernels (amax, scale, cast and transpose per expert) around the per-expert FP8 GEMMs. Unit:
    dimensionless. Source: fitted on the fp8 MoE rows of data/published_runs.csv.
    Fit bounds 0.2-1."""
    moe_load_imbalance: float = Field(default=1.1, ge=1, le=4)
    """Tokens the most loaded expert-parallel rank receives over the mean (dropless routing):
    it scales that rank's expert GEMMs, its all-to-all bytes and its routed activations, and
    the whole expert-parallel group waits for it; not charged under forced balancing
    (`TrainSpec.moe_force_balance`). Unit: dimensionless (1 = perfect balance). Source:
    Loss-Free Balancing (the most loaded expert of a batch stays well above the mean with an
    auxiliary loss, closer to it with expert biases); a rank holds E/ep experts, which averages
    the per-expert excess down, so the default charges the slowest rank 10 %. Not fitted (no
    published run measures it: every MoE row of data/published_runs.csv force-balances its
    routing). On CPU workers it is a micro-batch of one sequence's, for the router at its
    initialisation (`kernels.load_imbalance`), and `autotune calibrate` measures it."""
    cpu_adam_params_per_s: float = Field(default=1.0e9, gt=0)
    """Parameters one node's CPUs update per second with DeepSpeedCPUAdam (offload). Unit:
    1/s. Source: ZeRO-Offload (Ren et al. 2021: ~1e9 parameters/s per node). Not fitted."""

    # --- memory -----------------------------------------------------------------------------
    runtime_memory_gib: float = Field(default=1.5, ge=0)
    """CUDA context, NCCL buffers and library workspaces per GPU, outside
    max_memory_allocated. Unit: GiB. Source: CUDA context ~0.5 GiB plus NCCL's 4 MiB buffers
    per channel and peer of each communicator. Refitted from GPU measurements."""
    activation_memory_factor: float = Field(default=1.0, gt=0)
    """Multiplier on the counted activations (allocator rounding and extra buffers); 1 =
    Korthikanti et al. 2022 exactly. Unit: dimensionless. Source: Megatron-LM's
    theoretical_memory_usage. Refitted from GPU measurements."""
    memory_margin: float = Field(default=0.05, ge=0, lt=1)
    """Fraction of device memory left free for allocator fragmentation when testing
    `memory_fits`. Unit: dimensionless. Source: PyTorch's caching allocator keeps a few percent
    reserved but unallocated. Not fitted."""


FIT_BOUNDS: dict[str, tuple[float, float]] = {
    name: cast("tuple[float, float]", field.json_schema_extra["fit"])
    for name, field in Constants.model_fields.items()
    if isinstance(field.json_schema_extra, dict) and "fit" in field.json_schema_extra
}
"""Constants the fit may move, with their physical bounds."""

FP8_GEMM_SPEEDUP = 1.7
"""Rate of a Transformer Engine FP8 GEMM over the 16-bit GEMM of the same shape on H100 (the
`fp8_gemm_efficiency` source). Unit: dimensionless."""


def fp8_from_sixteen(k: Constants, peak_tflops: Mapping[str, float]) -> Constants:
    """`k` with `fp8_gemm_efficiency` at `FP8_GEMM_SPEEDUP` times its 16-bit GEMM rate, as a
    fraction of the FP8 peak, within its fit bounds: where no fp8 run identifies it, FP8 GEMMs
    follow the 16-bit ones the runs did measure. `k` itself on a GPU without an FP8 peak."""
    if "fp8" not in peak_tflops or "bf16" not in peak_tflops:
        return k
    low, high = FIT_BOUNDS["fp8_gemm_efficiency"]
    rate = FP8_GEMM_SPEEDUP * k.gemm_efficiency * peak_tflops["bf16"] / peak_tflops["fp8"]
    return k.model_copy(update={"fp8_gemm_efficiency": min(max(rate, low), high)})


def table_path() -> Path:
    """The shipped calibration table, `autotune/presets/constants.yaml`."""
    return resource_dir("presets") / "constants.yaml"


@cache
def _table() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(table_path().read_text()) or {}


_TOP_KEY = re.compile(r"^([^\s#][^:]*):")


def write_table(table: Mapping[str, Any], path: Path) -> None:
    """Write a calibration table as YAML, keeping the comments `path` already has: each run of
    comment lines above a top-level key stays above that key, and those after the last key stay
    at the end (nested comments are not kept; the shipped table has none)."""
    above: dict[str, list[str]] = {}
    pending: list[str] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        key = _TOP_KEY.match(line)
        if line.startswith("#"):
            pending.append(line)
        elif key:
            above[yaml.safe_load(key.group(1))], pending = pending, []
    blocks = ["\n".join([*above.get(key, []), yaml.safe_dump({key: value}, sort_keys=False)
                         .rstrip("\n")]) for key, value in table.items()]
    path.write_text("\n".join([*blocks, *pending]) + "\n")


UNCERTAINTY_KEYS = ("intervals", "intervals_from", "between_layouts")
"""The keys of a stack's calibration that describe its error (`autotune.costmodel.uncertainty`),
not constants."""


def calibration(gpu: str, stack: str) -> dict[str, Any] | None:
    """The stored calibration of one (GPU preset, stack): its fitted constants and, under
    `intervals`, the cross-validated residuals per regime (`intervals_from`: the GPU preset they
    were measured on, where it is another of the same die), under `between_layouts` the
    largest error between two runs of one setup; None when that pair was never fitted."""
    entry = _table().get(gpu, {}).get("stacks", {}).get(stack)
    return dict(entry) if isinstance(entry, dict) else None


def calibrated_gpu(gpu: GPUSpec) -> str | None:
    """The GPU preset whose calibration applies: the preset itself, or the one a custom GPU
    names with `like`; None for a custom GPU without `like`."""
    name = gpu.like or gpu.name
    return name if name in _table() and name != "default" else None


def constants_for(gpu: GPUSpec, stack: str | None = None) -> Constants:
    """The calibrated constants of a GPU preset (or the preset a custom GPU is `like`) run by
    `stack`: the GPU's own values, overlaid by that stack's fit where one exists; else the
    defaults; a calibration file's constants (`GPUSpec.constants`, see
    `autotune.calibration.file`) over all of them."""
    table = _table()
    name = calibrated_gpu(gpu)
    if name is None:
        return Constants(**{**table.get("default", {}), **gpu.constants})
    values = {key: value for key, value in table[name].items() if key != "stacks"}
    fitted = calibration(name, stack) if stack else None
    if fitted:
        values |= {key: value for key, value in fitted.items()
                   if key not in UNCERTAINTY_KEYS}
    return Constants(**{**values, **gpu.constants})
