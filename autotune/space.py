"""Search spaces (candidate values per dimension) and their enumeration through the rules.

A space file may write `derived` for tp, pp, cp or vpp: the candidates then come from the model
and the cluster (`derived_values`): tp the divisors of the GPUs per node; pp every degree that
divides the GPUs and splits the layers (evenly, with the embedding/loss counted as layers, or with
smaller edge stages, as the framework allows); vpp every interleaving some such pp admits; cp
the powers of two up to seq/4096 (a chunk of at least 4096 tokens per rank). The space itself
keeps the bounded superset (`DERIVED_SUPERSET`) as its list, so a study's sampler sees fixed
choices; enumeration narrows it per problem.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError

from autotune.constants import Constants
from autotune.constants import constants_for
from autotune.estimate import evaluate
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.inputs import validation_message
from autotune.layout import OFFLOADS
from autotune.layout import RECOMPUTES
from autotune.layout import SEARCH_DIMS
from autotune.layout import LayoutTable
from autotune.layout import derive_dp_gas
from autotune.resources import resource_dir
from autotune.rules import apply_rules
from autotune.specs import AutotuneConfig

DERIVED = "derived"
"""The value a space file writes for a dimension derived from the model and the cluster."""
DERIVED_SUPERSET: dict[str, list[int]] = {
    "tp": [1, 2, 4, 8, 16],
    "pp": list(range(1, 65)),
    "cp": [1, 2, 4, 8, 16, 32, 64],
    "vpp": list(range(1, 17)),
}
"""The candidates a derived dimension may take on any problem."""
CP_MIN_TOKENS = 4096
"""Fewest tokens per context-parallel rank a derived cp leaves (cp up to seq/4096)."""


class SearchSpace(BaseModel):
    """Candidate values of each layout dimension (dp and gas are derived, never listed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = "custom"
    """Where the space came from."""
    tp: list[int] = Field(default=[1, 2, 4, 8], min_length=1)
    """Tensor-parallel degrees."""
    pp: list[int] = Field(default=[1, 2, 4, 8], min_length=1)
    """Pipeline-parallel degrees."""
    cp: list[int] = Field(default=[1], min_length=1)
    """Context-parallel degrees."""
    vpp: list[int] = Field(default=[1], min_length=1)
    """Virtual pipeline stages per pipeline rank (interleaving)."""
    zero: list[int] = Field(default=[0, 1], min_length=1)
    """ZeRO stages (Megatron: 0 DDP, 1 distributed optimizer, 2/3 Megatron-FSDP)."""
    offload: list[str] = Field(default=["none"], min_length=1)
    """Offload choices: none, optimizer, optimizer+params."""
    mbs: list[int] = Field(default=[1, 2, 4], min_length=1)
    """Micro-batch sizes (sequences)."""
    recompute: list[str] = Field(default=["none", "selective", "full"], min_length=1)
    """Activation recompute: none, selective, full."""
    sp: list[bool] = Field(default=[True, False], min_length=1)
    """Megatron sequence parallelism on/off."""
    derived: list[str] = Field(default=[])
    """Dimensions whose candidates are derived per problem (`derived_values`) within their
    list."""

    def model_post_init(self, _: Any) -> None:
        for dim in ("tp", "pp", "cp", "vpp", "mbs"):
            if any(v < 1 for v in getattr(self, dim)):
                raise ValueError(f"{dim}: every value must be >= 1")
        if any(z not in (0, 1, 2, 3) for z in self.zero):
            raise ValueError("zero: values must be among 0, 1, 2, 3")
        if set(self.derived) - set(DERIVED_SUPERSET):
            raise ValueError(f"derived: only {', '.join(DERIVED_SUPERSET)} can be derived")
        for dim, options in (("offload", OFFLOADS), ("recompute", RECOMPUTES)):
            bad = [v for v in getattr(self, dim) if v not in options]
            if bad:
                raise ValueError(f"{dim}: {bad} not among {', '.join(options)}")

    @property
    def size(self) -> int:
        """Candidates before any rule."""
        return int(np.prod([len(getattr(self, d)) for d in SEARCH_DIMS]))




def load_space(ref: str | None, framework: str) -> SearchSpace:
    """The framework's default space, a bundled space by name, or a YAML file."""
    folder = resource_dir("search_spaces")
    path = folder / f"{ref or framework}.yaml"
    if ref and not path.exists():
        path = Path(ref)
    if not path.exists():
        bundled = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise AutotuneError(f"--space: {ref!r} is neither a file nor a bundled space ({bundled})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise AutotuneError(f"--space: {path} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise AutotuneError(f"--space: {path} must be a mapping of dimension: [values]")
    data.pop("framework", None)
    dims = dict(data.get("dims", data))
    derived = [dim for dim, value in dims.items() if value == DERIVED]
    wrong = sorted(set(derived) - set(DERIVED_SUPERSET))
    if wrong:
        raise AutotuneError(f"--space {path}: {', '.join(wrong)} cannot be '{DERIVED}'; only "
                            f"{', '.join(DERIVED_SUPERSET)} can")
    dims.update({dim: DERIVED_SUPERSET[dim] for dim in derived})
    try:
        return SearchSpace(name=str(path.stem), derived=derived, **dims)
    except ValidationError as error:
        raise AutotuneError(validation_message(error, f"--space {path}")) from None
    except ValueError as error:
        raise AutotuneError(f"--space {path}: {error}") from None


def derived_values(cfg: AutotuneConfig, dim: str) -> list[int]:
    """The candidates of a derived dimension for this model and cluster (see the module)."""
    world, layers = cfg.world_size, cfg.model.num_layers
    if dim == "tp":
        gpn = cfg.cluster.gpus_per_node
        return [t for t in range(1, gpn + 1) if gpn % t == 0]
    if dim == "cp":
        most = max(1, cfg.train.seq_length // CP_MIN_TOKENS)
        return [c for c in DERIVED_SUPERSET["cp"] if c <= most and world % c == 0]
    pairs = _pipeline_pairs(cfg, [p for p in range(1, min(layers, world) + 1) if world % p == 0],
                            DERIVED_SUPERSET["vpp"])
    if dim == "pp":
        return sorted({p for p, _ in pairs})
    return sorted({v for _, v in pairs})


def _pipeline_pairs(cfg: AutotuneConfig, pps: list[int], vpps: list[int]) -> list[tuple[int, int]]:
    """(pp, vpp) pairs whose layer split the framework accepts."""
    grid = np.array([(p, v) for p in pps for v in vpps if v == 1 or p > 1], dtype=np.int64)
    legal = framework_of(cfg).split_layers(cfg, grid[:, 0], grid[:, 1]).legal
    return [(int(p), int(v)) for p, v in grid[legal]]


def narrowed(cfg: AutotuneConfig, space: SearchSpace) -> SearchSpace:
    """The space with each derived dimension narrowed to this problem's candidates."""
    update = {}
    for dim in space.derived:
        values = [v for v in derived_values(cfg, dim) if v in getattr(space, dim)]
        update[dim] = values or getattr(space, dim)[:1]
    return space.model_copy(update=update)


def candidates(cfg: AutotuneConfig, space: SearchSpace) -> LayoutTable:
    """The cartesian product of the space (derived dimensions narrowed to the problem), with dp
    and gas derived (0 where impossible)."""
    space = narrowed(cfg, space)
    grids = np.meshgrid(
        np.array(space.tp),
        np.array(space.pp),
        np.array(space.cp),
        np.array(space.vpp),
        np.array(space.zero),
        np.array([OFFLOADS.index(o) for o in space.offload]),
        np.array(space.mbs),
        np.array([RECOMPUTES.index(r) for r in space.recompute]),
        np.array(space.sp, dtype=bool),
        indexing="ij",
    )
    tp, pp, cp, vpp, zero, offload, mbs, recompute, sp = (g.ravel() for g in grids)
    tp, pp, cp, vpp, zero, offload, mbs = (
        a.astype(np.int64) for a in (tp, pp, cp, vpp, zero, offload, mbs)
    )
    dp, gas = derive_dp_gas(cfg.world_size, cfg.train.global_batch_size, tp * pp * cp, mbs)
    return LayoutTable(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        vpp=vpp,
        zero=zero,
        offload=offload,
        mbs=mbs,
        gas=gas,
        recompute=recompute.astype(np.int64),
        sp=sp,
    )


@dataclasses.dataclass(slots=True)
class Enumeration:
    """Feasible layouts (ranked fastest first) with their figures, and what each rule removed."""

    feasible: LayoutTable
    values: dict[str, Any]
    removed: dict[str, int]
    total: int

    def __len__(self) -> int:
        return len(self.feasible)


def _take(values: dict[str, Any], index: np.ndarray) -> dict[str, Any]:
    return {k: (_take(v, index) if isinstance(v, dict) else v[index]) for k, v in values.items()}


def enumerate_layouts(
    cfg: AutotuneConfig, space: SearchSpace, k: Constants | None = None
) -> Enumeration:
    """Apply the framework's rules to the space; rank survivors by predicted throughput."""
    k = k or constants_for(cfg.cluster.gpu)
    table = candidates(cfg, space)
    total = len(table)
    table, removed = apply_rules(cfg, table, k)
    values = evaluate(cfg, table, k)
    order = np.argsort(-values["tokens_per_s"], kind="stable")
    return Enumeration(table.take(order), _take(values, order), removed, total)


def no_feasible_message(result: Enumeration) -> str:
    """Why nothing survived: the rules that removed candidates, largest first."""
    top = sorted(((n, c) for n, c in result.removed.items() if c), key=lambda item: -item[1])
    listed = "; ".join(f"{name} removed {count}" for name, count in top)
    return (
        f"no feasible layout among {result.total} candidates ({listed}). Widen the search space, "
        "add GPUs, or lower --gbs/--seq."
    )
