"""Turn what a user types (preset names, YAML files, Hugging Face config.json) into specs."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autotune.exceptions import AutotuneError
from autotune.hf import hf_to_megatron
from autotune.resources import resource_dir
from autotune.specs import AutotuneConfig
from autotune.specs import ClusterSpec
from autotune.specs import GPUSpec
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec


@cache
def _presets(kind: str) -> dict[str, Any]:
    return yaml.safe_load((resource_dir("presets") / f"{kind}.yaml").read_text())


def model_presets() -> list[str]:
    """Names of the model presets."""
    return sorted(_presets("models"))


def cluster_presets() -> list[str]:
    """Names of the cluster presets (use as NAME:NODES)."""
    return sorted(_presets("clusters"))


def gpu_presets() -> list[str]:
    """Names of the accelerator presets."""
    return sorted(_presets("gpus"))


def validation_message(error: ValidationError, source: str) -> str:
    """One `field: problem` line per pydantic error, prefixed with where the input came from."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(root)"
        lines.append(f"{source}: {field}: {item['msg']}")
    return "\n".join(lines)


def _build(cls: type, data: Any, source: str) -> Any:
    if not isinstance(data, dict):
        raise AutotuneError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls(**data)
    except ValidationError as error:
        raise AutotuneError(validation_message(error, source)) from None
    except TypeError as error:
        raise AutotuneError(f"{source}: {error}") from None


def _read_structured(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as error:
        raise AutotuneError(f"cannot read {path}: {error.strerror}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise AutotuneError(
            f"{path} is not valid {path.suffix.lstrip('.') or 'YAML'}: {error}"
        ) from None


def load_model(ref: str) -> ModelSpec:
    """A model from a preset name, a YAML file (Megatron names) or a Hugging Face config.json."""
    presets = _presets("models")
    if ref in presets:
        return _build(ModelSpec, {"name": ref, **presets[ref]["model"]}, f"model preset {ref}")
    path = Path(ref)
    if not path.exists():
        raise AutotuneError(
            f"--model: {ref!r} is neither a preset nor a file; "
            f"presets: {', '.join(model_presets())}"
        )
    data = _read_structured(path)
    if isinstance(data, dict) and (
        "model_type" in data or "architectures" in data or "n_layer" in data
    ):
        data = hf_to_megatron(data, str(path))
    elif isinstance(data, dict):
        data = {"name": path.stem, **data}
    return _build(ModelSpec, data, str(path))


def default_train(model_ref: str) -> dict[str, Any]:
    """The preset's own training defaults (sequence length, global batch, precision), if any."""
    return dict(_presets("models").get(model_ref, {}).get("train", {}))


def load_gpu(ref: str | dict[str, Any], source: str) -> GPUSpec:
    """An accelerator from a preset name or an inline mapping."""
    if isinstance(ref, dict):
        return _build(GPUSpec, ref, f"{source}: gpu")
    gpus = _presets("gpus")
    if ref not in gpus:
        raise AutotuneError(
            f"{source}: gpu: unknown preset {ref!r}; presets: {', '.join(gpu_presets())}"
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
                f"--cluster: node count in {ref!r} must be an integer, as in {name}:4"
            ) from None
        if nodes < 1:
            raise AutotuneError(f"--cluster: node count in {ref!r} must be at least 1")
        return _cluster_from_mapping({**presets[name], "nodes": nodes}, ref, f"cluster {ref}")
    path = Path(ref)
    if not path.exists():
        raise AutotuneError(
            f"--cluster: {ref!r} is neither NAME:NODES, a file nor 'local'; presets: "
            f"{', '.join(cluster_presets())}"
        )
    return _cluster_from_mapping(_read_structured(path), path.stem, str(path))


def _host_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError):
        return 16.0


@cache
def cpu_matmul_tflops() -> float:
    """fp32 matrix-multiply throughput of one core, measured once (about 0.1 s)."""
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(512, 512)
        torch.mm(a, a)
        start = time.perf_counter()
        repeats = 8
        for _ in range(repeats):
            torch.mm(a, a)
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return 2 * 512**3 * repeats / elapsed / 1e12


def local_cluster(processes: int | None = None) -> ClusterSpec:
    """This machine: its CUDA GPUs, or CPU worker processes on gloo when there are none.

    On CPU the 'GPU' is one worker process: memory is the host memory shared by the processes,
    and peak FLOP/s is a single-core fp32 matmul measured here times the cores per process.
    """
    host_gb = _host_memory_gb()
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if gpus:
        import torch

        props = torch.cuda.get_device_properties(0)
        device_name = props.name.lower()
        preset = (
            "h200-sxm-141gb"
            if "h200" in device_name
            else ("h100-sxm-80gb" if "h100" in device_name else "a100-sxm-80gb")
        )
        base = _presets("gpus")[preset]
        gpu = GPUSpec(
            name=props.name,
            memory_gb=props.total_memory / 1e9,
            peak_tflops=base["peak_tflops"],
            hbm_tb_s=base["hbm_tb_s"],
        )
        return ClusterSpec(
            name="local",
            nodes=1,
            gpus_per_node=processes or gpus,
            gpu=gpu,
            intra_node_gb_s=300,
            inter_node_gb_s=25,
            host_memory_gb=host_gb,
            pcie_gb_s=32,
        )
    count = processes or 2
    cores = os.cpu_count() or 1
    per_process_tflops = cpu_matmul_tflops() * max(1, cores // count)
    gpu = GPUSpec(
        name="cpu",
        memory_gb=host_gb * 1e9 / 2**30 / count,
        peak_tflops={"fp32": per_process_tflops, "bf16": per_process_tflops / 6},
        hbm_tb_s=0.01,
    )
    return ClusterSpec(
        name="local",
        nodes=1,
        gpus_per_node=count,
        gpu=gpu,
        intra_node_gb_s=2.0,
        inter_node_gb_s=1.0,
        host_memory_gb=host_gb,
        pcie_gb_s=10.0,
        cpu_processes=True,
    )


def load_config(
    model: str,
    cluster: str,
    *,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
    precision: str | None = None,
    framework: str | None = None,
    processes: int | None = None,
) -> AutotuneConfig:
    """Model, cluster and training setup from CLI-style references; None takes the default."""
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster, processes)
    train: dict[str, Any] = {
        "seq_length": min(model_spec.max_position_embeddings, 4096),
        "global_batch_size": 512,
    }
    train.update(default_train(model))
    if cluster_spec.cpu_processes:
        train["precision"] = "fp32"
    overrides = {
        "seq_length": seq_length,
        "global_batch_size": global_batch_size,
        "precision": precision,
        "framework": framework,
    }
    train.update({key: value for key, value in overrides.items() if value is not None})
    train_spec = _build(TrainSpec, train, "training setup")
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
    return AutotuneConfig(model=model_spec, cluster=cluster_spec, train=train_spec)
