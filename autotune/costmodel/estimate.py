"""Memory and step time together: throughput, TFLOP/s per GPU and MFU for layouts."""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.flops import hardware_flops
from autotune.costmodel.flops import model_flops
from autotune.costmodel.memory import MEMORY_PARTS
from autotune.costmodel.memory import estimate_memory
from autotune.costmodel.step_time import TIME_PARTS
from autotune.costmodel.step_time import estimate_time
from autotune.costmodel.terms import terms_for
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig


def evaluate(
    cfg: AutotuneConfig, table: LayoutTable, k: Constants | None = None
) -> dict[str, Any]:
    """Memory parts, time parts and the headline figures of every row of `table` (numpy arrays)."""
    k = k or constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    memory = estimate_memory(cfg, table, k)
    time = estimate_time(cfg, table, k)
    train = cfg.train
    vocab = terms_for(cfg).padded_vocab(cfg.model.vocab_size, table.tp)
    flops = model_flops(cfg.model, train.seq_length, train.global_batch_size, vocab)
    hw = hardware_flops(
        cfg.model, train.seq_length, train.global_batch_size, vocab, table.recompute
    )
    step = time["total"]
    world = cfg.world_size
    peak = cfg.cluster.gpu.peak_tflops[train.precision] * 1e12
    return {
        "memory": memory,
        "time": time,
        "step_time_s": step,
        "tokens_per_s": train.tokens_per_step / step,
        "tflops_per_gpu": flops / step / world / 1e12,
        "hw_tflops_per_gpu": hw / step / world / 1e12,
        "mfu": flops / step / world / peak,
        "hfu": hw / step / world / peak,
        "peak_memory_bytes": memory["total"],
        "host_memory_bytes": memory["host"],
    }


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    """The analytic prediction for one layout, with both breakdowns."""

    layout: Layout
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_memory_bytes: float
    host_memory_bytes: float
    memory_parts: dict[str, float]
    time_parts: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: headline figures plus `memory` and `time` as {parts, total}."""
        return {
            "layout": self.layout.to_dict(),
            "layout_text": self.layout.text,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "host_memory_bytes": self.host_memory_bytes,
            "memory": {"parts": self.memory_parts, "total": self.peak_memory_bytes},
            "time": {"parts": self.time_parts, "total": self.step_time_s},
        }


def row_estimate(layout: Layout, values: dict[str, Any], i: int) -> Estimate:
    """Row i of `evaluate`'s arrays as an Estimate."""
    return Estimate(
        layout=layout,
        step_time_s=float(values["step_time_s"][i]),
        tokens_per_s=float(values["tokens_per_s"][i]),
        tflops_per_gpu=float(values["tflops_per_gpu"][i]),
        hw_tflops_per_gpu=float(values["hw_tflops_per_gpu"][i]),
        mfu=float(values["mfu"][i]),
        hfu=float(values["hfu"][i]),
        peak_memory_bytes=float(values["peak_memory_bytes"][i]),
        host_memory_bytes=float(values["host_memory_bytes"][i]),
        memory_parts={name: float(values["memory"][name][i]) for name in MEMORY_PARTS},
        time_parts={name: float(values["time"][name][i]) for name in TIME_PARTS},
    )


def estimate(cfg: AutotuneConfig, layout: Layout, k: Constants | None = None) -> Estimate:
    """Predicted memory and step time of one layout."""
    return row_estimate(layout, evaluate(cfg, LayoutTable.from_layouts([layout]), k), 0)
