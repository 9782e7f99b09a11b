"""The expert load of a MoE model's router at initialisation, for CPU workers' short trials.

DeepSpeed's dropless MoE layer pads every expert to the capacity, the busiest expert's copies
over the ep group (`sharded_moe.top2gating`), so its experts run and its all-to-alls move
experts · capacity rows where balanced routing would move tokens · k. A short trial's router is
the one it was initialised with: on tiny-moe its busiest expert gets 1.3-2.0x the mean, where
the preset's `moe_load_imbalance` (1.1) is what a trained, load-balanced router reaches. That is
a property of the model's initial weights and of the tokens, not of the hardware, so `calibrate`
measures it once for the built-in workload's model: its layers built as a trial builds them
(`autotune.workloads.deepspeed_gpt.GPT`, every expert local: the workload seeds each expert by
its index, so any ep trains the same model), run forward on random tokens drawn with their own
seed (not a trial's), the capacity of an ep group being the largest of its ep micro-batches'
busiest counts, for each (ep, micro-batch) pair of the candidate layouts. The excess over 1
shrinks as 1/sqrt(sequences per micro-batch) (tiny-moe at ep 1: 1.81, 1.57, 1.46, 1.25 at 1, 2,
4, 8 sequences): the constant is one sequence's load, fitted to the pairs under that law
(`kernels.load_imbalance`), the residuals are the pairs' about it.

    python -m autotune.calibration.router_load --model-json SPEC --seq 256 --pairs 1:1 2:4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.calibration.file import FittedConstant
from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.layout import LayoutTable
from autotune.runners.local import free_port
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec

REPEATS = 2
"""ep groups of micro-batches drawn per (ep, micro-batch) pair."""
TOKEN_SEED = 4_000_037
"""Seed of the random tokens (the trials draw theirs from `workloads.common.SEED`)."""
TIMEOUT_S = 300.0
LOAD_BOUND = float(next(m.le for m in Constants.model_fields["moe_load_imbalance"].metadata
                        if hasattr(m, "le")))
"""`Constants.moe_load_imbalance`'s upper bound (read off its field)."""


def pair_loads(spec: ModelSpec, seq: int, pairs: list[tuple[int, int]]) -> list[float]:
    """Per (ep, micro-batch) pair: the padded rows over the balanced ones, averaged over the
    MoE layers and REPEATS groups (call with torch.distributed and DeepSpeed initialised)."""
    import torch

    from autotune.workloads.deepspeed_gpt import GPT
    from autotune.workloads.deepspeed_gpt import MoEMLP
    from autotune.workloads.deepspeed_gpt import MoEPlan

    model = GPT(spec, "none", None, 0, MoEPlan(1, 0.0))
    layers = [m for m in model.modules() if isinstance(m, MoEMLP)]
    for layer in layers:
        layer.moe.set_deepspeed_parallelism()
    generator = torch.Generator().manual_seed(TOKEN_SEED)
    loads = []
    with torch.no_grad():
        for ep, mbs in pairs:
            groups = []
            for _ in range(REPEATS):
                for _ in range(ep):
                    model.model(torch.randint(spec.vocab_size, (mbs, seq), generator=generator))
                # each layer's load per micro-batch; the group pads to its largest
                per_layer = [layer.loads[:] for layer in layers]
                for layer in layers:
                    layer.loads.clear()
                groups += [max(batch) for batch in per_layer]
            loads.append(statistics.fmean(groups))
    return loads


def router_load(cfg: AutotuneConfig, layouts: LayoutTable, out: Path,
                before: float) -> FittedConstant | None:
    """`moe_load_imbalance` measured for `cfg`'s MoE model over the candidate `layouts` (one
    process on this machine, log in `out`); None for a dense model or GPUs (whose trials run
    Megatron's or the user's own router, not the built-in CPU workload's).

    Raises:
        AutotuneError: the measuring process failed (its log named).
    """
    if not (cfg.cluster.cpu_processes and cfg.model.moe):
        return None
    pairs = sorted({(int(ep), int(mbs)) for ep, mbs in zip(layouts.ep, layouts.mbs,
                                                          strict=True)})
    out.mkdir(parents=True, exist_ok=True)
    log = out / "router_load.log"
    command = [sys.executable, "-m", "autotune.calibration.router_load", "--model-json",
               cfg.model.model_dump_json(), "--seq", str(cfg.train.seq_length),
               "--pairs", *[f"{ep}:{mbs}" for ep, mbs in pairs]]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    log.write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADS ")]
    if done.returncode != 0 or not lines:
        raise AutotuneError(f"calibrate: measuring the router's expert load failed (exit "
                            f"{done.returncode}); see {log}")
    loads = [max(1.0, float(x)) for x in json.loads(lines[-1].removeprefix("LOADS "))]
    value = single_sequence_load(loads, [mbs for _ep, mbs in pairs])
    spread = [abs(1 + (value - 1) / math.sqrt(mbs) - load) / load
              for load, (_ep, mbs) in zip(loads, pairs, strict=True)]
    return FittedConstant(value=value, before=before, points=len(loads),
                          median_residual=statistics.median(spread), max_residual=max(spread),
                          at_bound="upper" if value >= LOAD_BOUND else None)


def single_sequence_load(loads: list[float], sequences: list[int]) -> float:
    """The least-squares load of one sequence, I, under `kernels.load_imbalance`'s law
    load = 1 + (I − 1)/sqrt(sequences): I − 1 = Σ x·(load − 1) / Σ x², x = 1/sqrt(sequences);
    capped at LOAD_BOUND (the constant's range)."""
    x = [1 / math.sqrt(n) for n in sequences]
    excess = sum(a * (load - 1) for a, load in zip(x, loads, strict=True)) / sum(a * a for a in x)
    return min(1 + max(excess, 0.0), LOAD_BOUND)


def main(argv: list[str] | None = None) -> int:
    """Measure the pairs' loads in this process (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-json", required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--pairs", nargs="+", required=True, help="ep:micro-batch")
    args = parser.parse_args(argv)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.init_distributed("gloo")
    spec = ModelSpec(**json.loads(args.model_json))
    pairs = [(int(ep), int(mbs)) for ep, mbs in (p.split(":") for p in args.pairs)]
    loads: list[Any] = pair_loads(spec, args.seq, pairs)
    print("LOADS " + json.dumps(loads), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
