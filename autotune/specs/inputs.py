"""Turn what a user types (preset names, YAML files, Hugging Face config.json) into specs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any
from typing import TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError

from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.numbers import compact
from autotune.resources import resource_dir
from autotune.specs.cluster import ClusterSpec
from autotune.specs.cluster import GPUSpec
from autotune.specs.config import AutotuneConfig
from autotune.specs.hf import hf_to_megatron
from autotune.specs.model import ModelSpec
from autotune.specs.recipe import JobSpec
from autotune.specs.recipe import RecipeSpec
from autotune.specs.train import TrainSpec
from autotune.units import GIB


@cache
def _presets(kind: str) -> dict[str, Any]:
    text = (resource_dir("presets") / f"{kind}.yaml").read_text()
    presets: dict[str, Any] = yaml.safe_load(text)
    return presets


def model_presets() -> list[str]:
    """Names of the model presets."""
    return sorted(_presets("models"))


def cluster_presets() -> list[str]:
    """Names of the cluster presets (use as NAME:NODES)."""
    return sorted(_presets("clusters"))


def gpu_presets() -> list[str]:
    """Names of the accelerator presets."""
    return sorted(_presets("gpus"))


def validation_problems(error: ValidationError) -> list[tuple[tuple[str | int, ...], str, str]]:
    """(location, offending value shortened or '', message) of each pydantic error."""
    problems = []
    for item in error.errors():
        value = item.get("input")
        shown = ""
        if item["type"] != "missing" and not isinstance(value, dict | list | tuple):
            shown = shorten(value, 40)
        message = item["msg"].removeprefix("Value error, ")
        problems.append((tuple(item["loc"]), shown, message))
    return problems


def validation_message(error: ValidationError, source: str) -> str:
    """The pydantic errors as one line: `source: field = value: problem; field: problem`."""
    parts = []
    for loc, value, message in validation_problems(error):
        field = ".".join(str(part) for part in loc) or "(root)"
        parts.append(f"{field} = {value}: {message}" if value else f"{field}: {message}")
    return f"{source}: " + "; ".join(parts)


_Spec = TypeVar("_Spec", bound=BaseModel)


def _build(cls: type[_Spec], data: Any, source: str) -> _Spec:
    if not isinstance(data, dict):
        raise AutotuneError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls(**data)
    except ValidationError as error:
        raise AutotuneError(validation_message(error, source)) from None
    except TypeError as error:
        raise AutotuneError(f"{source}: {error}") from None


def existing_path(ref: str) -> Path | None:
    """`ref` as the path of an existing file or folder, else None (never raises)."""
    try:
        path = Path(ref)
        return path if path.exists() else None
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return None


def read_structured(path: Path) -> Any:
    """A user's YAML (or, by its suffix, JSON) file as Python values.

    Raises:
        AutotuneError: unreadable, not text, or not valid YAML/JSON (one line, where).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AutotuneError(f"{path}: not a text file (YAML or JSON is UTF-8 text)") from None
    except OSError as error:
        raise AutotuneError(f"cannot read {path}: {error.strerror}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise AutotuneError(
            f"{path} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise AutotuneError(f"{path} is not valid YAML: {problem}{where}") from None
    except RecursionError:
        raise AutotuneError(f"{path} nests too deeply to be a model or a cluster") from None


def load_model(ref: str) -> ModelSpec:
    """A model from a preset name, a YAML file (Megatron names) or a Hugging Face config.json."""
    presets = _presets("models")
    if ref in presets:
        return _build(ModelSpec, {"name": ref, **presets[ref]["model"]}, f"model preset {ref}")
    path = existing_path(ref)
    if path is None:
        raise AutotuneError(
            f"--model: {shorten(ref)} is neither a preset nor a file; "
            f"presets: {', '.join(model_presets())}"
        )
    data = read_structured(path)
    if isinstance(data, dict) and (
        "model_type" in data or "architectures" in data or "n_layer" in data
    ):
        try:
            data = hf_to_megatron(data, str(path))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise AutotuneError(
                f"{path}: not a Hugging Face config autotune can read ({type(error).__name__}: "
                f"{shorten(str(error))})"
            ) from None
    elif isinstance(data, dict):
        data = {"name": path.stem, **data}
    return _build(ModelSpec, data, str(path))


def default_train(model_ref: str) -> dict[str, Any]:
    """The preset's own training defaults (sequence length, global batch, precision), if any."""
    return dict(_presets("models").get(model_ref, {}).get("train", {}))


def preset_setup(model_ref: str, model: ModelSpec) -> dict[str, Any]:
    """The training setup a model starts from: its preset's, else 512 sequences of at most
    4,096 tokens."""
    return {"seq_length": min(model.max_position_embeddings, 4096), "global_batch_size": 512,
            **default_train(model_ref)}


def load_gpu(ref: Any, source: str) -> GPUSpec:
    """An accelerator from a preset name or an inline mapping."""
    gpus = _presets("gpus")
    if isinstance(ref, dict):
        like = ref.get("like")
        if like is not None and like not in gpus:
            raise AutotuneError(
                f"{source}: gpu: like: {shorten(like)} is not a GPU preset; use one of "
                f"{', '.join(gpu_presets())} (its calibrated constants apply) or drop it"
            )
        return _build(GPUSpec, ref, f"{source}: gpu")
    if not isinstance(ref, str) or ref not in gpus:
        raise AutotuneError(
            f"{source}: gpu: {shorten(ref)} is neither a preset nor a mapping of memory_gb, "
            f"peak_tflops and hbm_tb_s; presets: {', '.join(gpu_presets())}"
        )
    return _build(GPUSpec, {"name": ref, **gpus[ref]}, f"gpu preset {ref}")


def _cluster_from_mapping(data: dict[str, Any], name: str, source: str) -> ClusterSpec:
    if not isinstance(data, dict):
        raise AutotuneError(f"{source}: expected a mapping of fields")
    if "gpu" not in data:
        raise AutotuneError(f"{source}: gpu: field required (a preset name or a mapping)")
    fields = {**data, "gpu": load_gpu(data["gpu"], source), "name": data.get("name", name)}
    return _build(ClusterSpec, fields, source)


def load_cluster(ref: str, processes: int | None = None) -> ClusterSpec:
    """A cluster from `NAME:NODES`, a YAML file, or `local` (CPU processes when no GPU)."""
    if ref == "local":
        return local_cluster(processes)
    presets = _presets("clusters")
    name, _, nodes_text = ref.partition(":")
    if name in presets:
        try:
            nodes = int(nodes_text or "1")
        except ValueError:
            raise AutotuneError(
                f"--cluster: node count in {shorten(ref)} must be an integer, as in {name}:4"
            ) from None
        if nodes < 1:
            raise AutotuneError(f"--cluster: node count in {shorten(ref)} must be at least 1")
        return _cluster_from_mapping(
            {**presets[name], "nodes": nodes}, ref, f"--cluster {shorten(ref)}"
        )
    path = existing_path(ref)
    if path is None:
        raise AutotuneError(
            f"--cluster: {shorten(ref)} is neither NAME:NODES, a file nor 'local'; presets: "
            f"{', '.join(cluster_presets())}"
        )
    return _cluster_from_mapping(read_structured(path), path.stem, str(path))


def _host_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError):
        return 16.0


