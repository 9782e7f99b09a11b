"""The validity gate after each trial: did the framework run what the layout asked, and can the
figures be physical? Plus the pitfalls a correct-looking run can hide.

`gate(cfg, layout, m)` turns an `ok` measurement into `invalid` (with the reason and its fix)
when any of these fails:

- the measured TFLOP/s per GPU is above the device's peak for the precision (no kernel runs
  faster than the datasheet: the step time or the token count reported is wrong);
- the final loss is not finite;
- what the trial program read back from the framework's own state (`extra["ran"]`: world size,
  tp/pp/dp/cp/ep, ZeRO stage, offload, micro-batch, accumulation, precision) differs from the
  layout;
- the ranks of one data-parallel replica (its tensor-parallel peers) report different losses;
- data-parallel ranks trained on identical tokens (a seed that is not per rank, no distributed
  sampler: dp copies of one batch, so the run trains on 1/dp of the data it claims).

The last two read `extra["ranks"]` (per-rank figures of the built-in workloads). Pitfalls that
leave the measurement usable but slower than it should be (a persistently slower rank, data
loading that stalls the step) go to `extra["pitfalls"]`, each with its fix.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.specs import AutotuneConfig

READ_BACK = ("world_size", "tp", "pp", "dp", "cp", "ep", "zero", "offload", "mbs", "gas",
             "precision")
"""What a trial program reads back from the framework, in the order mismatches are named."""
LOSS_REL_TOL = 1e-4
"""Relative loss difference allowed between tensor-parallel peers (fp32 all-reduce order)."""
SLOW_RANK_RATIO = 1.3
"""A rank whose compute time is this many times its peers' median on most steps is slow."""
NOISY_RANK_RATIO = {"cpu": 2.0}
"""Devices whose ranks differ more than that in correct runs, and the ratio that flags a slow
one there: two CPU workers sharing two cores measured one rank's compute at 1.50x the other's
in a correct dp 2 run (the injected slow rank sleeps 0.25 s per micro-step: about 4x)."""
DATA_STALL_SHARE = 0.1
"""Data loading above this share of the step time stalls the step."""
MEASURED_PEAK_SLACK = {"cpu": 10.0}
"""GPUs whose 'peak' is a measurement, not a datasheet figure, and how far above it a trial may
go: the CPU stand-in's peak is one core's matmul timed for 0.1 s (on a busy machine it reads
low), so only a figure ten times above it is impossible."""


def gate(cfg: AutotuneConfig, layout: Layout, m: Measurement) -> Measurement:
    """The measurement, or `invalid` with the first reason it cannot count; pitfalls noted.

    Only `ok` measurements are checked; failures pass through unchanged.
    """
    if m.status != "ok":
        return m
    reasons = [*_physical(cfg, m), *_mismatches(cfg, layout, m.extra.get("ran")),
               *_replicas(m.extra.get("ranks"))]
    pitfalls = pitfalls_of(m.extra.get("ranks"), m.step_time_s,
                           NOISY_RANK_RATIO.get(cfg.cluster.gpu.name, SLOW_RANK_RATIO))
    extra = {**m.extra, "pitfalls": pitfalls} if pitfalls else m.extra
    if not reasons:
        return dataclasses.replace(m, extra=extra)
    return Measurement("invalid", reason="; ".join(reasons), log_tail=m.log_tail,
                       peak_memory_bytes=m.peak_memory_bytes,
                       extra={**extra, "rejected_figures": _figures(m)})


def _figures(m: Measurement) -> dict[str, float | None]:
    return {"step_time_s": m.step_time_s, "tokens_per_s": m.tokens_per_s,
            "tflops_per_gpu": m.tflops_per_gpu, "mfu": m.mfu}


def _physical(cfg: AutotuneConfig, m: Measurement) -> list[str]:
    """Figures no hardware can produce."""
    reasons = []
    precision = cfg.train.precision
    peak = cfg.cluster.gpu.peak_tflops.get(precision)
    bound = None if peak is None else peak * MEASURED_PEAK_SLACK.get(cfg.cluster.gpu.name, 1.0)
    if m.tflops_per_gpu is not None and bound is not None and m.tflops_per_gpu > bound:
        reasons.append(
            f"measured {m.tflops_per_gpu:.4g} TFLOP/s per GPU is above the "
            f"{cfg.cluster.gpu.name} peak of {bound:g} TFLOP/s ({precision}) "
            f"({m.tokens_per_s:.4g} tokens/s): the step time or token count the trial reported "
            "cannot be physical; report the wall time of one optimizer step over the global "
            f"batch ({cfg.train.global_batch_size} sequences of {cfg.train.seq_length} tokens)")
    loss = m.extra.get("final_loss")
    if isinstance(loss, int | float) and not math.isfinite(loss):
        reasons.append(f"final loss is {loss}: the run diverged")
    return reasons


