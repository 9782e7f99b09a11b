"""How an Optuna study runs: the one `TuneSettings` (CLI, RunConfig, run.json)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import StrictBool

from autotune.specs import FiniteFloat
from autotune.specs import Integer
from autotune.specs import Seed
from autotune.specs import at_most

Trials = Annotated[Integer, Field(ge=1), at_most(100_000, "more than any layout space holds")]


class TuneSettings(BaseModel):
    """How the Optuna study runs (`autotune tune --help` lists the same fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    trials: Trials = 20
    """Trials to run (rule rejections and repeats are free)."""
    storage: str | None = None
    """Optuna storage URL; None: sqlite:///OUT/study.db."""
    study: str | None = None
    """Study name; None: model-cluster-framework."""
    resume: StrictBool = False
    """Continue an existing study."""
    seed: Seed = 0
    """Sampler seed."""
    jobs: Annotated[Integer, Field(ge=1), at_most(1024, "one thread per trial in flight")] = 1
    """Trials in flight at once."""
    top_k: Annotated[Integer, Field(ge=0), at_most(1000, "a report lists them all")] = 5
    """Runners-up rendered and reported besides the best."""
    repeat: Annotated[Integer, Field(ge=1), at_most(100, "noise averages out long before")] = 1
    """Runs of each layout (averaged against measurement noise); a layout that failed never
    runs again."""
    warm_start: Annotated[Integer, Field(ge=0), at_most(1000, "more than the trials")] = 4
    """First trials that each measure a new structural family (tp·pp·cp, recompute, ZeRO)."""
    explore_every: Annotated[Integer, Field(ge=1), at_most(100_000, "never")] = 10
    """Every n-th trial measures a family not measured yet (seeded draw)."""
    pruner_tolerance: Annotated[FiniteFloat, Field(ge=0), at_most(10, "never prunes")] = 0.1
    """Stop a trial early when its throughput trails the best by more than this share (beyond
    the measured noise)."""
    render: StrictBool = True
    """Render the configs of the best layouts when the study ends."""
