"""One tuning problem: `AutotuneConfig` = model + cluster + training setup, plus the training
recipe and the Slurm job the rendered configs use (they do not change which layout is fastest)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic import model_validator

from autotune.specs.cluster import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.recipe import JobSpec
from autotune.specs.recipe import RecipeSpec
from autotune.specs.train import TrainSpec
from autotune.specs.types import FROZEN

NO_MXFP8 = frozenset({"a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb"})
"""GPU presets whose tensor cores have no MXFP8 (block-scaled FP8 is Blackwell's, sm100:
megatron-core's `TransformerConfig.fp8_recipe` says "'mxfp8' for Blackwell architecture only")."""


class AutotuneConfig(BaseModel):
    """Everything that defines a tuning problem: model, cluster and training setup."""

    model_config = FROZEN

    model: ModelSpec
    """The model to train."""
    cluster: ClusterSpec
    """Where it trains."""
    train: TrainSpec
    """How it trains."""
    recipe: RecipeSpec = RecipeSpec()
    """Learning rate, schedule, token budget, intervals of the rendered configs
    (`autotune.specs.recipe.resolve_recipe` fills what is unset)."""
    job: JobSpec = JobSpec()
    """Slurm partition, account, time limit and container of the rendered sbatch.sh."""

    @model_validator(mode="after")
    def _check_fp8_recipe(self) -> AutotuneConfig:
        """MXFP8 only on a GPU that has it (not the Ampere and Hopper presets, nor a GPU
        `like` one of them)."""
        gpu = self.cluster.gpu
        name = gpu.like or gpu.name
        if self.train.fp8_recipe == "mxfp8" and name in NO_MXFP8:
            raise ValueError(f"fp8_recipe 'mxfp8' needs a Blackwell GPU; {name} has no MXFP8 "
                             "tensor cores: use --fp8-recipe delayed, tensorwise or blockwise")
        return self

    @property
    def world_size(self) -> int:
        """Accelerators used by every layout."""
        return self.cluster.world_size

    def identity(self) -> dict[str, Any]:
        """What makes two problems the same: model, training, and the cluster's shape and GPU
        (not throughput figures measured on the spot, as for the local CPU cluster; not the
        recipe or the job, which change no layout's speed)."""
        cluster = self.cluster.model_dump(mode="json", exclude={"gpu"})
        gpu = self.cluster.gpu
        # a calibration makes it another problem; without one the identity stays as it was
        uncalibrated = {"constants", "calibration"} if not gpu.calibration else set()
        cluster["gpu"] = {"name": gpu.name}
        if gpu.calibration:
            cluster["gpu"]["calibration"] = gpu.calibration
        if not self.cluster.cpu_processes:
            cluster["gpu"] = gpu.model_dump(mode="json", exclude=uncalibrated)
        else:
            cluster.pop("host_memory_gb")
        return {"model": self.model.model_dump(mode="json"), "cluster": cluster,
                "train": self.train.model_dump(mode="json")}
