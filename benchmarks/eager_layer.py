"""The cost model's compute on one CPU worker against the workload's own model, without the load.

On a shared machine a trial's step time holds other tenants' time; this benchmark takes it
out entirely. It runs the CPU workload's model (`autotune.workloads.deepspeed_gpt.GPT`, no
DeepSpeed, one thread as each trial rank runs) forward, loss and backward, and times it in
this thread's CPU time (`time.thread_time`, which does not advance while the thread waits for
a CPU). It prints that against the model's compute of one micro-batch (every layer and the
output layer with its loss), with the calibration's constants, and the model's parts: linear
GEMMs, attention, the layers' memory-bound (eager elementwise) ops, the output layer and loss.
`--imbalance X` charges a MoE model's experts X times the mean expert's tokens (DeepSpeed pads
every expert to the largest one's count).

    python benchmarks/eager_layer.py --calibration cpu-validation/tiny-gpt/calibration.yaml
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from autotune.calibration.file import apply_calibration
from autotune.calibration.file import load_calibration
from autotune.costmodel.constants import constants_for
from autotune.costmodel.kernels import head_times
from autotune.costmodel.kernels import mean_layer_times
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs.inputs import load_config
from autotune.workloads.deepspeed_gpt import GPT
from autotune.workloads.deepspeed_gpt import LossFn
from autotune.workloads.deepspeed_gpt import MoEPlan


def main(argv: list[str] | None = None) -> int:
    """Time the model per micro-batch size and print the table (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--model", default="tiny-gpt")
    parser.add_argument("--mbs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--imbalance", type=float, default=None,
                        help="moe_load_imbalance to charge (default: the calibration's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config(args.model, "local", framework="deepspeed", processes=2)
    cfg = apply_calibration(cfg, load_calibration(args.calibration), str(args.calibration))
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    if args.imbalance is not None:
        k = k.model_copy(update={"moe_load_imbalance": args.imbalance})
    spec, seq = cfg.model, cfg.train.seq_length
    torch.manual_seed(0)
    model, loss_fn = GPT(spec, "none", None, 0, MoEPlan()), LossFn(1.0)
    print("| mbs | measured CPU (s) | predicted (s) | error | GEMMs | attention | elementwise "
          "| output layer and loss |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mbs in args.mbs:
        tokens = torch.randint(0, spec.vocab_size, (mbs, seq))

        def step(tokens: torch.Tensor = tokens) -> None:
            model.zero_grad(set_to_none=False)
            loss_fn(model(tokens), tokens).backward()  # type: ignore[no-untyped-call]

        step()
        times = []
        for _ in range(args.repeats):
            start = time.thread_time()
            step()
            times.append(time.thread_time() - start)
        measured = statistics.median(times)
        layout = Layout.parse(f"tp=1,pp=1,cp=1,zero=0,mbs={mbs}", cfg.world_size,
                              cfg.train.global_batch_size, framework_of(cfg))
        table = LayoutTable.from_layouts([layout])
        layer = mean_layer_times(cfg, table, k)  # a MoE model's layers are MoE layers
        head_s, _ = head_times(cfg, table, framework_of(cfg).padded_vocab(spec.vocab_size, 1),
                               k)
        layers = spec.num_layers
        gemm = float(3 * layers * layer.linear_forward[0])
        attention = float(3 * layers * layer.attention_forward[0])
        rest = float(3 * layers * layer.memory_forward[0])
        predicted = gemm + attention + rest + float(head_s[0])
        print(f"| {mbs} | {measured:.3f} | {predicted:.3f} | {predicted / measured - 1:+.1%} | "
              f"{gemm:.3f} | {attention:.3f} | {rest:.3f} | {float(head_s[0]):.3f} |")
        counts = [m.deepspeed_moe.exp_counts.float() for m in model.modules()
                  if hasattr(m, "deepspeed_moe")]
        if counts:  # DeepSpeed pads every expert to the largest count (dropless)
            print("  largest expert's tokens over the mean, per MoE layer: " + ", ".join(
                f"{float(c.max() / c.mean()):.2f}" for c in counts)
                  + f" (charged: {k.moe_load_imbalance:.2f})")
    print("(the parts are the model's, in seconds of one micro-batch, forward and backward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