@cache
def cpu_matmul_tflops() -> float:
    """fp32 matrix-multiply throughput of one core: the fastest of 9 rounds of four 512³
    GEMMs into a kept output, each net of the time the thread waited for a CPU that other
    processes held (about 0.1 s). The calibration's peak is likewise its fastest GEMM
    (`autotune.calibration.kernel_fit.measured_figures`); a single timed run read 0.03 on
    this project's host at a load average of 10, and 0.089 this way."""
    import time

    import torch

    from autotune.measurement import cpu_wait_s

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    n, calls, best = 512, 4, 0.0
    try:
        a, out = torch.randn(n, n), torch.empty(n, n)
        torch.mm(a, a, out=out)
        for _ in range(9):
            start, waited = time.perf_counter(), cpu_wait_s()
            for _ in range(calls):
                torch.mm(a, a, out=out)
            wall = time.perf_counter() - start
            best = max(best, 2 * n**3 * calls / max(wall - (cpu_wait_s() - waited), 1e-3 * wall))
    finally:
        torch.set_num_threads(threads)
    return best / 1e12


GPU_FAMILIES = {"a100-sxm-80gb": "a100", "h100-sxm-80gb": "h100", "h200-sxm-141gb": "h200"}
"""The CUDA device names a GPU preset covers: the name holds the family and none of
OTHER_VARIANTS, and the memory is the preset's within MEMORY_TOLERANCE."""
OTHER_VARIANTS = ("pcie", "nvl")
"""Words naming PCIe and NVL cards, whose peaks are lower than the SXM presets'."""
MEMORY_TOLERANCE = 0.05
"""CUDA reports an H100 SXM as 79.6 GiB and an H200 SXM as 140.4 GiB (presets: 80, 141)."""
NVLINK_GB_S = 25.0
"""Bandwidth of one NVLink per direction, GB/s, for NVLink 3 and 4: an A100 SXM has 12 links
(600 GB/s both ways, NVIDIA A100 datasheet), an H100/H200 SXM 18 (900 GB/s both ways, NVIDIA
H100 datasheet); `nvidia-smi topo -m` shows `NV<links>` between two GPUs."""


