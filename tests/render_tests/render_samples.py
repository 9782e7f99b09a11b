"""Sample layouts for the render tests: the top of each enumeration plus one per feature."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache

from autotune import AutotuneConfig
from autotune import Layout
from autotune import enumerate_layouts
from autotune import load_config
from autotune import load_space
from autotune.frameworks.megatron_args import pipeline_plan

PROBLEMS = (
    # (model, cluster, precision or None for the preset's default)
    ("gpt3-175b", "dgx-a100:128", None),
    ("llama3-405b", "dgx-h100:2048", None),
    ("llama2-7b", "dgx-h100:1", "fp16"),
    ("llama3-8b", "dgx-h100:1", "fp8"),
    ("llama3-8b", "dgx-h100:2", None),
    ("llama3-8b", "dgx-h100:4", None),
    ("tiny-gpt", "local", None),
    ("mixtral-8x7b", "dgx-h100:8", None),
    ("deepseek-v3", "dgx-h100:256", None),
    ("tiny-moe", "local", None),
)
"""Problems sampled for both frameworks."""
TOP = 10
"""Best-ranked layouts taken from each enumeration."""


def _uneven(cfg: AutotuneConfig, layout: Layout) -> bool:
    plan = pipeline_plan(cfg.model.num_layers, layout.pp, layout.vpp)
    return plan is not None and plan.edge


def _accounted(cfg: AutotuneConfig, layout: Layout) -> bool:
    plan = pipeline_plan(cfg.model.num_layers, layout.pp, layout.vpp)
    return plan is not None and (plan.account_embedding or plan.account_loss)


FEATURES: dict[str, Callable[[AutotuneConfig, Layout], bool]] = {
    "zero0": lambda c, lay: lay.zero == 0,
    "zero1": lambda c, lay: lay.zero == 1,
    "zero2": lambda c, lay: lay.zero == 2,
    "zero3": lambda c, lay: lay.zero == 3,
    "offload-optimizer": lambda c, lay: lay.offload == "optimizer",
    "offload-params": lambda c, lay: lay.offload == "optimizer+params",
    "tp": lambda c, lay: lay.tp > 1,
    "pp": lambda c, lay: lay.pp > 1,
    "vpp": lambda c, lay: lay.vpp > 1,
    "cp": lambda c, lay: lay.cp > 1,
    "sp": lambda c, lay: lay.sp,
    "selective": lambda c, lay: lay.recompute == "selective",
    "full": lambda c, lay: lay.recompute == "full",
    "uneven": _uneven,
    "uneven-vpp": lambda c, lay: _uneven(c, lay) and lay.vpp > 1,
    "accounted": _accounted,
    "accounted-vpp": lambda c, lay: _accounted(c, lay) and lay.vpp > 1,
    "pp-full": lambda c, lay: lay.pp > 1 and lay.recompute == "full",
    "fsdp-tp": lambda c, lay: lay.zero >= 2 and lay.tp > 1,
    "moe": lambda c, lay: c.model.moe,
    "ep": lambda c, lay: lay.ep > 1,
    "etp": lambda c, lay: lay.etp > 1,
    "ep-pp": lambda c, lay: lay.ep > 1 and lay.pp > 1,
    "ep-cp": lambda c, lay: lay.ep > 1 and lay.cp > 1,
    "ep-beyond-dp": lambda c, lay: lay.ep > lay.dp,
    "ep-fsdp": lambda c, lay: lay.ep > 1 and lay.zero >= 2,
}
"""Features each sample covers where the enumeration has a layout with them."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One sampled layout of one problem."""

    cfg: AutotuneConfig
    layout: Layout

    @property
    def name(self) -> str:
        """Test id."""
        precision = self.cfg.train.precision
        return f"{self.cfg.model.name}@{self.cfg.cluster.name}-{precision}-{self.layout.id}"


def problem(model: str, cluster: str, framework: str, precision: str | None) -> AutotuneConfig:
    """The config of one sampled problem (`local` is two worker processes)."""
    processes = 2 if cluster == "local" else None
    return load_config(model, cluster, framework=framework, precision=precision,
                       processes=processes)


@cache
def sample(framework: str) -> tuple[Case, ...]:
    """Top layouts plus the best layout with each feature, for every problem."""
    cases: list[Case] = []
    for model, cluster, precision in PROBLEMS:
        cfg = problem(model, cluster, framework, precision)
        rows = enumerate_layouts(cfg, load_space(None, framework)).feasible.rows()
        chosen = list(rows[:TOP])
        for check in FEATURES.values():
            chosen.extend(next(([row] for row in rows if check(cfg, row)), []))
        cases.extend(Case(cfg, layout) for layout in dict.fromkeys(chosen))
    return tuple(cases)
