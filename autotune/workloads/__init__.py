"""Built-in trial programs: real training steps that runners launch to measure a layout.

Each workload is a module runnable with ``python -m`` under a distributed launcher. It reads the
rendered framework config and ``layout.json``, trains a few steps on synthetic tokens, and
prints one JSON line per step plus a final summary line.
"""

from __future__ import annotations

import dataclasses

from autotune.exceptions import AutotuneError

WORKLOADS = frozenset({"deepspeed_gpt", "megatron_gpt"})
"""Names of the built-in workloads."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What a runner needs to know to launch one built-in workload."""

    name: str
    """Registry name, e.g. ``deepspeed_gpt``."""
    module: str
    """Importable module to run with ``python -m`` (or ``torchrun -m``)."""
    framework: str
    """Framework whose rendered config the workload reads (``deepspeed`` or ``megatron``)."""
    description: str
    """One line for listings and reports."""


_SPECS = {
    "deepspeed_gpt": WorkloadSpec(
        name="deepspeed_gpt",
        module="autotune.workloads.deepspeed_gpt",
        framework="deepspeed",
        description=(
            "Llama-style GPT trained by DeepSpeed from ds_config.json and layout.json: ZeRO 0-3, "
            "offload, PipelineModule (pp), AutoTP (tp), Ulysses (cp), activation recompute"
        ),
    ),
    "megatron_gpt": WorkloadSpec(
        name="megatron_gpt",
        module="autotune.workloads.megatron_gpt",
        framework="megatron",
        description=(
            "GPT trained by megatron-core itself (GPTModel, local layer spec, pipeline schedules, "
            "DDP and distributed optimizer, recompute); needs CUDA"
        ),
    ),
}


def workload_spec(name: str) -> WorkloadSpec:
    """The spec of a built-in workload.

    Args:
        name: A name from ``WORKLOADS``.

    Returns:
        The workload's ``WorkloadSpec``.

    Raises:
        AutotuneError: ``name`` is not a built-in workload.
    """
    if name not in WORKLOADS:
        raise AutotuneError(
            f"unknown workload {name!r}; built-in workloads: {', '.join(sorted(WORKLOADS))}"
        )
    return _SPECS[name]
