#!/usr/bin/env bash
#SBATCH --job-name=autotune-tp1-pp1-dp4-cp1-v1-z1-mb4-rn
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
# Slurm job rendered by autotune 0.1.0.
# Model tiny-gpt on local (4 GPUs = 1 x 4).
# Layout: tp=1,pp=1,cp=1,vpp=1,zero=1,offload=none,mbs=4,recompute=none,sp=off
#
# Submit from the folder that holds the artifacts (or set ARTIFACTS_DIR):
#   cd <artifacts> && TRAIN_SCRIPT=<your training script> sbatch sbatch.sh [script arguments]
set -euo pipefail

ARTIFACTS_DIR="${ARTIFACTS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"
# The first host is node 0 (sed reads every line: head would SIGPIPE scontrol under pipefail).
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT="${MASTER_PORT:-6000}"
NNODES="$SLURM_NNODES"
GPUS_PER_NODE=4
export MASTER_ADDR MASTER_PORT NNODES GPUS_PER_NODE

export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"
PROGRAM_ARGS=(
  --deepspeed_config "$ARTIFACTS_DIR/ds_config.json"
)
TORCHRUN_ARGS=(--nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES")

# One torchrun per node; the c10d rendezvous on node 0 assigns node ranks.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 torchrun \
  "${TORCHRUN_ARGS[@]}" \
  --rdzv_id "$SLURM_JOB_ID" \
  --rdzv_backend c10d \
  --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \
  "$TRAIN_SCRIPT" \
  "${PROGRAM_ARGS[@]}" \
  "$@"