def gpu_preset_for(device_name: str, memory_gib: float) -> str:
    """The GPU preset of a CUDA device, by its name and its memory in GiB.

    Raises:
        AutotuneError: when no preset matches both (its peaks would be guesses).
    """
    name = device_name.lower()
    gpus = _presets("gpus")
    for preset, family in GPU_FAMILIES.items():
        expected = float(gpus[preset]["memory_gb"])
        if (
            family in name
            and not any(word in name for word in OTHER_VARIANTS)
            and abs(memory_gib - expected) <= MEMORY_TOLERANCE * expected
        ):
            return preset
    raise AutotuneError(
        f"--cluster local: the GPU {shorten(device_name)} ({memory_gib:.1f} GiB) matches no "
        f"preset ({', '.join(GPU_FAMILIES)}); describe the machine in a cluster YAML (gpu: "
        "{memory_gb, peak_tflops, hbm_tb_s} and the links, see README) and pass --cluster FILE"
    )


def nvlinks(topology: str, gpus: int) -> int | None:
    """The fewest NVLinks between any two of the first `gpus` GPUs in `nvidia-smi topo -m`
    output; 0 when a pair talks over PCIe; None when the matrix cannot be read."""
    rows: dict[int, list[str]] = {}
    for line in topology.splitlines():
        cells = line.split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]):
            rows[int(cells[0][3:])] = cells[1:]
    links = []
    for i in range(gpus):
        for j in range(gpus):
            if i == j:
                continue
            if i not in rows or len(rows[i]) <= j:
                return None
            match = re.fullmatch(r"NV(\d+)", rows[i][j])
            links.append(int(match[1]) if match else 0)
    return min(links) if links else None


def _nvidia_smi_topology() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _cuda_devices() -> tuple[int, Any]:
    """The number of CUDA devices and the properties of the first (0, None without CUDA)."""
    try:
        import torch
    except ImportError:
        return 0, None
    if not torch.cuda.is_available() or not torch.cuda.device_count():
        return 0, None
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0)


CPU_MEMORY_TB_S = 0.025
"""A CPU worker's elementwise bandwidth without a calibration, TB/s: the median (range
0.016-0.028) of what ten `calibrate -c local` runs measured on this project's host (1 thread
per worker; the `cpu` constants in constants.yaml are relative to it)."""
CPU_LINK_GB_S = 1.9
"""The gloo link between CPU workers without a calibration, GB/s: the median (range 1.3-2.5)
of the fastest collective bus bandwidth those calibrations measured."""


