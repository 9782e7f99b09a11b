"""The analytic cost model: memory and step time of many layouts at once, per named part.

Data flow: `constants` (per GPU) → `flops`, `sharding`, `expert_dispatch` → `kernels` (GEMMs,
attention, elementwise) and `collectives` (NCCL α-β) → `memory` and `step_time` → `estimate`
(`evaluate` over a `LayoutTable`, `estimate` for one `Layout`). The framework's own terms come
through `terms` (implemented by `autotune.frameworks`). "Model" means the network elsewhere in
this package, hence "cost model" here.
"""

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.terms import FrameworkTerms
from autotune.costmodel.terms import StageSplit

__all__ = ["Constants", "Estimate", "FrameworkTerms", "StageSplit", "constants_for", "estimate",
           "evaluate"]
