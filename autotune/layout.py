"""A parallel layout (the unit every stage passes along) and its columnar form for fast use."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any
from typing import Protocol

import numpy as np
import numpy.typing as npt

from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.specs import MAX_LAYERS

OFFLOADS = ("none", "optimizer", "optimizer+params")
"""Offload choices, in code order (the table stores their index)."""
RECOMPUTES = ("none", "selective", "full")
"""Activation recompute choices, in code order."""


@dataclasses.dataclass(frozen=True)
class Dim:
    """One dimension of a layout: what the search, the surrogate and the families read."""

    name: str
    kind: str
    """grid (the tp·pp·cp·ep·etp factorisation), structure (another factor of a family: ZeRO,
    recompute), refinement (vpp, mbs, sp, offload: variants within a family) or derived (dp and
    gas follow from the others)."""
    type: str
    """int, choice (an index into `choices`) or bool."""
    limit_reason: str = ""
    """Why an integer's --layout upper bound is what it is."""
    log_scaled: bool = False
    """The surrogate reads it as log2 (degrees and sizes that double)."""
    choices: tuple[str, ...] = ()


DIMS = (
    Dim("tp", "grid", "int", "the cluster's GPUs", log_scaled=True),
    Dim("pp", "grid", "int", "the cluster's GPUs", log_scaled=True),
    Dim("dp", "derived", "int", "the cluster's GPUs"),
    Dim("cp", "grid", "int", "the cluster's GPUs", log_scaled=True),
    Dim("vpp", "refinement", "int", "a virtual stage holds one layer at least", log_scaled=True),
    Dim("zero", "structure", "int", "ZeRO stages are 0 to 3"),
    Dim("offload", "refinement", "choice", choices=OFFLOADS),
    Dim("mbs", "refinement", "int", "the global batch", log_scaled=True),
    Dim("gas", "derived", "int", "the global batch"),
    Dim("recompute", "structure", "choice", choices=RECOMPUTES),
    Dim("sp", "refinement", "bool"),
    Dim("ep", "grid", "int", "the cluster's GPUs", log_scaled=True),
    Dim("etp", "grid", "int", "the cluster's GPUs", log_scaled=True),
)
"""Every field of a layout, in `Layout`'s order: the one table the search space, the layout
parser, the columnar table, the surrogate's features and the proposer's families iterate."""
SEARCH_DIMS = tuple(d.name for d in DIMS if d.kind != "derived")
"""The dimensions a search space chooses; dp and gas follow from them."""
GRID_DIMS = tuple(d.name for d in DIMS if d.kind == "grid")
"""The parallel grid: tp, pp, cp, ep, etp."""
LIMIT_REASONS = {d.name: d.limit_reason for d in DIMS if d.limit_reason}
"""Why each --layout number has its upper bound."""


