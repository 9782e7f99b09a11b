"""The DeepSpeed workload's model for one step, without autotune's rules: what DeepSpeed does.

Run like the workload (``torchrun ... tests/workloads_tests/deepspeed_unchecked.py --model ...
--ds-config ... --layout ...``). Rank 0 prints ``RESULT ok`` or ``RESULT <error type>: <message>``
for the exception DeepSpeed raised while setting up or training one step: the oracle of the
rules that stand for DeepSpeed's own refusals.
"""

from __future__ import annotations

import os
import sys

from autotune.specs.inputs import load_model
from autotune.workloads import deepspeed_gpt
from autotune.workloads.common import exit_now
from autotune.workloads.common import read_json


def main() -> int:
    args = deepspeed_gpt.parse_args(sys.argv[1:])
    deepspeed_gpt._single_process_env()
    deepspeed_gpt._init_distributed()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds = read_json(args.ds_config)
    plan = deepspeed_gpt.make_plan(args, ds, world)
    try:
        trial = deepspeed_gpt.setup(load_model(args.model), plan, ds)
        deepspeed_gpt.train_step(trial, 0)
        result = "ok"
    except Exception as error:  # what DeepSpeed raised, whatever it is
        result = f"{type(error).__name__}: {error}".splitlines()[0]
    if rank == 0:
        print(f"RESULT {result}", flush=True)
    return 0  # no teardown: after a failed collective the peers may never reach a barrier


if __name__ == "__main__":
    exit_now(main())
