#!/usr/bin/env bash
# trial 1: tp=1,pp=1,cp=1,vpp=1,zero=0,offload=none,mbs=4,recompute=none,sp=off
cd ./scale/2
OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=~/.cache/autotune/torch_extensions PYTHONPATH=. \
  python -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node 2 -m autotune.workloads.deepspeed_gpt --model ./scale/2/model.json --ds-config ./scale/2/ds_config.json --layout ./scale/2/layout.json --seq 128 --steps 8 --warmup 3 --metrics ./scale/2/metrics.jsonl
