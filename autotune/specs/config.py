"""One tuning problem: `AutotuneConfig` = model + cluster + training setup, plus the training
recipe and the Slurm job the rendered configs use (they do not change which layout is fastest)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from autotune.specs.cluster import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.recipe import JobSpec
from autotune.specs.recipe import RecipeSpec
from autotune.specs.train import TrainSpec
from autotune.specs.types import FROZEN


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
