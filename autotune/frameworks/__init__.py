"""Training frameworks: one `Framework` bundle each (rules, model terms, artifacts, workload).

Example:
    >>> from autotune.frameworks import get_framework
    >>> get_framework("megatron").padded_vocab(50257, 8)
    51200
"""

from __future__ import annotations

from typing import get_args

from autotune.costmodel.terms import register_terms
from autotune.exceptions import AutotuneError
from autotune.frameworks.base import Framework
from autotune.frameworks.deepspeed import DeepSpeed
from autotune.frameworks.megatron import Megatron
from autotune.specs import AutotuneConfig
from autotune.specs import Framework as FrameworkName

_BUNDLES: dict[str, Framework] = {bundle.name: bundle for bundle in (Megatron(), DeepSpeed())}
for _bundle in _BUNDLES.values():
    register_terms(_bundle)

FRAMEWORKS = tuple(_BUNDLES)
"""Framework names, as `--framework` takes them (`TrainSpec.framework` admits exactly these)."""
assert set(FRAMEWORKS) == set(get_args(FrameworkName)), "TrainSpec.framework and the registry"


def get_framework(name: str) -> Framework:
    """The bundle of framework `name`.

    Raises:
        AutotuneError: `name` is not a framework.
    """
    if name not in _BUNDLES:
        raise AutotuneError(f"--framework: {name!r} must be one of {', '.join(FRAMEWORKS)}")
    return _BUNDLES[name]


def framework_of(cfg: AutotuneConfig) -> Framework:
    """The bundle of the framework a problem trains with."""
    return get_framework(cfg.train.framework)


__all__ = ["FRAMEWORKS", "Framework", "framework_of", "get_framework"]
