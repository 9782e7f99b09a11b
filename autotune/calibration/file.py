"""The calibration file: what `autotune calibrate` measured on a cluster and the constants it fit.

One YAML file holds the devices and software it ran on, the date, every measured point, the
fitted constants with their residuals, node screening, and what it applies to: the GPU type and
the software stack (torch, the collective backend and its version, DeepSpeed, megatron-core).
`apply_calibration` puts it into a problem (`GPUSpec.constants`, the figures the constants are
relative to, the measured link figures), after refusing, in one line, a file made on another GPU
type or software stack unless told to ignore the mismatch.

Example:
    >>> from autotune.calibration.file import apply_calibration, load_calibration
    >>> # cfg = apply_calibration(cfg, load_calibration("calibration.yaml"), "calibration.yaml")
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel
from pydantic import Field
from pydantic import ValidationError
from pydantic import field_validator

from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.specs import AutotuneConfig
from autotune.specs import GPUSpec
from autotune.specs.inputs import read_structured
from autotune.specs.inputs import validation_message
from autotune.specs.types import FROZEN

FORMAT: Literal[1] = 1
"""Version of the file layout."""
PointKind = Literal["gemm", "attention", "elementwise", "eager", "touch", "copy", "collective",
                    "send", "step", "screen"]


class Software(BaseModel):
    """The software a calibration measured: versions as the packages report them."""

    model_config = FROZEN

    python: str = ""
    """Python version."""
    torch: str = ""
    """torch version (its local tag included, e.g. 2.13.0+cpu)."""
    backend: str = ""
    """torch.distributed backend and, for NCCL, its version: `gloo` or `nccl 2.21.5`."""
    cuda: str | None = None
    """CUDA version torch was built with (None on CPU)."""
    deepspeed: str | None = None
    """DeepSpeed version, if installed."""
    megatron_core: str | None = None
    """megatron-core version, if installed."""


class Device(BaseModel):
    """One worker of the calibration run: its rank, host and device."""

    model_config = FROZEN

    rank: int
    """Global rank of the worker process."""
    host: str
    """Host name of the node it ran on."""
    device: str
    """Device name (CUDA's name, or `cpu`) and, on CPU, its torch threads."""
    memory_gib: float = 0.0
    """Device memory as CUDA reports it, GiB (0 on CPU)."""


class Point(BaseModel):
    """One measured figure: a kernel, a copy, a collective, a send or a training step."""

    model_config = FROZEN

    kind: PointKind
    """What was measured."""
    op: str
    """The operation: mm (GEMMs, screening), sdpa, add, layer_ops (eager), fill (touch), h2d,
    d2h, all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, or a layout (train
    steps)."""
    dtype: str = ""
    """Element type (bf16, fp16, fp8, fp32)."""
    shape: dict[str, int] = Field(default_factory=dict)
    """Sizes: m, n, k (GEMMs); b, heads, seq, head_dim (attention); bytes (memory, touch, copies,
    collectives: the full buffer as nccl-tests counts it); tokens, bytes, ops (eager: the ops
    dispatched and the bytes they read and write)."""
    ranks: list[int] = Field(default_factory=list)
    """The workers that ran it: one (compute), the group (collective), sender and receiver."""
    seconds: float = Field(gt=0)
    """Median time of one operation. Unit: s."""
    rate: float = Field(ge=0)
    """Achieved rate: FLOP/s (GEMMs, attention), bytes/s (memory, copies), bus bandwidth
    bytes/s (collectives, nccl-tests' convention), tokens/s (steps)."""
    predicted_s: float | None = None
    """The model's time with the fitted constants (its residual is predicted/seconds - 1)."""
    repeats: list[float] | None = None
    """Screening points: the rate of each round (all workers start a round together); `rate`
    is the median of the faster half of them."""


class FittedConstant(BaseModel):
    """One fitted constant: its value, the value it replaced and how well it fits."""

    model_config = FROZEN

    value: float
    """Fitted value (unit: `autotune.costmodel.constants.Constants`)."""
    before: float
    """The preset's (or default) value."""
    points: int = Field(ge=0)
    """Measured points the fit used."""
    median_residual: float = Field(ge=0)
    """Median |predicted/measured - 1| over those points after the fit."""
    max_residual: float = Field(ge=0)
    """Largest |predicted/measured - 1| after the fit."""
    at_bound: str | None = None
    """`lower` or `upper` when the value sits on its physical bound (the model lacks a term)."""
    stderr: float | None = Field(default=None, ge=0)
    """Relative standard error (1σ) of the value: the residual scatter through the fit's
    Jacobian, σ·sqrt(diag((JᵀJ)⁻¹)) in log space; how well these points identify it."""


class WorkerRate(BaseModel):
    """Screening figure of one worker (GEMM) or one link (send/recv between two workers)."""

    model_config = FROZEN

    ranks: list[int]
    """The worker, or the link's sender and receiver."""
    host: str = ""
    """Host of the worker (of the sender, for a link)."""
    rate: float
    """GEMM FLOP/s, or the link's bytes/s."""
    relative: float
    """Rate over the median of its peers."""
    spread: float = Field(default=0.0, ge=0)
    """Relative interquartile range of its repeats (screening rounds): its timing noise."""
    across_nodes: bool = False
    """A link between two nodes (its peers are the other links between nodes)."""

    def variation(self) -> str:
        """" (its rounds vary by X%)" where its rounds' spread is at least 0.5 %, else ""."""
        return f" (its rounds vary by {self.spread:.0%})" if self.spread >= 0.005 else ""


def screening_rate(repeats: Sequence[float]) -> tuple[float, float]:
    """A worker's rate (the median of the faster half of its repeats: interference only slows
    a repeat down) and its spread (the repeats' interquartile range over their median)."""
    ordered = sorted(repeats, reverse=True)
    rate = statistics.median(ordered[: (len(ordered) + 1) // 2])
    q25, q50, q75 = np.percentile(ordered, [25, 50, 75])
    return rate, float((q75 - q25) / q50)


class Screening(BaseModel):
    """Node screening: workers and links more than `margin` below the median of their peers."""

    model_config = FROZEN

    margin: float = Field(gt=0, lt=1)
    """Fraction below the median that marks a worker or link slow."""
    noise: float = Field(default=0.0, ge=0)
    """The workers' timing noise (twice the median of their `spread`s), read as a log-rate
    gap: equal workers can differ by a factor exp(−noise); a worker is named only below
    that factor of its peers and below 1 − `margin` (`noise_bar`)."""
    workers: list[WorkerRate] = Field(default_factory=list)
    """GEMM rate of each worker (the screening GEMM's rounds, `Point.repeats`)."""
    nodes: list[WorkerRate] = Field(default_factory=list)
    """Median worker GEMM rate of each node (several nodes only), against the other nodes."""
    links: list[WorkerRate] = Field(default_factory=list)
    """Bandwidth of each measured link (largest message)."""
    link_noise: float = Field(default=0.0, ge=0)
    """The links' timing noise (twice the median of their `spread`s), read as `noise` is."""

    def noise_bar(self, noise: float) -> float:
        """Relative rate below which a worker or link is named: under 1 − `margin` and under
        exp(−noise). The noise is a spread of rates, so it bounds a ratio, not a difference:
        rounds that vary by 40 % (a host with much steal time) still tell a worker at a fifth
        of its peer's rate, which 1 − 2 × 40 % would not."""
        return min(1 - self.margin, float(np.exp(-noise)))

    def slow(self) -> list[str]:
        """One line per slow node, slow worker (on a node not named) or slow link."""
        lines = []
        bar = self.noise_bar(self.noise)
        slow_nodes = {node.host for node in self.nodes if node.relative < bar}
        for node in self.nodes:
            if node.relative < bar:
                lines.append(
                    f"node {node.host or '?'} (workers {_ranks(node.ranks)}): GEMM "
                    f"{node.rate / 1e12:.3g} TFLOP/s, {1 - node.relative:.0%} below the median "
                    "of the other nodes"
                )
        peers = "its peer" if len(self.workers) == 2 else "the median of its peers"
        for worker in self.workers:
            if worker.relative < bar and worker.host not in slow_nodes:
                lines.append(
                    f"worker {worker.ranks[0]} on {worker.host or '?'}: GEMM "
                    f"{worker.rate / 1e12:.3g} TFLOP/s, {1 - worker.relative:.0%} below "
                    f"{peers}{worker.variation()}"
                )
        for link in self.links:
            if link.relative < self.noise_bar(self.link_noise):
                lines.append(
                    f"link {link.ranks[0]}->{link.ranks[1]} from {link.host or '?'}"
                    f"{' (across nodes)' if link.across_nodes else ''}: {link.rate / 1e9:.3g} "
                    f"GB/s, {1 - link.relative:.0%} below the median of its peers"
                    f"{link.variation()}"
                )
        return lines


def _ranks(ranks: list[int]) -> str:
    """`8-15` for a run of ranks, else the ranks with commas."""
    ordered = sorted(ranks)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


class Calibration(BaseModel):
    """A calibration file (see the module docstring)."""

    model_config = FROZEN

    format: Literal[1] = FORMAT
    """Version of the file layout."""
    created: datetime.datetime
    """When it was measured (UTC)."""
    source: Literal["microbenchmarks", "runs"]
    """Microbenchmarks on the devices, or the user's own measured runs."""
    complete: bool = True
    """False when the run lost a worker: the points so far are kept, nothing is fitted."""
    failure: str = ""
    """Why the run did not complete (the lost worker named)."""
    cluster: str
    """The cluster it was measured on."""
    gpu: GPUSpec
    """The device type it applies to, with the figures its constants are relative to: the
    datasheet's on GPUs, the measured ones for CPU workers (constants and calibration
    fields empty here)."""
    intra_node_gb_s: float | None = None
    """Measured link figure inside a node (CPU workers only; GPUs keep the datasheet's)."""
    inter_node_gb_s: float | None = None
    """Measured link figure between nodes (CPU workers only)."""
    software: Software
    """The software stack it was measured with (and applies to): the workers' (rank 0's)."""
    job_id: str | None = None
    """The Slurm job that ran the workers (`calibrate --runner slurm`); None: this machine."""
    nodes: int = Field(default=1, ge=1)
    """Nodes the workers ran on (distinct hosts)."""
    not_measured: list[str] = Field(default_factory=list)
    """What the run could not measure, e.g. `inter-node links not measured: 1 node` (those
    constants keep the preset's values)."""
    framework: str | None = None
    """The framework whose runs it was fitted to (own runs); None for microbenchmarks."""
    devices: list[Device] = Field(default_factory=list)
    """The workers it ran on."""
    points: list[Point] = Field(default_factory=list)
    """Every measured point."""
    constants: dict[str, FittedConstant] = Field(default_factory=dict)
    """The fitted constants (names of `autotune.costmodel.constants.Constants`)."""
    screening: Screening | None = None
    """Node screening (microbenchmarks)."""
    warnings: list[str] = Field(default_factory=list)
    """What the fit or the screening found worth a look (constants on bounds, slow nodes)."""

    @field_validator("constants")
    @classmethod
    def _known(cls, value: dict[str, FittedConstant]) -> dict[str, FittedConstant]:
        unknown = sorted(set(value) - set(Constants.model_fields))
        if unknown:
            raise ValueError(f"unknown constants {', '.join(unknown)}")
        Constants(**{name: fitted.value for name, fitted in value.items()})  # in range
        return value

    def values(self) -> dict[str, float]:
        """The fitted values by name."""
        return {name: fitted.value for name, fitted in self.constants.items()}

    def write(self, path: Path) -> None:
        """Write as YAML (the folder is created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.model_dump(mode="json", exclude={"gpu": {"constants", "calibration"}})
        for point in data["points"]:  # only screening points have repeats
            if point["repeats"] is None:
                del point["repeats"]
        path.write_text(yaml.safe_dump(data, sort_keys=False, width=99))


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_stack() -> Software:
    """The software of this process: torch, its CUDA and NCCL (gloo without CUDA),
    DeepSpeed and megatron-core."""
    import torch

    backend = "gloo"
    if torch.cuda.is_available():
        nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        backend = "nccl " + ".".join(map(str, nccl if isinstance(nccl, tuple) else (nccl,)))
    return Software(python=platform.python_version(), torch=torch.__version__, backend=backend,
                    cuda=torch.version.cuda, deepspeed=_version("deepspeed"),
                    megatron_core=_version("megatron-core"))


def _release(version: str | None) -> str | None:
    """major.minor of a version (local tags such as +cpu dropped), the part kernels follow."""
    if not version:
        return None
    parts = version.split("+")[0].split()
    return " ".join([*parts[:-1], ".".join(parts[-1].split(".")[:2])]) if parts else None


def stack_mismatch(made: Software, here: Software) -> str | None:
    """The first component whose release differs between two stacks, as 'name a vs b'; None
    when they agree (a component one side lacks is not compared)."""
    for name in ("torch", "backend", "cuda", "deepspeed", "megatron_core"):
        a, b = _release(getattr(made, name)), _release(getattr(here, name))
        if a is not None and b is not None and a != b:
            return f"{name} {getattr(made, name)} in the file vs {getattr(here, name)} here"
    return None


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file.

    Raises:
        AutotuneError: missing, not YAML, or not a calibration file (one line: field, value).
    """
    path = Path(path)
    if not path.is_file():
        raise AutotuneError(f"--calibration: no file {path}; write one with autotune calibrate")
    data = read_structured(path)
    if not isinstance(data, dict):
        raise AutotuneError(f"--calibration {path}: not a calibration file (expected a mapping)")
    try:
        return Calibration(**data)
    except ValidationError as error:
        raise AutotuneError(validation_message(error, f"--calibration {path}")) from None


def apply_calibration(
    cfg: AutotuneConfig,
    calibration: Calibration,
    label: str,
    *,
    here: Software | None = None,
    ignore_mismatch: bool = False,
) -> AutotuneConfig:
    """`cfg` with the calibration's constants and figures on its GPU (and, for CPU workers, its
    measured links); `label` names it in every report.

    Raises:
        AutotuneError: made on another GPU type, software stack or framework (one line naming
            the mismatch; `ignore_mismatch` uses it anyway), or incomplete.
    """
    if not calibration.complete:
        raise AutotuneError(
            f"--calibration {label}: the run did not complete ({calibration.failure}); "
            "calibrate again"
        )
    gpu = cfg.cluster.gpu
    problems = []
    if calibration.gpu.name != gpu.name:
        problems.append(f"GPU {calibration.gpu.name} in the file vs {gpu.name} in the problem")
    mismatch = stack_mismatch(calibration.software, here or software_stack())
    if mismatch:
        problems.append(mismatch)
    if calibration.framework and calibration.framework != cfg.train.framework:
        problems.append(
            f"framework {calibration.framework} in the file vs {cfg.train.framework} here")
    if problems and not ignore_mismatch:
        raise AutotuneError(
            f"--calibration {label}: made for another setup ({problems[0]}); calibrate this one "
            "or pass --ignore-calibration-mismatch"
        )
    calibrated = gpu.model_copy(update={
        "peak_tflops": {**gpu.peak_tflops, **calibration.gpu.peak_tflops},
        "hbm_tb_s": calibration.gpu.hbm_tb_s,
        "constants": {**gpu.constants, **calibration.values()},
        "calibration": label,
    })
    links = {"gpu": calibrated}
    for name in ("intra_node_gb_s", "inter_node_gb_s"):
        value = getattr(calibration, name)
        if value is not None:
            links[name] = value
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update=links)})
