#!/usr/bin/env bash
# trial 5: tp=1,pp=1,cp=1,vpp=1,zero=2,offload=none,mbs=2,recompute=none,sp=off
cd ./trials/0005-tp1-pp1-dp4-cp1-v1-z2-mb2-rn
OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=~/.cache/autotune/torch_extensions PYTHONPATH=. \
  python -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node 4 -m autotune.workloads.deepspeed_gpt --model ./trials/0005-tp1-pp1-dp4-cp1-v1-z2-mb2-rn/model.json --ds-config ./trials/0005-tp1-pp1-dp4-cp1-v1-z2-mb2-rn/ds_config.json --layout ./trials/0005-tp1-pp1-dp4-cp1-v1-z2-mb2-rn/layout.json --seq 128 --steps 8 --warmup 3 --metrics ./trials/0005-tp1-pp1-dp4-cp1-v1-z2-mb2-rn/metrics.jsonl