class LayoutDefaults(Protocol):
    """What a layout gets when the text leaves a dimension out (a framework's bundle)."""

    @property
    def default_zero(self) -> int: ...

    def default_sp(self, tp: int) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """How one training run is split over the cluster.

    world = tp·pp·cp·dp; global batch = mbs·dp·gas. `offload` is none, optimizer or
    optimizer+params; `recompute` none, selective or full; `sp` is Megatron's sequence parallelism.

    The MoE layers of a Mixture-of-Experts model fold the same GPUs into a second grid (Megatron's
    "MoE parallel folding"): world = etp·ep·pp·edp, where `ep` splits the routed experts and
    `etp` splits each expert's matrices; the expert data-parallel degree edp follows. `etp` is
    explicit (default 1, what Megatron-LM recommends for fine-grained experts): Megatron-LM's own
    default, etp = tp when `--expert-tensor-parallel-size` is absent, is never relied on, since
    rendered scripts always pass it. A dense model has ep = etp = 1 (the rules reject others).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vpp: int = 1
    zero: int = 0
    offload: str = "none"
    mbs: int = 1
    gas: int = 1
    recompute: str = "none"
    sp: bool = False
    ep: int = 1
    etp: int = 1

    @property
    def model_parallel(self) -> int:
        """GPUs of one model replica: tp·pp·cp."""
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        """GPUs the layout occupies."""
        return self.model_parallel * self.dp

    @property
    def shard_degree(self) -> int:
        """Ranks that ZeRO / the distributed optimizer shard states over: dp·cp."""
        return self.dp * self.cp

    @property
    def micro_batches(self) -> int:
        """Micro-batches each replica runs per optimizer step (gradient accumulation)."""
        return self.gas

    @property
    def moe_parallel(self) -> bool:
        """Experts are split (ep or etp above 1)."""
        return self.ep > 1 or self.etp > 1

    @property
    def expert_grid(self) -> int:
        """GPUs of one expert replica: etp·ep·pp (the world must be a multiple)."""
        return self.etp * self.ep * self.pp

    @property
    def expert_data_parallel(self) -> int:
        """edp = world/(etp·ep·pp): ranks that hold the same experts."""
        return self.world_size // self.expert_grid

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step."""
        return self.mbs * self.dp * self.gas

    @property
    def text(self) -> str:
        """The CLI form, e.g. `tp=8,pp=4,cp=1,vpp=1,zero=1,offload=none,mbs=1,...`; `ep` and
        `etp` appear only when experts are split (so dense layouts read as they always did)."""
        experts = f",ep={self.ep},etp={self.etp}" if self.moe_parallel else ""
        return (
            f"tp={self.tp},pp={self.pp},cp={self.cp},vpp={self.vpp},zero={self.zero},"
            f"offload={self.offload},mbs={self.mbs},recompute={self.recompute},"
            f"sp={'on' if self.sp else 'off'}{experts}"
        )

    @property
    def id(self) -> str:
        """A short name usable in file names, unique per layout (`-ep2-etp1` appended only when
        experts are split, so the ids of dense layouts, and of studies that hold them, stay)."""
        rc = {"none": "rn", "selective": "rs", "full": "rf"}[self.recompute]
        off = {"none": "", "optimizer": "-oo", "optimizer+params": "-op"}[self.offload]
        experts = f"-ep{self.ep}-etp{self.etp}" if self.moe_parallel else ""
        return (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{self.cp}-v{self.vpp}-z{self.zero}{off}"
            f"-mb{self.mbs}-{rc}{'-sp' if self.sp else ''}{experts}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)

    def validate(self, world_size: int, global_batch_size: int | None = None) -> None:
        """Raise AutotuneError unless the degrees multiply to the world (and batch) size."""
        if self.world_size != world_size:
            raise AutotuneError(
                f"layout: tp ({self.tp}) · pp ({self.pp}) · cp ({self.cp}) · dp ({self.dp}) = "
                f"{self.world_size}, but the cluster has {world_size} GPUs"
            )
        if global_batch_size is not None and self.global_batch_size != global_batch_size:
            raise AutotuneError(
                f"layout: mbs ({self.mbs}) · dp ({self.dp}) · gas ({self.gas}) = "
                f"{self.global_batch_size}, but the global batch is {global_batch_size}"
            )

    @classmethod
    def derived(cls, world_size: int, global_batch_size: int, **dims: Any) -> Layout:
        """A layout from its search dimensions, dp and gas derived (0 where they cannot be:
        the rules then reject it)."""
        product = dims.get("tp", 1) * dims.get("pp", 1) * dims.get("cp", 1)
        dp, gas = derive_dp_gas(world_size, global_batch_size, product, dims.get("mbs", 1))
        return cls(dp=int(dp), gas=int(gas), **dims)

    def resized(self, gpus: int, mode: str, global_batch_size: int) -> Layout:
        """This layout on `gpus` GPUs: tp, pp, cp, ep, etp and the rest fixed,
        dp = gpus / (tp·pp·cp) (the rules check that ep·etp·pp still divides the GPUs).

        `weak` keeps each replica's batch (mbs·gas), so the global batch grows with dp;
        `strong` keeps `global_batch_size`, so gas shrinks.

        Raises:
            AutotuneError: the size holds no whole replicas, or (strong) mbs·dp does not
                divide the global batch.
        """
        if gpus % self.model_parallel:
            raise AutotuneError(
                f"tp·pp·cp = {self.tp}·{self.pp}·{self.cp} = {self.model_parallel} does not "
                f"divide {gpus} GPUs"
            )
        dp = gpus // self.model_parallel
        if mode == "weak":
            return dataclasses.replace(self, dp=dp)
        if global_batch_size % (self.mbs * dp):
            raise AutotuneError(
                f"strong scaling keeps the global batch {global_batch_size}, which mbs·dp = "
                f"{self.mbs}·{dp} does not divide"
            )
        return dataclasses.replace(self, dp=dp, gas=global_batch_size // (self.mbs * dp))

    @classmethod
    def parse(
        cls, text: str, world_size: int, global_batch_size: int, defaults: LayoutDefaults
    ) -> Layout:
        """Read the CLI form; dp and gas are derived, zero and sp default as `defaults` says.

        Each key may appear once; dp and gas, when given, must equal the derived values.

        Raises:
            AutotuneError: naming the key, its value (shortened) and the fix.
        """
        values: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in SEARCH_DIMS + ("dp", "gas"):
                raise AutotuneError(
                    f"--layout: cannot read {shorten(item, 40)}; write key=value pairs with keys "
                    f"{', '.join(SEARCH_DIMS)}, e.g. tp=8,pp=4,zero=1,mbs=1,recompute=selective"
                )
            if key in values:
                raise AutotuneError(
                    f"--layout: {key} is given twice ({key}={shorten(values[key], 20)} and "
                    f"{key}={shorten(value.strip(), 20)}); give each key once"
                )
            values[key] = value.strip()
        limits = {"tp": world_size, "pp": world_size, "cp": world_size, "dp": world_size,
                  "mbs": global_batch_size, "gas": global_batch_size, "zero": 3,
                  "vpp": MAX_LAYERS, "ep": world_size, "etp": world_size}

        def integer(key: str, default: int) -> int:
            raw = values.get(key)
            if raw is None:
                return default
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 12:
                raise AutotuneError(
                    f"--layout: {key}={shorten(raw, 20)} must be an integer from "
                    f"{0 if key == 'zero' else 1} to {limits[key]:,}"
                )
            number = int(raw)
            if number == 0 and key != "zero":
                raise AutotuneError(f"--layout: {key}=0 must be positive")
            if number > limits[key]:
                raise AutotuneError(
                    f"--layout: {key}={number:,} exceeds {limits[key]:,} ({LIMIT_REASONS[key]})"
                )
            return number

        def choice(key: str, options: Sequence[str], default: str) -> str:
            raw = values.get(key, default)
            if raw not in options:
                raise AutotuneError(
                    f"--layout: {key}={shorten(raw, 20)} must be one of {', '.join(options)}"
                )
            return raw

        tp, pp, cp = integer("tp", 1), integer("pp", 1), integer("cp", 1)
        mbs = integer("mbs", 1)
        model_parallel = tp * pp * cp
        dp, gas = (int(n) for n in derive_dp_gas(world_size, global_batch_size, model_parallel,
                                                  mbs))
        if not dp:
            raise AutotuneError(
                f"--layout: tp·pp·cp = {tp}·{pp}·{cp} = {model_parallel} does not divide the "
                f"{world_size} GPUs of the cluster; pick degrees whose product divides it"
            )
        if "dp" in values and integer("dp", dp) != dp:
            raise AutotuneError(
                f"--layout: dp={values['dp']} contradicts tp·pp·cp·dp = {world_size}; "
                f"drop dp (it is derived: {dp})"
            )
        if global_batch_size % (mbs * dp):
            raise AutotuneError(
                f"--layout: the global batch {global_batch_size} is not divisible by mbs·dp = "
                f"{mbs}·{dp}; change mbs or --gbs"
            )
        if "gas" in values and integer("gas", gas) != gas:
            raise AutotuneError(
                f"--layout: gas={values['gas']} contradicts the global batch {global_batch_size} "
                f"= mbs·dp·gas = {mbs}·{dp}·gas; drop gas (it is derived: {gas}) or change --gbs"
            )
        sp_default = "on" if defaults.default_sp(tp) else "off"
        sp = choice("sp", ("on", "off", "true", "false", "1", "0"), sp_default)
        zero = integer("zero", defaults.default_zero)
        return cls.derived(
            world_size,
            global_batch_size,
            tp=tp,
            pp=pp,
            cp=cp,
            vpp=integer("vpp", 1),
            zero=zero,
            offload=choice("offload", OFFLOADS, "none"),
            mbs=mbs,
            recompute=choice("recompute", RECOMPUTES, "none"),
            sp=sp in ("on", "true", "1"),
            ep=integer("ep", 1),
            etp=integer("etp", 1),
        )


def derive_dp_gas(world_size: int, global_batch_size: int, model_parallel: Any, mbs: Any) -> Any:
    """(dp, gas) for scalars or numpy arrays: dp = world / (tp·pp·cp) and gas = gbs / (mbs·dp),
    0 where they do not divide (the rules reject those)."""
    dp = np.where(world_size % model_parallel == 0, world_size // model_parallel, 0)
    gas = np.where(dp > 0, global_batch_size // np.maximum(mbs * dp, 1), 0)
    return dp, gas


IntArray = npt.NDArray[np.int64]
"""A column of integers, one per layout."""
BoolArray = npt.NDArray[np.bool_]
"""A column of flags, one per layout (True where a layout breaks a rule, for a rule's check)."""

_INT_FIELDS = tuple(d.name for d in DIMS if d.type == "int")


@dataclasses.dataclass(slots=True)
class LayoutTable:
    """Many layouts as parallel numpy columns, so rules and models evaluate them at once.

    `offload` and `recompute` hold indices into OFFLOADS and RECOMPUTES; `sp` is boolean.
    """

    tp: IntArray
    pp: IntArray
    dp: IntArray
    cp: IntArray
    vpp: IntArray
    zero: IntArray
    offload: IntArray
    mbs: IntArray
    gas: IntArray
    recompute: IntArray
    sp: BoolArray
    ep: IntArray
    etp: IntArray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @property
    def model_parallel(self) -> IntArray:
        """GPUs of one model replica: tp·pp·cp."""
        return self.tp * self.pp * self.cp

    @property
    def shard_degree(self) -> IntArray:
        """Ranks that ZeRO / the distributed optimizer shard states over: dp·cp."""
        return self.dp * self.cp

    @property
    def micro_batches(self) -> IntArray:
        """Micro-batches each replica runs per optimizer step (at least 1)."""
        return np.maximum(self.gas, 1)

    @property
    def world_size(self) -> IntArray:
        """GPUs each layout occupies."""
        return self.model_parallel * self.dp

    @property
    def moe_parallel(self) -> BoolArray:
        """Experts are split (ep or etp above 1)."""
        return (self.ep > 1) | (self.etp > 1)

    @property
    def expert_grid(self) -> IntArray:
        """GPUs of one expert replica: etp·ep·pp (the world must be a multiple)."""
        return self.etp * self.ep * self.pp

    @property
    def global_batch_size(self) -> IntArray:
        """Sequences per optimizer step."""
        return self.mbs * self.dp * self.gas

    @property
    def expert_data_parallel(self) -> np.ndarray:
        """edp = world/(etp·ep·pp): ranks that hold the same experts (ZeRO shards their
        states over them)."""
        edp: np.ndarray = self.tp * self.cp * self.dp / (self.etp * self.ep)
        return edp

    @classmethod
    def from_layouts(cls, layouts: Iterable[Layout]) -> LayoutTable:
        """Columns of the given layouts, in order."""
        rows = list(layouts)
        columns: dict[str, np.ndarray] = {
            name: np.array([getattr(row, name) for row in rows], dtype=np.int64)
            for name in _INT_FIELDS
        }
        for d in DIMS:
            if d.type == "choice":
                columns[d.name] = np.array([d.choices.index(getattr(r, d.name)) for r in rows],
                                           dtype=np.int64)
            elif d.type == "bool":
                columns[d.name] = np.array([getattr(r, d.name) for r in rows], dtype=bool)
        return cls(**columns)

    def take(self, index: np.ndarray) -> LayoutTable:
        """The rows selected by a boolean mask or an index array."""
        return LayoutTable(
            **{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)}
        )

    def row(self, i: int) -> Layout:
        """Row i as a Layout."""
        values: dict[str, Any] = {}
        for d in DIMS:
            value = getattr(self, d.name)[i]
            values[d.name] = (d.choices[int(value)] if d.type == "choice"
                              else bool(value) if d.type == "bool" else int(value))
        return Layout(**values)

    def rows(self) -> list[Layout]:
        """All rows as Layouts."""
        return [self.row(i) for i in range(len(self))]