def local_cluster(processes: int | None = None) -> ClusterSpec:
    """This machine: its CUDA GPUs, or CPU worker processes on gloo when there are none.

    With GPUs, the device is matched to its preset by name and memory (GiB, as CUDA reports
    it), so the preset's calibrated constants apply; the link inside the machine is read from
    `nvidia-smi topo -m` (NVLinks × NVLINK_GB_S, or PCIe when a pair has no NVLink), else taken
    from the cluster preset of that GPU (vendor datasheets, cited in clusters.yaml).

    On CPU the 'GPU' is one worker process: memory is the host memory shared by the processes,
    and peak FLOP/s is a single-core fp32 matmul measured here times the cores per process.

    Raises:
        AutotuneError: an unknown GPU, or more --processes than GPUs.
    """
    host_gb = _host_memory_gb()
    gpus, props = _cuda_devices()
    if gpus:
        return _local_gpu_cluster(gpus, props, processes, host_gb)
    count = processes or 2
    cores = os.cpu_count() or 1
    per_process_tflops = cpu_matmul_tflops() * max(1, cores // count)
    gpu = GPUSpec(
        name="cpu",
        memory_gb=host_gb * 1e9 / GIB / count,
        peak_tflops={"fp32": per_process_tflops, "bf16": per_process_tflops / 6},
        hbm_tb_s=CPU_MEMORY_TB_S,
    )
    return ClusterSpec(
        name="local",
        nodes=1,
        gpus_per_node=count,
        gpu=gpu,
        intra_node_gb_s=CPU_LINK_GB_S,
        inter_node_gb_s=1.0,
        host_memory_gb=host_gb,
        pcie_gb_s=10.0,
        cpu_processes=True,
    )


def _local_gpu_cluster(
    gpus: int, props: Any, processes: int | None, host_gb: float
) -> ClusterSpec:
    if processes is not None and processes > gpus:
        raise AutotuneError(
            f"--processes: {processes} exceeds the {gpus} GPUs of this machine; use at most {gpus}"
        )
    count = processes or gpus
    preset = gpu_preset_for(props.name, props.total_memory / GIB)
    node = next(c for c in _presets("clusters").values() if c["gpu"] == preset)
    intra = float(node["intra_node_gb_s"])
    topology = _nvidia_smi_topology() if count > 1 else None
    links = nvlinks(topology, count) if topology else None
    if links is not None:
        intra = links * NVLINK_GB_S if links else float(node["pcie_gb_s"])
    gpu = load_gpu(preset, "--cluster local").model_copy(
        update={"memory_gb": props.total_memory / GIB}  # what this device has, in GiB
    )
    return ClusterSpec(
        name="local",
        nodes=1,
        gpus_per_node=count,
        gpu=gpu,
        intra_node_gb_s=intra,
        inter_node_gb_s=node["inter_node_gb_s"],
        host_memory_gb=host_gb,
        pcie_gb_s=node["pcie_gb_s"],
    )


def load_config(
    model: str,
    cluster: str,
    *,
    processes: int | None = None,
    gbs_tokens: int | None = None,
    recipe: RecipeSpec | Mapping[str, Any] | None = None,
    job: JobSpec | Mapping[str, Any] | None = None,
    **train: Any,
) -> AutotuneConfig:
    """Model, cluster and training setup from CLI-style references.

    Args:
        model: A model preset, a YAML file in Megatron's names, or a Hugging Face config.json.
        cluster: `NAME:NODES` of a cluster preset, a cluster YAML file, or `local`.
        processes: Worker processes of `local` (default: its GPUs, or 2 CPU processes).
        gbs_tokens: The global batch in tokens (sequences = tokens / seq, which must divide),
            instead of `global_batch_size` in sequences.
        recipe: The config's `recipe:` section (`RecipeSpec`).
        job: The config's `job:` section (`JobSpec`).
        **train: `TrainSpec` fields that override the preset's training setup (None: keep it).

    Raises:
        AutotuneError: an unknown preset, an unreadable file, or a setting out of bounds.

    Example:
        >>> cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=8192)
        >>> cfg.train.seq_length, cfg.world_size
        (8192, 8)
    """
    if gbs_tokens is not None and train.get("global_batch_size") is not None:
        raise AutotuneError("--gbs-tokens: give the global batch in tokens or in sequences "
                            "(--gbs), not both")
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster, processes)
    setup = preset_setup(model, model_spec)
    if cluster_spec.cpu_processes:
        setup["precision"] = "fp32"
    unknown = sorted(set(train) - set(TrainSpec.model_fields))
    if unknown:
        raise AutotuneError(f"training setup: {unknown[0]} is not a TrainSpec field; choose one "
                            f"of {', '.join(TrainSpec.model_fields)}")
    setup.update({key: value for key, value in train.items() if value is not None})
    if gbs_tokens is not None:
        setup["global_batch_size"] = _sequences(gbs_tokens, int(setup["seq_length"]))
    train_spec = _build(TrainSpec, setup, "training setup")
    if train_spec.precision not in cluster_spec.gpu.peak_tflops:
        supported = ", ".join(cluster_spec.gpu.peak_tflops)
        raise AutotuneError(
            f"--precision: {cluster_spec.gpu.name} has no {train_spec.precision} support; "
            f"choose one of {supported}"
        )
    if train_spec.seq_length > model_spec.max_position_embeddings and (
        model_spec.position_embedding == "learned_absolute"
    ):
        raise AutotuneError(
            f"--seq: {train_spec.seq_length} exceeds the model's learned positions "
            f"({model_spec.max_position_embeddings}); lower --seq"
        )
    recipe_spec = recipe if isinstance(recipe, RecipeSpec) else _build(
        RecipeSpec, dict(recipe or {}), "recipe")
    job_spec = job if isinstance(job, JobSpec) else _build(JobSpec, dict(job or {}), "job")
    return AutotuneConfig(model=model_spec, cluster=cluster_spec, train=train_spec,
                          recipe=recipe_spec, job=job_spec)


