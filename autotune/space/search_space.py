"""Search spaces (candidate values per dimension) and their enumeration through the rules.

A space file may write `derived` for tp, pp, cp or vpp: the candidates then come from the model
and the cluster (`derived_values`): tp the divisors of the GPUs per node; pp every degree that
divides the GPUs and splits the layers (evenly, with the embedding/loss counted as layers, or with
smaller edge stages, as the framework allows); vpp every interleaving some such pp admits; cp
the powers of two up to seq/4096 (a chunk of at least 4096 tokens per rank). The space itself
keeps the bounded superset (`DERIVED_SUPERSET`) as its list; `narrowed` cuts it per problem.
ep and etp may be `auto`: their candidates follow from the model's experts and each row's
expert grid (`candidates`). `SearchSpace.resolved` lists both for an Optuna study.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import Final
from typing import Literal

import numpy as np
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import StrictBool
from pydantic import ValidationError

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import Estimates
from autotune.costmodel.estimate import evaluate
from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.frameworks import framework_of
from autotune.layout import OFFLOADS
from autotune.layout import RECOMPUTES
from autotune.layout import SEARCH_DIMS
from autotune.layout import LayoutTable
from autotune.layout import derive_dp_gas
from autotune.resources import resource_dir
from autotune.space.rules import apply_rules
from autotune.specs import AutotuneConfig
from autotune.specs import BatchSize
from autotune.specs import Integer
from autotune.specs import LayerCount
from autotune.specs import at_most
from autotune.specs.inputs import existing_path
from autotune.specs.inputs import read_structured
from autotune.specs.inputs import validation_message

Degree = Annotated[Integer, Field(ge=1), at_most(2**20, "a million GPUs, beyond any cluster")]
"""A parallel degree of a search space."""

AUTO: Final = "auto"
"""A dimension whose candidates follow from the model and cluster (ep and etp)."""
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
    """Candidate values of each layout dimension (dp and gas are derived, never listed).

    A bare `SearchSpace()` is a small custom space (its field defaults); the space a command
    searches by default is the framework's bundled one, `load_space(None, framework)`
    (`search_spaces/<framework>.yaml`), which may derive tp, pp, cp and vpp per problem.

    ep and etp may be `auto` (the default): their candidates then follow from the model and
    each candidate's pipeline degree instead of being multiplied out (`candidates`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = "custom"
    """Where the space came from."""
    tp: list[Degree] = Field(default=[1, 2, 4, 8], min_length=1)
    """Tensor-parallel degrees."""
    pp: list[Degree] = Field(default=[1, 2, 4, 8], min_length=1)
    """Pipeline-parallel degrees."""
    cp: list[Degree] = Field(default=[1], min_length=1)
    """Context-parallel degrees."""
    vpp: list[LayerCount] = Field(default=[1], min_length=1)
    """Virtual pipeline stages per pipeline rank (interleaving)."""
    zero: list[Integer] = Field(default=[0, 1], min_length=1)
    """ZeRO stages (Megatron: 0 DDP, 1 distributed optimizer, 2/3 Megatron-FSDP)."""
    offload: list[str] = Field(default=["none"], min_length=1)
    """Offload choices: none, optimizer, optimizer+params."""
    mbs: list[BatchSize] = Field(default=[1, 2, 4], min_length=1)
    """Micro-batch sizes (sequences)."""
    recompute: list[str] = Field(default=["none", "selective", "full"], min_length=1)
    """Activation recompute: none, selective, full."""
    sp: list[StrictBool] = Field(default=[True, False], min_length=1)
    """Megatron sequence parallelism on/off."""
    ep: list[Degree] | Literal["auto"] = Field(default=AUTO, min_length=1)
    """Expert-parallel degrees. auto: every divisor of the model's num_experts that divides the
    candidate's expert data-parallel grid world / (pp·etp); 1 for a dense model."""
    etp: list[Degree] | Literal["auto"] = Field(default=AUTO, min_length=1)
    """Expert tensor-parallel degrees. auto: 1 and the candidate's tp for a MoE model (the
    MoE guide's recommendation and Megatron-LM's default); 1 for a dense model."""
    derived: list[str] = Field(default=[])
    """Dimensions whose candidates are derived per problem (`derived_values`) within their
    list."""

    def model_post_init(self, _: Any) -> None:
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
        """Candidates before any rule (of a resolved space: `auto` dimensions listed)."""
        if AUTO in (self.ep, self.etp):
            raise AutotuneError(f"search space {self.name}: resolve it for the problem first")
        return int(np.prod([len(getattr(self, d)) for d in SEARCH_DIMS]))

    def resolved(self, cfg: AutotuneConfig) -> SearchSpace:
        """This space for the problem: derived dimensions narrowed, every `auto` dimension
        listed with all the values its candidates can take (what an Optuna study chooses
        from)."""
        space = narrowed(cfg, self)
        moe = cfg.model.moe
        experts = cfg.model.num_experts or 1
        ep = [d for d in range(1, experts + 1) if experts % d == 0 and cfg.world_size % d == 0]
        etp = sorted({1, *space.tp}) if moe else [1]
        return space.model_copy(update={
            "ep": ep if space.ep == AUTO else space.ep,
            "etp": etp if space.etp == AUTO else space.etp,
        })