def expected(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """What the framework should report for `layout` (the keys of READ_BACK)."""
    return {"world_size": layout.world_size, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
            "cp": layout.cp, "ep": layout.ep, "zero": layout.zero, "offload": layout.offload,
            "mbs": layout.mbs, "gas": layout.gas, "precision": cfg.train.precision}


def _mismatches(cfg: AutotuneConfig, layout: Layout, ran: Any) -> list[str]:
    """Each read-back value that differs from the layout, naming both and the fix."""
    if not isinstance(ran, dict):
        return []
    want = expected(cfg, layout)
    wrong = [f"{key} ran {ran[key]!r}, layout asks {want[key]!r}"
             for key in READ_BACK if key in ran and ran[key] != want[key]]
    if not wrong:
        return []
    return [f"the framework did not run the layout ({'; '.join(wrong)}): check that the "
            "launcher starts world_size processes and that the rendered config reaches the "
            "framework unchanged"]


def _replicas(ranks: Any) -> list[str]:
    """Loss disagreement inside a replica, identical data across replicas."""
    if not isinstance(ranks, list) or len(ranks) < 2:
        return []
    reasons = []
    replicas: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for r in ranks:
        replicas.setdefault((r["dp"], r.get("cp", 0), r.get("stage", 0)), []).append(r)
    for (dp, _cp, _stage), peers in sorted(replicas.items()):
        losses = [p["losses"] for p in peers if p.get("losses")]
        if len(losses) < 2:
            continue
        for step, values in enumerate(zip(*losses, strict=False)):
            spread = max(values) - min(values)
            if spread > LOSS_REL_TOL * max(abs(v) for v in values):
                names = ", ".join(f"rank {p['rank']}: {v:.6g}" for p, v in zip(peers, values,
                                                                              strict=False))
                reasons.append(
                    f"the ranks of data-parallel replica {dp} disagree on the loss at measured "
                    f"step {step} ({names}): their shards of the model differ; check the "
                    "tensor-parallel split and that every rank starts from the same weights")
                break
    by_slot: dict[tuple[int, int, int], dict[int, tuple[Any, ...]]] = {}
    for r in ranks:
        if r.get("data"):
            slot = (r.get("tp", 0), r.get("cp", 0), r.get("stage", 0))
            by_slot.setdefault(slot, {})[r["dp"]] = tuple(r["data"])
    for seen in by_slot.values():
        if len(seen) > 1 and len(set(seen.values())) < len(seen):
            reasons.append(
                f"data-parallel ranks {sorted(seen)} trained on identical tokens: each data "
                "source is seeded the same on every rank; seed it with the data-parallel rank "
                "or shard it with torch.utils.data.DistributedSampler")
            break
    return reasons


def pitfalls_of(ranks: Any, step_time_s: float | None,
                slow_ratio: float = SLOW_RANK_RATIO) -> list[str]:
    """A persistently slower rank (compute above `slow_ratio` times its peers' on most steps)
    and a data loader that stalls the step, each with its fix."""
    if not isinstance(ranks, list) or not ranks:
        return []
    found = []
    busy = {r["rank"]: r["compute_s"] for r in ranks if r.get("compute_s")}
    if len(busy) > 1:
        for rank, times in busy.items():
            peers = [statistics.median(t) for other, t in busy.items() if other != rank]
            usual = statistics.median(peers)
            slow = sum(1 for t in times if t > slow_ratio * usual)
            if usual > 0 and slow > len(times) / 2:
                found.append(
                    f"rank {rank} is persistently slower: its compute takes "
                    f"{statistics.median(times) / usual:.2f}x its peers' on {slow} of "
                    f"{len(times)} steps and every peer waits for it in the next collective; "
                    "check that rank's device (clocks, thermals, another process on it) and its "
                    "host (CPU affinity, NUMA)")
    if step_time_s:
        data = [statistics.median(r["data_s"]) for r in ranks if r.get("data_s")]
        share = max(data) / step_time_s if data else 0.0
        if share > DATA_STALL_SHARE:
            found.append(
                f"data loading takes {100 * share:.0f} % of the step: the step waits for its "
                "batches; load them ahead of the step (DataLoader num_workers > 0, "
                "pin_memory=True, prefetch_factor) or pre-tokenize the data set")
    return found