def _sequences(tokens: int, seq_length: int) -> int:
    """The global batch in sequences of `tokens` tokens per step; raises when seq does not
    divide it."""
    if tokens < seq_length or tokens % seq_length:
        lower = max(seq_length, tokens // seq_length * seq_length)
        raise AutotuneError(
            f"--gbs-tokens: {tokens:,} tokens are not a whole number of {seq_length:,}-token "
            f"sequences; use a multiple of the sequence length, e.g. {lower:,}")
    return tokens // seq_length


def batch_warnings(model_ref: str, cfg: AutotuneConfig, *, batch_given: bool) -> list[str]:
    """What a user must hear when --seq changes but the global batch stays the preset's in
    sequences: the tokens per step move with the sequence length (a 512-sequence batch at
    131,072 tokens is 67 M tokens per step, 16x the same batch at 8,192)."""
    preset = preset_setup(model_ref, cfg.model)
    seq, gbs = cfg.train.seq_length, cfg.train.global_batch_size
    if batch_given or seq == preset["seq_length"] or gbs != preset["global_batch_size"]:
        return []
    base = int(preset["seq_length"])
    same = max(1, round(gbs * base / seq))
    return [f"--seq {seq:,} keeps the preset's global batch of {gbs:,} sequences: "
            f"{compact(gbs * seq)} tokens per step, against {compact(gbs * base)} at its "
            f"{base:,} tokens; give --gbs {same:,} (or --gbs-tokens) to keep the tokens per "
            "step, or --gbs to confirm this batch"]


def position_warnings(cfg: AutotuneConfig) -> list[str]:
    """What a user must hear about the model's positions at this sequence length: rotary
    embeddings trained for fewer positions, without rope scaling, are stretched silently by
    Megatron (`--max-position-embeddings` is raised to the sequence length), which is a
    different model from the released one (Llama 3 8B knows 8,192 positions; Llama 3.1 reaches
    131,072 through its llama3 rope scaling)."""
    m, seq = cfg.model, cfg.train.seq_length
    if seq <= m.max_position_embeddings or m.position_embedding == "learned_absolute":
        return []
    if m.rope_scaling is not None:
        return []
    return [f"seq {seq:,} exceeds {m.name}'s {m.max_position_embeddings:,} positions and the "
            "model has no rope scaling: the rendered config raises --max-position-embeddings to "
            f"{seq:,}, which continued training from released weights does not expect; give the "
            "model a rope_scaling (as Llama 3.1 has) or lower --seq"]
