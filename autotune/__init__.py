"""autotune: find the fastest parallel layout to train a transformer on a cluster."""

from autotune.estimate import Estimate
from autotune.estimate import estimate
from autotune.exceptions import AutotuneError
from autotune.inputs import load_config
from autotune.layout import Layout
from autotune.space import SearchSpace
from autotune.space import enumerate_layouts
from autotune.space import load_space
from autotune.specs import AutotuneConfig
from autotune.specs import ClusterSpec
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec

__version__ = "0.1.0"

_LAZY = {  # heavy imports (Optuna, Jinja) load on first use
    "Runner": "autotune.runners.base",
    "TuneOptions": "autotune.search",
    "tune": "autotune.search",
    "write_artifacts": "autotune.render",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


__all__ = [
    "AutotuneConfig",
    "AutotuneError",
    "ClusterSpec",
    "Estimate",
    "Layout",
    "ModelSpec",
    "Runner",
    "SearchSpace",
    "TrainSpec",
    "TuneOptions",
    "enumerate_layouts",
    "estimate",
    "load_config",
    "load_space",
    "tune",
    "write_artifacts",
]
