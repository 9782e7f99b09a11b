"""Memory and step time together: throughput, TFLOP/s per GPU and MFU for layouts.

`Figures` declares the headline figures once, each with its formula: a new headline figure is
one field there. `Estimates` (columnar, many layouts) and `Estimate` (one layout) both carry
them, and `Estimates.row`, `Estimate.to_dict` and `evaluate` iterate the declaration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
from typing import Generic
from typing import TypeVar

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.flops import hardware_flops
from autotune.costmodel.flops import model_flops
from autotune.costmodel.memory import MEMORY_PARTS
from autotune.costmodel.memory import MemoryEstimate
from autotune.costmodel.memory import estimate_memory
from autotune.costmodel.step_time import TIME_PARTS
from autotune.costmodel.step_time import TimeEstimate
from autotune.costmodel.step_time import estimate_time
from autotune.costmodel.terms import terms_for
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Basis:
    """What the headline figures are computed from, for the rows of one table."""

    memory: MemoryEstimate
    time: TimeEstimate
    tokens: int
    """Tokens per optimizer step."""
    model_flops: np.ndarray
    """Model FLOPs of one step (6·N·D plus attention, no recompute)."""
    hardware_flops: np.ndarray
    """FLOPs one step executes, recompute included."""
    world: int
    peak_flops: float
    """Peak FLOP/s of one GPU at the training precision."""


def _figure(formula: Callable[[Basis], np.ndarray]) -> Any:
    return dataclasses.field(metadata={"formula": formula})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Figures(Generic[T]):
    """The headline figures of a prediction, each declared with its formula over a `Basis`."""

    step_time_s: T = _figure(lambda b: b.time.total)
    tokens_per_s: T = _figure(lambda b: b.tokens / b.time.total)
    tflops_per_gpu: T = _figure(lambda b: b.model_flops / b.time.total / b.world / 1e12)
    hw_tflops_per_gpu: T = _figure(lambda b: b.hardware_flops / b.time.total / b.world / 1e12)
    mfu: T = _figure(lambda b: b.model_flops / b.time.total / b.world / b.peak_flops)
    hfu: T = _figure(lambda b: b.hardware_flops / b.time.total / b.world / b.peak_flops)
    peak_memory_bytes: T = _figure(lambda b: b.memory.total)
    host_memory_bytes: T = _figure(lambda b: b.memory.host)


FIGURES = tuple(f.name for f in dataclasses.fields(Figures))
"""Names of the headline figures, in report order."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Estimate(Figures[float]):
    """The analytic prediction for one layout, with both breakdowns."""

    layout: Layout
    memory_parts: dict[str, float]
    time_parts: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: headline figures plus `memory` and `time` as {parts, total}."""
        return {
            "layout": self.layout.to_dict(),
            "layout_text": self.layout.text,
            **{name: getattr(self, name) for name in FIGURES},
            "memory": {"parts": self.memory_parts, "total": self.peak_memory_bytes},
            "time": {"parts": self.time_parts, "total": self.step_time_s},
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Estimates(Figures[np.ndarray]):
    """The analytic prediction for every row of `table` (columns, like `LayoutTable`)."""

    table: LayoutTable
    memory: MemoryEstimate
    time: TimeEstimate

    def __len__(self) -> int:
        return len(self.table)

    def row(self, i: int) -> Estimate:
        """Row i as an Estimate."""
        return Estimate(
            layout=self.table.row(i),
            memory_parts={name: float(self.memory.parts[name][i]) for name in MEMORY_PARTS},
            time_parts={name: float(self.time.parts[name][i]) for name in TIME_PARTS},
            **{name: float(getattr(self, name)[i]) for name in FIGURES},
        )

    def take(self, index: np.ndarray) -> Estimates:
        """The rows selected by `index` (an index or boolean mask array)."""
        taken: Estimates = _take(self, index)
        return taken


def _take(value: Any, index: np.ndarray) -> Any:
    """`value` with every array in it indexed by `index` (dataclasses and dicts recursively)."""
    if isinstance(value, LayoutTable):
        return value.take(index)
    if isinstance(value, dict):
        return {name: _take(v, index) for name, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _take(getattr(value, f.name), index)
                                             for f in dataclasses.fields(value)})
    return value[index]


def evaluate(cfg: AutotuneConfig, table: LayoutTable, k: Constants | None = None) -> Estimates:
    """Memory parts, time parts and the headline figures of every row of `table`."""
    k = k or constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    train = cfg.train
    vocab = terms_for(cfg).padded_vocab(cfg.model.vocab_size, table.tp)
    basis = Basis(
        memory=estimate_memory(cfg, table, k),
        time=estimate_time(cfg, table, k),
        tokens=train.tokens_per_step,
        model_flops=model_flops(cfg.model, train.seq_length, train.global_batch_size, vocab),
        hardware_flops=hardware_flops(
            cfg.model, train.seq_length, train.global_batch_size, vocab, table.recompute),
        world=cfg.world_size,
        peak_flops=cfg.cluster.gpu.peak_tflops[train.precision] * 1e12,
    )
    figures = {f.name: f.metadata["formula"](basis) for f in dataclasses.fields(Figures)}
    return Estimates(table=table, memory=basis.memory, time=basis.time, **figures)


def estimate(cfg: AutotuneConfig, layout: Layout, k: Constants | None = None) -> Estimate:
    """Predicted memory and step time of one layout."""
    return evaluate(cfg, LayoutTable.from_layouts([layout]), k).row(0)
