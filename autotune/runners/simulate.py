"""The simulate runner: the analytic model is the measurement, optionally perturbed.

With `noise` > 0 the 'truth' differs from the model the way a real cluster does: the model's
physical constants are scaled by seeded log-normal factors (σ = noise), and every layout gets a
further seeded per-layout jitter (σ = noise / 4). The same seed gives the same surface.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import numpy as np
from pydantic import Field

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.measurement import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import RunnerOptions
from autotune.runners.base import TrialPlan
from autotune.specs import AutotuneConfig
from autotune.specs import FiniteFloat
from autotune.specs import Seed
from autotune.specs import at_most
from autotune.units import GIB

_PERTURBED = ("gemm_efficiency", "comm_efficiency", "hbm_efficiency", "overlap_fraction")


def perturbed_constants(base: Constants, noise: float, seed: int) -> Constants:
    """The constants of the hidden truth: each scaled by exp(N(0, noise)), kept in bounds."""
    if noise <= 0:
        return base
    rng = np.random.default_rng(seed)
    update = {}
    for name in _PERTURBED:
        value = getattr(base, name) * float(np.exp(rng.normal(0.0, noise)))
        update[name] = min(value, 1.0)
    update["elementwise_passes"] = base.elementwise_passes * float(np.exp(rng.normal(0.0, noise)))
    return base.model_copy(update=update)


def layout_jitter(layout: Layout, noise: float, seed: int) -> float:
    """A seeded multiplicative factor on step time, fixed per layout."""
    if noise <= 0:
        return 1.0
    digest = hashlib.sha256(f"{seed}:{layout.id}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return float(np.exp(rng.normal(0.0, noise / 4)))


class SimulateSettings(RunnerOptions):
    """What the simulate runner reads."""

    noise: Annotated[
        FiniteFloat, Field(ge=0), at_most(1.0, "a log-normal sigma of 1 already varies 2.7x")
    ] = 0.0
    """simulate: sigma of the log-normal perturbation of the model's constants."""
    seed: Seed = 0
    """simulate: seed of the perturbation."""


class SimulateRunner(Runner):
    """Measures nothing real: returns the (perturbed) model's figures at once."""

    name = "simulate"

    @classmethod
    def from_settings(cls, settings: SimulateSettings, resume: bool = False) -> SimulateRunner:
        """The runner `settings` describe (`resume` changes nothing here)."""
        return cls(noise=settings.noise, seed=settings.seed)

    def __init__(self, noise: float = 0.0, seed: int = 0, hidden_memory_gib: float = 0.0) -> None:
        self.noise = noise
        self.seed = seed
        self.hidden_memory_gib = hidden_memory_gib
        """Memory the simulated cluster uses that the model does not know (runtime, drivers,
        fragmentation), GiB per GPU: layouts near the memory edge then run out of memory."""

    def check(self, cfg: AutotuneConfig) -> None:
        """The model needs the GPU's peak at the training precision."""
        if cfg.train.precision not in cfg.cluster.gpu.peak_tflops:
            supported = ", ".join(cfg.cluster.gpu.peak_tflops)
            raise AutotuneError(
                f"--precision {cfg.train.precision}: {cfg.cluster.gpu.name} has no "
                f"{cfg.train.precision} peak; choose one of {supported}"
            )

    def truth_constants(self, cfg: AutotuneConfig) -> Constants:
        """The constants of the simulated cluster."""
        k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
        return perturbed_constants(k, self.noise, self.seed)

    def run(self, plan: TrialPlan) -> Measurement:
        cfg, layout = plan.cfg, plan.layout
        k = self.truth_constants(cfg)
        values = evaluate(cfg, LayoutTable.from_layouts([layout]), k)
        peak = float(values.peak_memory_bytes[0]) + self.hidden_memory_gib * GIB
        if peak > usable_gpu_bytes(cfg, k):
            return Measurement(
                "oom", peak_memory_bytes=peak, reason="simulated peak memory exceeds the GPU"
            )
        factor = layout_jitter(layout, self.noise, self.seed)
        step = float(values.step_time_s[0]) * factor
        if plan.report(1, cfg.train.tokens_per_step / step):
            return Measurement("pruned", reason="stopped by the pruner")
        return Measurement(
            "ok",
            step_time_s=step,
            tokens_per_s=cfg.train.tokens_per_step / step,
            tflops_per_gpu=float(values.tflops_per_gpu[0]) / factor,
            mfu=float(values.mfu[0]) / factor,
            peak_memory_bytes=peak,
            step_time_spread=0.0,
        )
