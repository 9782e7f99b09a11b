"""Layouts for the render tests: every feasible one for the property tests, a few as examples.

`feasible_cases(framework)` is a hypothesis strategy over every feasible layout of every problem
below. `sample(framework)` is the example set: from the top layouts and the best layout with each
feature of every problem, the fewest (greedy set cover) that show every feature, precision and
problem at least once. The sampled layouts fell into a few dozen structural shapes; one example
of each feature plus the property tests over all of them check the same ground with fewer tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from typing import TypeVar

from hypothesis import example
from hypothesis import settings
from hypothesis import strategies as st

from autotune import AutotuneConfig
from autotune import Layout
from autotune import enumerate_layouts
from autotune import load_config
from autotune import load_space
from autotune.frameworks.megatron.args import pipeline_plan

PROBLEMS = (
    ("gpt3-175b", "dgx-a100:128", None),
    ("llama3-405b", "dgx-h100:2048", None),
    ("llama2-7b", "dgx-h100:1", "fp16"),
    ("llama3-8b", "dgx-h100:1", "fp8"),
    ("llama3-8b", "dgx-h100:2", None),
    ("llama3-8b", "dgx-h100:4", None),
    ("tiny-gpt", "local", None),
    ("mixtral-8x7b", "dgx-h100:8", None),
    ("mixtral-8x7b", "dgx-h100:8", None, 32768),  # long enough for cp beside ep
    ("deepseek-v3", "dgx-h100:256", None),
    ("tiny-moe", "local", None),
)
"""Problems of both frameworks' render tests: model, cluster, precision (None: the preset's
default) and, where given, the sequence length."""
TOP = 10
"""Best-ranked layouts of each enumeration that the examples are chosen from."""
PROPERTY = settings(max_examples=60, deadline=None, print_blob=True)
"""Settings of the property tests over feasible layouts (each draw costs milliseconds)."""
Test = TypeVar("Test", bound=Callable[..., None])


def _uneven(cfg: AutotuneConfig, layout: Layout) -> bool:
    plan = pipeline_plan(cfg.model.num_layers, layout.pp, layout.vpp)
    return plan is not None and plan.edge


def _first_last_apart(cfg: AutotuneConfig, layout: Layout) -> bool:
    plan = pipeline_plan(cfg.model.num_layers, layout.pp, layout.vpp)
    return plan is not None and plan.first != plan.last


def _custom(cfg: AutotuneConfig, layout: Layout) -> bool:
    plan = pipeline_plan(cfg.model.num_layers, layout.pp, layout.vpp)
    return plan is not None and bool(plan.chunks)


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
    "uneven-apart": lambda c, lay: _uneven(c, lay) and _first_last_apart(c, lay),
    "custom-layout": _custom,
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


def problem(model: str, cluster: str, framework: str, precision: str | None,
            seq_length: int | None = None) -> AutotuneConfig:
    """The config of one sampled problem (`local` is two worker processes)."""
    processes = 2 if cluster == "local" else None
    return load_config(model, cluster, framework=framework, precision=precision,
                       processes=processes, seq_length=seq_length)


@cache
def feasible(framework: str, index: int) -> tuple[AutotuneConfig, tuple[Layout, ...]]:
    """Problem `index` of PROBLEMS and every feasible layout of it, fastest first."""
    model, cluster, precision, *seq_length = PROBLEMS[index]
    cfg = problem(model, cluster, framework, precision, *seq_length)
    return cfg, tuple(enumerate_layouts(cfg, load_space(None, framework)).feasible.rows())


def feasible_cases(framework: str) -> st.SearchStrategy[Case]:
    """Any feasible layout of any problem (the framework's default search space)."""

    def of_problem(index: int) -> st.SearchStrategy[Case]:
        cfg, rows = feasible(framework, index)
        return st.sampled_from(rows).map(lambda layout: Case(cfg, layout))

    return st.integers(0, len(PROBLEMS) - 1).flatmap(of_problem)


def _shows(case: Case) -> set[str]:
    """The features, precision and problem a case is an example of."""
    cfg = case.cfg
    return {name for name, check in FEATURES.items() if check(cfg, case.layout)} | {
        f"precision {cfg.train.precision}", f"problem {cfg.model.name}@{cfg.cluster.name}"}


@cache
def sample(framework: str) -> tuple[Case, ...]:
    """The fewest cases (greedy) that show everything the candidates show: the top layouts plus
    the best layout with each feature, of every problem."""
    candidates: list[Case] = []
    for index in range(len(PROBLEMS)):
        cfg, rows = feasible(framework, index)
        chosen = list(rows[:TOP])
        for check in FEATURES.values():
            chosen.extend(next(([row] for row in rows if check(cfg, row)), []))
        candidates.extend(Case(cfg, layout) for layout in dict.fromkeys(chosen))
    wanted = set().union(*map(_shows, candidates))
    cases: list[Case] = []
    while wanted:
        best = max(candidates, key=lambda case: len(_shows(case) & wanted))
        cases.append(best)
        wanted -= _shows(best)
    return tuple(cases)


def on_every_sample(framework: str) -> Callable[[Test], Test]:
    """Decorate a `@given(case=feasible_cases(framework))` test to run first on `sample`."""

    def decorate(test: Test) -> Test:
        for case in sample(framework):
            test = example(case=case)(test)
        return test

    return decorate
