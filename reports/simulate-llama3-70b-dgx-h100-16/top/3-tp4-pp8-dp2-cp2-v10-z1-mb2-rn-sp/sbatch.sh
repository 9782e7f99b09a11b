#!/usr/bin/env bash
#SBATCH --job-name=autotune-tp4-pp8-dp2-cp2-v10-z1-mb2-rn-sp
##SBATCH --partition=<partition>   (a disabled placeholder: drop one '#' and fill it in)
##SBATCH --account=<account>   (a disabled placeholder: drop one '#' and fill it in)
##SBATCH --time=<time>   (a disabled placeholder: drop one '#' and fill it in)
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
# Slurm job rendered by autotune 0.1.0.
# Model llama3-70b on dgx-h100:16 (128 GPUs = 16 x 8).
# Layout: tp=4,pp=8,cp=2,vpp=10,zero=1,offload=none,mbs=2,recompute=none,sp=on
#
# Submit from the folder that holds the artifacts (or set ARTIFACTS_DIR):
#   cd <artifacts> && MEGATRON_LM=<Megatron-LM checkout> sbatch sbatch.sh [extra pretrain_gpt.py flags]
set -euo pipefail

ARTIFACTS_DIR="${ARTIFACTS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"
# The first host is node 0 (sed reads every line: head would SIGPIPE scontrol under pipefail).
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT="${MASTER_PORT:-6000}"
NNODES="$SLURM_NNODES"
GPUS_PER_NODE=8
export MASTER_ADDR MASTER_PORT NNODES GPUS_PER_NODE

# Tasks run in CONTAINER_IMAGE through pyxis/enroot when one is set (srun --container-image),
# with the artifacts folder mounted at the same path plus CONTAINER_MOUNTS (SRC:DST[,SRC:DST]).
CONTAINER_IMAGE_DEFAULT=''
CONTAINER_MOUNTS_DEFAULT=''
CONTAINER_IMAGE="${CONTAINER_IMAGE:-$CONTAINER_IMAGE_DEFAULT}"
CONTAINER_MOUNTS="${CONTAINER_MOUNTS:-$CONTAINER_MOUNTS_DEFAULT}"
SRUN_ARGS=(--ntasks-per-node=1 --kill-on-bad-exit=1)
if [[ -n "$CONTAINER_IMAGE" ]]; then
  SRUN_ARGS+=(--container-image="$CONTAINER_IMAGE" --container-workdir="$ARTIFACTS_DIR")
  SRUN_ARGS+=(--container-mounts="$ARTIFACTS_DIR:$ARTIFACTS_DIR${CONTAINER_MOUNTS:+,$CONTAINER_MOUNTS}")
fi

# One task per node; pretrain_gpt.sh takes NODE_RANK from the task's SLURM_NODEID.
srun "${SRUN_ARGS[@]}" bash "$ARTIFACTS_DIR/pretrain_gpt.sh" "$@"
