"""Where a built-in workload's step time goes, measured on every rank, and the test-only faults.

`PartClock` times the phases of a step (data, forward, backward, gradient reduction, pipeline
transfers, optimizer) with a wall clock synchronised to the device, and `time_collectives` wraps
the collectives of `deepspeed.comm` so that each call's time is charged to its kind (tp, cp, ep,
dp/ZeRO, pp: by the process group it ran on, not its ranks) inside the phase it ran in.
`PartClock.take` turns one step into the parts the cost model predicts
(`autotune.costmodel.step_time.TIME_PARTS`): a phase's time less its collectives is compute
(forward, backward, reduction) or optimizer; a pipeline phase is all `pp_p2p` (its send/recv time
includes waiting for the neighbour stage, i.e. the bubble). On CPU (gloo) collectives block, so
their time is exact; an asynchronous one (DeepSpeed's ZeRO-3 gathers its weights with
`async_op=True` and waits for them in the module's forward or backward,
`partitioned_param_coordinator.py`) is charged its launch and its `wait`: on CPU, where nothing
runs beside it, the two are its exposed time, which would otherwise land in the phase's compute.
Gathers of the data-parallel ranks inside the forward or backward under ZeRO-3 are `zero3_gather`
(the model's part), the rest of their collectives `dp_comm`.

Faults (`AUTOTUNE_WORKLOAD_FAULTS=name,name`) are switches for tests that must see the
validity gate catch a real run going wrong; nothing else sets them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from autotune.exceptions import AutotuneError

FAULTS_ENV = "AUTOTUNE_WORKLOAD_FAULTS"
"""Comma-separated test-only faults the workload injects into its own run."""
FAULTS = {
    "zero_ignored": "ZeRO is configured away (stage 0) before the engine is built",
    "fit_world": "the layout is shrunk to the processes started instead of refusing",
    "same_seed": "every data-parallel rank draws the same tokens",
    "slow_rank": "rank 1 sleeps SLOW_S in every forward pass",
    "slow_data": "every micro-batch sleeps SLOW_S before it is returned",
    "grad_bug": "tensor-parallel rank 1 scales its gradients by 4 (a bug in a layout's split)",
}
SLOW_S = 0.25
"""Seconds a slow rank or a slow data loader sleeps per micro-step."""
PHASES = ("data", "forward", "backward", "reduce", "pipe", "optimizer")
"""Phases of a step; the rest of the step (loop, loss reduction) is `unattributed`."""
COLLECTIVES = ("all_reduce", "inference_all_reduce", "all_gather_into_tensor", "all_gather",
               "allgather_fn", "reduce_scatter_fn", "reduce_scatter_tensor", "reduce_scatter",
               "all_to_all_single", "all_to_all", "broadcast", "reduce", "send", "recv",
               "isend", "irecv")
"""`deepspeed.comm` functions whose calls are timed."""
_POINT_TO_POINT = {"send", "recv", "isend", "irecv"}


def faults() -> frozenset[str]:
    """The faults asked for in FAULTS_ENV.

    Raises:
        AutotuneError: an unknown fault name.
    """
    names = frozenset(n for n in os.environ.get(FAULTS_ENV, "").split(",") if n)
    unknown = sorted(names - FAULTS.keys())
    if unknown:
        raise AutotuneError(f"{FAULTS_ENV}: unknown fault {unknown[0]!r}; known: "
                            f"{', '.join(sorted(FAULTS))}")
    return names


class PartClock:
    """Seconds per phase and per collective kind of the current step on this rank."""

    def __init__(self, synchronize: Callable[[], None]) -> None:
        self.synchronize = synchronize
        self.phase: str | None = None
        self.phases: dict[str, float] = {}
        self.comms: dict[tuple[str, str], float] = {}

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Charge the block's wall time to `phase` (nested phases charge the outer one)."""
        if self.phase is not None:
            yield
            return
        self.synchronize()
        start = time.perf_counter()
        self.phase = phase
        try:
            yield
        finally:
            self.synchronize()
            self.phase = None
            self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - start

    def collective(self, kind: str, seconds: float) -> None:
        """Charge one collective call to `kind` inside the running phase."""
        key = (self.phase or "unattributed", kind)
        self.comms[key] = self.comms.get(key, 0.0) + seconds

    def take(self) -> dict[str, float]:
        """The step's parts in seconds (compute, <kind>_comm, pp_p2p, optimizer, data), then
        reset for the next step."""
        parts: dict[str, float] = {"data": self.phases.get("data", 0.0)}
        comm_in = {p: sum(s for (q, _k), s in self.comms.items() if q == p) for p in PHASES}
        parts["compute"] = sum(self.phases.get(p, 0.0) - comm_in[p]
                               for p in ("forward", "backward", "reduce"))
        parts["optimizer"] = self.phases.get("optimizer", 0.0) - comm_in["optimizer"]
        parts["pp_p2p"] = self.phases.get("pipe", 0.0)
        for (phase, kind), seconds in self.comms.items():
            if phase in ("pipe", "data", "unattributed"):
                continue  # inside the pipeline phase, or outside every phase
            name = {"pp": "pp_p2p", "zero3": "zero3_gather"}.get(kind, f"{kind}_comm")
            parts[name] = parts.get(name, 0.0) + seconds
        self.phases, self.comms = {}, {}
        return {k: max(0.0, v) for k, v in parts.items() if v}


