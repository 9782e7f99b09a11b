"""Counts what a real DeepSpeed engine's `step` moves per parameter: one gloo process, a
stack of fp32 linears, torch's AdamW with weight decay and gradient clipping, the ZeRO stage
given on the command line. Prints one JSON line: parameters, bytes and ops of the third step
(`ElementwiseCount`). Run by test_eager.py in its own process (it initialises
torch.distributed)."""

from __future__ import annotations

import json
import logging
import os
import sys

import deepspeed
import torch

from autotune.workloads.dispatch import ElementwiseCount


def main(stage: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    deepspeed.utils.logger.setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(4)])
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW",
                            "params": {"lr": 1e-4, "weight_decay": 0.1, "torch_adam": True}},
              "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    x = torch.randn(2, 512)
    for _ in range(2):  # the first step makes the moments
        engine.backward(engine(x).square().mean())
        engine.step()
    engine.backward(engine(x).square().mean())
    with ElementwiseCount() as count:
        engine.step()
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"params": params, "bytes": count.bytes, "ops": count.ops}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
