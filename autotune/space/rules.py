"""Every constraint a layout must satisfy, as named rules with one-line reasons.

The shared rules live in `autotune.frameworks.common`, each framework's own in its bundle, and
the two memory rules here. A rule's check takes the problem, a LayoutTable and the constants and
returns a boolean array, True where the layout breaks the rule. Rules run grouped (grid, tensor,
pipeline, context, ZeRO, memory; shared rules first within a group); enumeration charges each
removed candidate to the first rule it breaks.
"""

from __future__ import annotations

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.memory import estimate_memory
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.costmodel.memory import usable_host_bytes
from autotune.frameworks import FRAMEWORKS
from autotune.frameworks import get_framework
from autotune.frameworks.base import Rule
from autotune.frameworks.base import RuleGroup
from autotune.frameworks.base import rule
from autotune.frameworks.common import COMMON_RULES
from autotune.layout import BoolArray
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.units import GIB

MEMORY_RULES: list[Rule] = []
"""The rules that need the memory model (they run last)."""


@rule(
    MEMORY_RULES,
    "memory_fits",
    "peak memory {need_gib:.1f} GiB exceeds the usable {have_gib:.1f} GiB of a "
    "{c.gpu.memory_gb:g} GB GPU (after the fragmentation margin)",
    RuleGroup.MEMORY,
)
def _memory(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return estimate_memory(cfg, t, k).total > usable_gpu_bytes(cfg, k)


@rule(
    MEMORY_RULES,
    "host_memory_fits",
    "offloaded states need {need_gib:.1f} GiB of host memory per node; {have_gib:.1f} GiB usable",
    RuleGroup.MEMORY,
)
def _host(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return estimate_memory(cfg, t, k).host > usable_host_bytes(cfg, k)


MEMORY_RULE_NAMES = tuple(r.name for r in MEMORY_RULES)
"""Rules about memory: a layout that breaks only these is well formed, just too big."""


def rules_for(framework: str) -> list[Rule]:
    """The rules that apply to a framework, in the order they run."""
    found = [*COMMON_RULES, *get_framework(framework).rules, *MEMORY_RULES]
    return sorted(found, key=lambda r: r.group)


RULES: dict[str, Rule] = {r.name: r for name in FRAMEWORKS for r in rules_for(name)}
"""Every rule by name (a rule two frameworks define alike appears once)."""


def violations(
    cfg: AutotuneConfig, layout: Layout, k: Constants | None = None, *, memory: bool = True
) -> list[tuple[str, str]]:
    """Every rule (name, explained reason) that one layout breaks, in order.

    The memory rules are checked (unless `memory` is False) only for a layout that breaks no
    structural rule: the memory of a structurally broken layout means nothing.
    """
    k = k or constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    table = LayoutTable.from_layouts([layout])
    estimated = None
    found: list[tuple[str, str]] = []
    for r in rules_for(cfg.train.framework):
        if r.group == RuleGroup.MEMORY and (found or not memory):
            break
        with np.errstate(divide="ignore", invalid="ignore"):  # dp = 0 when the grid is broken
            if not bool(r.check(cfg, table, k)[0]):
                continue
        extra: dict[str, float] = {}
        if r.group == RuleGroup.MEMORY:
            estimated = estimated or estimate_memory(cfg, table, k)
            host = r.name == "host_memory_fits"
            extra["need_gib"] = float((estimated.host if host else estimated.total)[0]) / GIB
            extra["have_gib"] = (usable_host_bytes if host else usable_gpu_bytes)(cfg, k) / GIB
        found.append((r.name, r.explain(cfg, layout, **extra)))
    return found


def structural_violations(cfg: AutotuneConfig, layout: Layout) -> list[tuple[str, str]]:
    """The rules one layout breaks, memory aside (what a trial program checks before it runs)."""
    return violations(cfg, layout, memory=False)


def first_broken(
    cfg: AutotuneConfig, table: LayoutTable, k: Constants, *, memory: bool = True
) -> np.ndarray:
    """The index (in `rules_for` order) of the first rule each layout breaks, −1 where none.

    The one walk over the rules: each rule is checked only on the layouts that broke none
    before it (so the memory rules, last, estimate memory only for well-formed layouts);
    `memory=False` stops before them.
    """
    first = np.full(len(table), -1)
    open_rows = np.arange(len(table))
    for index, r in enumerate(rules_for(cfg.train.framework)):
        if not len(open_rows) or (r.group == RuleGroup.MEMORY and not memory):
            break
        candidates = table if len(open_rows) == len(table) else table.take(open_rows)
        with np.errstate(divide="ignore", invalid="ignore"):  # dp = 0 when the grid is broken
            broken = r.check(cfg, candidates, k)
        first[open_rows[broken]] = index
        open_rows = open_rows[~broken]
    return first


def apply_rules(
    cfg: AutotuneConfig, table: LayoutTable, k: Constants
) -> tuple[LayoutTable, dict[str, int]]:
    """The layouts of `table` that break no rule, and how many each rule removed (charged to
    the first rule a layout breaks)."""
    first = first_broken(cfg, table, k)
    counts = np.bincount(first + 1, minlength=len(rules_for(cfg.train.framework)) + 1)[1:]
    removed = {r.name: int(n) for r, n in zip(rules_for(cfg.train.framework), counts,
                                               strict=True)}
    return table.take(np.flatnonzero(first < 0)), removed