def time_collectives(module: Any, clock: PartClock, kind_of: Callable[[str, Any], str]) -> None:
    """Wrap the COLLECTIVES of `module` (``deepspeed.comm``) so each call charges its time to
    ``kind_of(name, group)`` in `clock` (a collective calling another counts once, as the
    outer one); call before the engine is built."""

    inside = [False]  # deepspeed.comm's allgather_fn calls all_gather_into_tensor: time once

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if clock.phase is None or inside[0]:
                return original(*args, **kwargs)
            kind = kind_of(name, kwargs.get("group"))
            start = time.perf_counter()
            inside[0] = True
            try:
                work = original(*args, **kwargs)
            finally:
                inside[0] = False
                clock.collective(kind, time.perf_counter() - start)
            return Waited(work, clock, kind) if kwargs.get("async_op") and work else work

        timed._autotune_timed = True  # type: ignore[attr-defined]
        return timed

    for name in COLLECTIVES:
        original = getattr(module, name, None)
        if original is not None and not getattr(original, "_autotune_timed", False):
            setattr(module, name, wrap(name, original))


class Waited:
    """An asynchronous collective's handle whose `wait` charges its time to the collective's
    kind in the phase it runs in (every other attribute is the handle's)."""

    def __init__(self, work: Any, clock: PartClock, kind: str) -> None:
        self._work, self._clock, self._kind = work, clock, kind

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """The handle's wait, timed."""
        start = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            if self._clock.phase is not None:
                self._clock.collective(self._kind, time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


_GATHERS = {"all_gather_into_tensor", "all_gather", "allgather_fn"}


def collective_kind(name: str, group_kind: str | None, gathers_weights: bool = False) -> str:
    """The kind of one collective: point-to-point is pipeline, a call on one of the layout's
    tp, cp or ep process groups is of that kind (`group_kind`, the group's own, not its ranks':
    where cp or ep spans the ranks of the data-parallel group, ZeRO and the gradients reduce on
    the data-parallel group's own process group), and the rest reduce or gather over
    data-parallel ranks (dp: gradients, ZeRO partitions); with `gathers_weights` (ZeRO-3 inside
    a forward or backward) their gathers are `zero3`."""
    if name in _POINT_TO_POINT:
        return "pp"
    kind = group_kind or "dp"
    return "zero3" if gathers_weights and kind == "dp" and name in _GATHERS else kind
