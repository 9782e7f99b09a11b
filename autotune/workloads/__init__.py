"""Built-in trial programs: real training steps that runners launch to measure a layout.

Each workload is a module runnable with ``python -m`` under a distributed launcher. It reads the
trial's ``problem.json``, ``layout.json`` and its framework's rendered config, trains a few
steps on synthetic tokens, and prints the records of `autotune.workloads.records`. Runners find the
program of a framework with `workload_spec(framework.workload)`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.exceptions import AutotuneError
from autotune.specs import AutotuneConfig

WORKLOADS = frozenset({"deepspeed_gpt", "megatron_gpt"})
"""Names of the built-in workloads."""
PROBLEM_FILE = "problem.json"
"""The trial's model, cluster and training setup, written next to its configs."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What a runner needs to know to launch one built-in workload."""

    name: str
    """Registry name, e.g. ``deepspeed_gpt``."""
    module: str
    """Importable module to run with ``python -m`` (or ``torchrun -m``)."""
    description: str
    """One line for listings and reports."""
    config_args: tuple[tuple[str, str], ...] = ()
    """(flag, artifact file) pairs: the rendered configs the program reads."""

    def arguments(self, folder: Path, *, steps: int, warmup: int) -> list[str]:
        """The program's arguments for the trial whose files are in `folder`."""
        args = ["--problem", str(folder / PROBLEM_FILE), "--layout", str(folder / "layout.json")]
        for flag, artifact in self.config_args:
            args += [flag, str(folder / artifact)]
        return args + ["--steps", str(steps), "--warmup", str(warmup),
                       "--metrics", str(folder / "metrics.jsonl")]


_SPECS = {
    "deepspeed_gpt": WorkloadSpec(
        name="deepspeed_gpt",
        module="autotune.workloads.deepspeed_gpt",
        description=(
            "Llama-style GPT trained by DeepSpeed from ds_config.json and layout.json: ZeRO 0-3, "
            "offload, PipelineModule (pp), AutoTP (tp), Ulysses (cp), activation recompute"
        ),
        config_args=(("--ds-config", "ds_config.json"),),
    ),
    "megatron_gpt": WorkloadSpec(
        name="megatron_gpt",
        module="autotune.workloads.megatron_gpt",
        description=(
            "GPT trained by megatron-core itself (GPTModel, local layer spec, pipeline schedules, "
            "DDP and distributed optimizer, recompute); needs CUDA"
        ),
    ),
}


def problem_text(cfg: AutotuneConfig) -> str:
    """problem.json's text: the model, cluster and training setup `--problem` reads."""
    return cfg.model_dump_json(indent=2) + "\n"


def write_problem(cfg: AutotuneConfig, folder: Path) -> Path:
    """Write the trial's problem.json (what `--problem` reads) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROBLEM_FILE
    path.write_text(problem_text(cfg))
    return path


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