def load_space(ref: str | None, framework: str) -> SearchSpace:
    """The framework's default space, a bundled space by name, or a YAML file."""
    folder = resource_dir("search_spaces")
    path: Path | None = folder / f"{ref or framework}.yaml"
    if ref and not existing_path(str(path)):
        path = existing_path(ref)
    if path is None or not path.is_file():
        bundled = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise AutotuneError(
            f"--space: {shorten(ref)} is neither a file nor a bundled space ({bundled})"
        )
    try:
        data = read_structured(path)
    except AutotuneError as error:
        raise AutotuneError(f"--space: {error}") from None
    if not isinstance(data, dict):
        raise AutotuneError(f"--space: {path} must be a mapping of dimension: [values]")
    made_for = data.pop("framework", None)
    if made_for is not None and made_for != framework:
        raise AutotuneError(f"--space: {path.name} is a space for {made_for!r}, not "
                            f"{framework!r}; use --framework {made_for} or a space made for "
                            f"{framework}")
    dims = data.get("dims", data)
    if not isinstance(dims, dict):
        raise AutotuneError(f"--space: {path}: dims must be a mapping of dimension: [values]")
    dims = dict(dims)
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
    except (ValueError, TypeError) as error:
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


def _cross(
    columns: dict[str, np.ndarray], choices: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every row of `columns` once per choice: `choices` maps new column names to matrices of
    rows × choices; a choice holding a 0 is left out (rows with fewer choices)."""
    stacked = np.stack(list(choices.values()))
    rows, width = stacked.shape[1:]
    keep = np.all(stacked > 0, axis=0).ravel()
    index = np.repeat(np.arange(rows), width)[keep]
    out = {key: column[index] for key, column in columns.items()}
    out.update({name: values.ravel()[keep] for name, values in choices.items()})
    return out


def _expert_columns(
    cfg: AutotuneConfig, space: SearchSpace, columns: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Add etp and ep: listed values multiply every row; `auto` gives each row its own."""
    tp, n = columns["tp"], len(columns["tp"])
    resolved = space.resolved(cfg)
    if space.etp != AUTO or not cfg.model.moe:
        etp = np.tile(np.array(resolved.etp, dtype=np.int64), (n, 1))
    else:  # 1, and tp where tp > 1
        etp = np.stack([np.ones(n, dtype=np.int64), np.where(tp > 1, tp, 0)], axis=1)
    ep_values = np.array(resolved.ep, dtype=np.int64)
    # every (etp, ep) pair of a row: etp choice j, ep value i at column j·len(ep) + i
    etp_pairs = np.repeat(etp, len(ep_values), axis=1)
    ep_pairs = np.tile(ep_values, (n, etp.shape[1]))
    if space.ep == AUTO:  # only the ep that divide the expert data-parallel grid
        grid = np.maximum(columns["pp"][:, None] * etp_pairs * ep_pairs, 1)
        ep_pairs = np.where(cfg.world_size % grid == 0, ep_pairs, 0)
    return _cross(columns, {"etp": etp_pairs, "ep": ep_pairs})


def candidates(cfg: AutotuneConfig, space: SearchSpace) -> LayoutTable:
    """The cartesian product of the space (derived dimensions narrowed to the problem; ep and
    etp per row where `auto`), with dp and gas derived (0 where impossible)."""
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
    columns = _expert_columns(cfg, space, {
        "tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "zero": zero, "offload": offload, "mbs": mbs,
        "recompute": recompute.astype(np.int64), "sp": sp,
    })
    product = columns["tp"] * columns["pp"] * columns["cp"]
    columns["dp"], columns["gas"] = derive_dp_gas(
        cfg.world_size, cfg.train.global_batch_size, product, columns["mbs"])
    return LayoutTable(**columns)


@dataclasses.dataclass(slots=True)
class Enumeration:
    """Feasible layouts (ranked fastest first) with their figures, and what each rule removed."""

    estimates: Estimates
    removed: dict[str, int]
    total: int

    @property
    def feasible(self) -> LayoutTable:
        """The feasible layouts, fastest first."""
        return self.estimates.table

    def __len__(self) -> int:
        return len(self.estimates)


def enumerate_layouts(
    cfg: AutotuneConfig, space: SearchSpace, k: Constants | None = None
) -> Enumeration:
    """Apply the framework's rules to the space; rank survivors by predicted throughput."""
    k = k or constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    table = candidates(cfg, space)
    total = len(table)
    table, removed = apply_rules(cfg, table, k)
    estimates = evaluate(cfg, table, k)
    order = np.argsort(-estimates.tokens_per_s, kind="stable")
    return Enumeration(estimates.take(order), removed, total)


def no_feasible_message(result: Enumeration) -> str:
    """Why nothing survived: the rules that removed candidates, largest first."""
    top = sorted(((n, c) for n, c in result.removed.items() if c), key=lambda item: -item[1])
    listed = "; ".join(f"{name} removed {count}" for name, count in top)
    return (
        f"no feasible layout among {result.total} candidates ({listed}). Widen the search space, "
        "add GPUs, or lower --gbs/--seq."
    )
