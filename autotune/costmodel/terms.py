"""The terms a training framework adds to the cost model, as the model asks for them.

The memory and step-time models call these on the framework a problem trains with (its
`TrainSpec.framework`): how it splits layers over pipeline stages, pads the vocabulary, holds
model states and buffers, and how its collectives behave. The bundles in `autotune.frameworks`
implement them and register themselves here when that package is imported (the package face
`autotune` imports it), so the cost model depends on this contract, not on the bundles.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import ClassVar
from typing import Literal
from typing import Protocol

import numpy as np

from autotune.exceptions import AutotuneError
from autotune.layout import BoolArray
from autotune.layout import IntArray
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig


@dataclasses.dataclass(slots=True)
class StageSplit:
    """Layers on the first, a middle and the last pipeline stage (per candidate), and legality."""

    first: IntArray
    middle: IntArray
    last: IntArray
    legal: BoolArray
    heaviest_chunk: IntArray | None = None
    """Layers of the heaviest model chunk (virtual stage) where chunks differ within a stage
    (a custom pipeline layout); None: every stage's chunks are equal."""

    @property
    def most(self) -> IntArray:
        """Layers on the most loaded stage."""
        return np.maximum(np.maximum(self.first, self.middle), self.last)


@dataclasses.dataclass(frozen=True, slots=True)
class Zero3Fetch:
    """How a framework's ZeRO-3 gathers weights (`autotune.costmodel.zero3`)."""

    per_module: bool
    """One all-gather per weight tensor, prefetched within the limits below (DeepSpeed), not
    one per layer prefetched under the previous layer (FSDP)."""
    overlap: bool = True
    """Per-weight gathers and reduce-scatters run on their own streams under the compute;
    False: on the compute stream, one after the other (DeepSpeed's overlap_comm false)."""
    prefetch_numel: float | np.ndarray = np.inf
    """Parameters prefetched after each module's wait (DeepSpeed's
    stage3_prefetch_bucket_size)."""
    max_live_numel: float | np.ndarray = np.inf
    """No prefetch after a module of at least this many parameters (DeepSpeed's
    stage3_max_live_parameters)."""
    max_reuse_numel: float | np.ndarray = 0.0
    """A weight used again within this many parameters of the trace stays gathered (DeepSpeed's
    stage3_max_reuse_distance)."""
    reduce_bucket_numel: float | np.ndarray = np.inf
    """Gradients per reduce-scatter (DeepSpeed's reduce_bucket_size)."""
    recompute_gathers: bool = True
    """A recomputed forward gathers each unit's weights once more (hooks on the layer run
    again inside its checkpoint); False: the recompute runs inside the unit, after the
    backward's own gather (PyTorch FSDP over checkpointed blocks: torchtitan applies activation
    checkpointing before `fully_shard`, LLM Foundry/Composer wraps FSDP units and then
    checkpoints their blocks)."""
    list_collectives: bool = False
    """Every gather and reduce-scatter is a list collective (DeepSpeed v0.3-v0.5.5,
    `TrainSpec.zero3_list_collectives`): one reduce-scatter per weight tensor, not per bucket,
    and one host-dispatched copy per rank in each."""


@dataclasses.dataclass(frozen=True, slots=True)
class Zero3Live:
    """What one ZeRO-3 rank holds unsharded at its peak beside its shards
    (`FrameworkTerms.zero3_live`): the gathered weights and the gradients not yet
    reduce-scattered, per layout."""

    weights: np.ndarray
    """Gathered weight elements held at once (in the training dtype)."""
    gradient_bytes: np.ndarray
    """Bytes of unsharded gradients held at once: the autograd's and the reduction's buffers."""

    @classmethod
    def none(cls, rows: int) -> Zero3Live:
        """Nothing held beside the shards (the routed experts' states, whose layer is counted
        with the dense part's)."""
        return cls(weights=np.zeros(rows), gradient_bytes=np.zeros(rows))


class FrameworkTerms(Protocol):
    """What the cost model needs from a framework (`autotune.frameworks.Framework` has it)."""

    name: ClassVar[str]
    context_parallel: ClassVar[Literal["ring", "all_to_all"]]
    """How context parallelism exchanges keys and values."""
    tp_async_backward: ClassVar[bool]
    """Tensor-parallel collectives of the backward pass overlap the weight-gradient GEMM."""
    tp_comm_overlap: ClassVar[bool]
    """The framework can run tensor-parallel collectives under the GEMMs."""
    param_gather_overlaps_forward: ClassVar[bool]
    """ZeRO parameter gathers of the next step overlap this step's forward pass."""
    zero2_reduces_every_microbatch: ClassVar[bool]
    """ZeRO-2 reduces gradients after every micro-batch, not once per step."""
    tp_splits_output_layer: ClassVar[bool]
    """Tensor parallelism splits the output layer (and its loss) over the vocabulary."""
    moe_capacity_all_reduces: ClassVar[int]
    """All-reduces over the ep group per MoE layer forward besides the dispatch (dropless
    capacity agreement)."""
    fp8_amax_reduction: ClassVar[bool]
    """FP8 delayed scaling all-reduces each model chunk's amaxes over the tensor-, data- and
    context-parallel ranks of its pipeline stage, after its forward and after its backward."""

    def padded_vocab(self, vocab: int, tp: Any) -> Any: ...

    def split_layers(self, cfg: AutotuneConfig, pp: np.ndarray, vpp: np.ndarray) -> StageSplit: ...

    def state_bytes(self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray,
                    live: Zero3Live, shard: np.ndarray) -> dict[str, np.ndarray]: ...

    def zero3_live(self, cfg: AutotuneConfig, t: LayoutTable, layer: np.ndarray,
                   largest: np.ndarray, table: np.ndarray) -> Zero3Live: ...

    def buffer_bytes(self, cfg: AutotuneConfig, t: LayoutTable,
                     params: np.ndarray) -> np.ndarray: ...

    def grad_bucket_params(self, cfg: AutotuneConfig, t: LayoutTable,
                           params: np.ndarray) -> np.ndarray: ...

    def grad_reduce_bytes(self, cfg: AutotuneConfig) -> int: ...

    def unfused_grad_accumulation(self, t: LayoutTable) -> np.ndarray: ...

    def tp_backward_overlaps(self, t: LayoutTable) -> np.ndarray: ...

    def zero3_fetch(self, cfg: AutotuneConfig, t: LayoutTable,
                    params: np.ndarray) -> Zero3Fetch: ...

    def tp_backward_all_reduces(self, cfg: AutotuneConfig) -> int: ...


_REGISTERED: dict[str, FrameworkTerms] = {}


def register_terms(terms: FrameworkTerms) -> None:
    """Make `terms` the cost-model terms of framework `terms.name`."""
    _REGISTERED[terms.name] = terms


def terms_for(cfg: AutotuneConfig) -> FrameworkTerms:
    """The terms of the framework `cfg` trains with.

    Raises:
        AutotuneError: no framework of that name registered its terms.
    """
    try:
        return _REGISTERED[cfg.train.framework]
    except KeyError:
        known = ", ".join(sorted(_REGISTERED)) or "none (import autotune.frameworks)"
        raise AutotuneError(
            f"--framework: {cfg.train.framework!r} has no cost-model terms; known: {known}"
        ) from None
