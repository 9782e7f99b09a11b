"""autotune: find the fastest parallel layout to train a transformer on a cluster."""

import autotune.frameworks  # noqa: F401  (registers each framework's cost-model terms)
from autotune._version import __version__
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs import AutotuneConfig
from autotune.specs import ClusterSpec
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_config

_LAZY = {  # heavy imports (Optuna, Jinja) load on first use
    "Runner": "autotune.runners.base",
    "TuneSettings": "autotune.search.settings",
    "tune": "autotune.run",
    "RunConfig": "autotune.run",
    "write_artifacts": "autotune.render",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


__all__ = [
    "__version__",
    "AutotuneConfig",
    "AutotuneError",
    "ClusterSpec",
    "Estimate",
    "Layout",
    "ModelSpec",
    "Runner",
    "SearchSpace",
    "TrainSpec",
    "TuneSettings",
    "enumerate_layouts",
    "estimate",
    "load_config",
    "load_space",
    "tune",
    "write_artifacts",
]
