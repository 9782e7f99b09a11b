"""How many transformer layers each pipeline stage holds (the one source of truth for splits).

Megatron splits layers evenly over pp·vpp model chunks, or, when they do not divide, lets the first
and last stage hold fewer layers (`--decoder-first-pipeline-num-layers` /
`--decoder-last-pipeline-num-layers`): Llama 3 405B's 126 layers run on pp=16 as 7 + 14·8 + 7.
DeepSpeed's PipelineModule (partition_method "uniform") balances layer counts to within one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.specs import AutotuneConfig


@dataclasses.dataclass(slots=True)
class StageSplit:
    """Layers on the first, a middle and the last pipeline stage (per candidate), and legality."""

    first: np.ndarray
    middle: np.ndarray
    last: np.ndarray
    uneven: np.ndarray
    legal: np.ndarray

    @property
    def most(self) -> np.ndarray:
        """Layers on the most loaded stage."""
        return np.maximum(np.maximum(self.first, self.middle), self.last)


def uneven_edge_layers(num_layers: int, pp: int, vpp: int = 1) -> int | None:
    """Layers on the first and on the last stage when Megatron needs an uneven split, else None.

    The middle pp−2 stages hold equal, larger-or-equal counts; with vpp>1 every stage's count must
    be divisible by vpp. Returns None when no such split exists (or an even split does).
    """
    if pp < 3 or num_layers % pp == 0:
        return None
    for edge in range(num_layers // pp, 0, -1):
        rest = num_layers - 2 * edge
        if rest % (pp - 2) == 0 and rest // (pp - 2) >= edge:
            middle = rest // (pp - 2)
            if edge % vpp == 0 and middle % vpp == 0:
                return edge
    return None


def split_layers(cfg: AutotuneConfig, pp: np.ndarray, vpp: np.ndarray) -> StageSplit:
    """Layer counts per stage for every (pp, vpp) candidate pair."""
    num_layers = cfg.model.num_layers
    n = pp.shape[0]
    first, middle, last = (np.zeros(n, dtype=np.int64) for _ in range(3))
    uneven = np.zeros(n, dtype=bool)
    legal = np.zeros(n, dtype=bool)
    megatron = cfg.train.framework == "megatron"
    for p, v in {(int(a), int(b)) for a, b in zip(pp, vpp, strict=True)}:
        rows = (pp == p) & (vpp == v)
        if p > num_layers:
            continue
        if not megatron:  # PipelineModule "uniform": counts within one; bound each by the larger
            heavy = -(-num_layers // p)
            first[rows], middle[rows], last[rows] = heavy, heavy, heavy
            legal[rows] = True
            continue
        if num_layers % (p * v) == 0:
            even = num_layers // p
            first[rows], middle[rows], last[rows] = even, even, even
            legal[rows] = True
            continue
        edge = uneven_edge_layers(num_layers, p, v)
        if edge is not None:
            first[rows], last[rows] = edge, edge
            middle[rows] = (num_layers - 2 * edge) // (p - 2)
            uneven[rows], legal[rows] = True, True
    return StageSplit(first=first, middle=middle, last=last, uneven=uneven, legal=legal)
