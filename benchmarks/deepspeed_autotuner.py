"""DeepSpeed's autotuner, its search procedure re-expressed over a measuring callback.

Source: `deepspeed/autotuning/autotuner.py` of DeepSpeed 0.19.8 (`Autotuner.tune`, `tune_space`,
`get_min_max_micro_batch_size`, `get_tuning_micro_batch_size_list`,
`run_tuning_micro_batch_sizes`, `get_instantiation_memory_required_per_gpu`) with the defaults
of `deepspeed/autotuning/constants.py` (fast mode on, `num_tuning_micro_batch_sizes` 3,
`METRIC_PERCENT_DIFF_CONST` 0.05, `min_train_micro_batch_size_per_gpu` 1). It tunes only the ZeRO
stage and the micro-batch size: a profile run (ZeRO-3, micro-batch 1) measures the activation
memory of one micro-batch; then stage by stage (0, 1, 2, 3) it skips a stage whose model states
plus that activation do not fit, finds the largest micro-batch that runs (1.05×, 1× and 0.95× of
its memory estimate, else a binary search that stops at a 5 % plateau), runs up to three
micro-batches between half of it and it at a fixed batch per GPU, walks smaller micro-batches
while they gain 5 %, and in fast mode moves to the next stage. Probe runs use
gradient accumulation 1 (the user's value), so they change the global batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence

PLATEAU = 0.05
"""METRIC_PERCENT_DIFF_CONST: a micro-batch must gain 5 % to count as better."""
TUNING_SIZES = 3
"""num_tuning_micro_batch_sizes."""

Measure = Callable[[int, int, int], float | None]
"""measure(stage, micro_batch, grad_accumulation) -> throughput, or None when the run failed."""


@dataclasses.dataclass
class DeepSpeedAutotuner:
    """One autotuning session (fast mode) on a fixed model-parallel structure."""

    gpu_bytes: float
    num_params: int
    total_gpus: int
    mp_size: int
    max_train_batch_size: int
    """The user's global batch (autotuning's max_train_batch_size)."""
    stages: Sequence[int]
    measure: Measure
    records: dict[int, list[tuple[int, int, float]]] = dataclasses.field(default_factory=dict)

    @property
    def batch_per_gpu(self) -> int:
        """max_train_batch_size · mp_size / GPUs (micro-batch times accumulation per rank)."""
        return self.max_train_batch_size * self.mp_size // self.total_gpus

    @property
    def max_micro_batch(self) -> int:
        """max_train_micro_batch_size_per_gpu: min(1024, batch per GPU)."""
        return min(1024, self.batch_per_gpu)

    def instantiation_bytes(self, stage: int) -> float:
        """Model states per GPU as the autotuner estimates them (bf16: fp16 disabled, 4+4+8 B)."""
        params, grads, optimizer = 4 * self.num_params, 4 * self.num_params, 8 * self.num_params
        if stage >= 1:
            optimizer /= self.total_gpus
        if stage >= 2:
            grads /= self.total_gpus
        if stage >= 3:
            params /= self.total_gpus
        return (params + grads + optimizer) / self.mp_size

    def _run(self, stage: int, mbs: int, gas: int) -> float | None:
        metric = self.measure(stage, mbs, gas)
        self.records.setdefault(stage, []).append((mbs, gas, metric or 0.0))
        return metric

    def _best(self, stage: int) -> tuple[int, float]:
        """(micro-batch, metric) of the stage's best record, (0, 0) without one."""
        runs = [r for r in self.records.get(stage, []) if r[2]]
        if not runs:
            return 0, 0.0
        mbs, _, metric = max(runs, key=lambda r: r[2])
        return mbs, metric

    def tune(self, activation_bytes: float) -> None:
        """Tune every stage in order, carrying the largest micro-batch forward."""
        mbs = max_mbs = 0
        for stage in (0, 1, 2, 3):
            if stage not in self.stages:
                continue
            if self.gpu_bytes <= self.instantiation_bytes(stage) + activation_bytes:
                if stage == 3:
                    return
                continue
            next_max, next_mbs = self.tune_space(stage, activation_bytes, max_mbs)
            if stage < 3 and next_mbs > mbs:
                mbs, max_mbs = next_mbs, next_max

    def tune_space(self, stage: int, activation_bytes: float, prev_max: int) -> tuple[int, int]:
        """Micro-batch tuning of one stage: (largest micro-batch that runs, best micro-batch).

        Fast mode returns here; the other ZeRO settings (buckets, overlap) are not tuned.
        """
        calculated = int(self.gpu_bytes - self.instantiation_bytes(stage)) // int(activation_bytes)
        if calculated < prev_max:
            return 0, 0
        low, high = self.min_max_micro_batch(stage, prev_max, calculated)
        if high < prev_max:
            return 0, 0
        sizes, per_gpu = self.tuning_sizes(low, high)
        if not sizes:
            return 0, 0
        self.run_sizes(stage, sizes, per_gpu, low)
        return high, self._best(stage)[0]

    def min_max_micro_batch(self, stage: int, low: int, calculated: int) -> tuple[int, int]:
        """Smallest micro-batch that runs and the largest (probes with accumulation 1)."""
        if low > calculated:
            return -1, -1
        used: list[int] = []
        first = low if low >= 1 else 1
        if not self._run(stage, first, 1):
            return -1, -1
        used.append(first)
        low = first
        high = min(calculated, self.max_micro_batch)
        for mbs in (math.ceil(1.05 * high), high, int(0.95 * high)):
            if mbs > self.max_micro_batch:
                continue
            if mbs in used:
                return low, mbs
            if self._run(stage, mbs, 1):
                return low, mbs
        runs = self.records.get(stage, [])
        previous = min(runs, key=lambda r: abs(r[0] - low))[2] if runs else None
        lo, hi = low, high
        while lo <= hi:
            mid = (lo + hi) // 2
            if mid in used:
                lo = mid + 1
                continue
            metric = self._run(stage, mid, 1)
            if metric:
                lo = mid + 1
                used.append(mid)
                if previous and (metric - previous) / previous < PLATEAU:
                    break
                previous = metric
            else:
                hi = mid - 1
        return low, lo - 1

    def tuning_sizes(self, low: int, high: int) -> tuple[list[int], int]:
        """Up to three micro-batches from max(low, high/2) to high at a fixed batch per GPU."""
        if low <= 0 or high <= 0:
            return [], 0
        per_gpu = self.batch_per_gpu
        low = max(low, high // 2)
        stride = max((high - low) // TUNING_SIZES, 1)
        sizes = [m for m in range(low, high, stride) if per_gpu // m != per_gpu // high]
        return sizes + [high], per_gpu

    def run_sizes(self, stage: int, sizes: list[int], per_gpu: int, low: int) -> None:
        """Run each size, then smaller ones with the largest's accumulation while they gain."""
        sizes.sort()
        largest = sizes[-1]
        largest_metric = 0.0
        for mbs in sizes:
            metric = self._run(stage, mbs, max(per_gpu // mbs, 1))
            if mbs == largest:
                largest_metric = metric or 0.0
        start = sizes[-2] + 1 if len(sizes) > 1 else low
        best = largest_metric
        stride = max((largest - start) // 3, 1)
        for mbs in reversed(range(start, largest, stride)):
            metric = self._run(stage, mbs, max(per_gpu // mbs, 1))
            if not metric or metric <= best * (1 + PLATEAU):
                break
            best = metric
