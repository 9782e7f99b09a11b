#!/usr/bin/env bash
# DeepSpeed launch, rendered by autotune 0.1.0.
# Model tiny-gpt on local (4 GPUs = 1 x 4).
# Layout: tp=1,pp=1,cp=1,vpp=1,zero=1,offload=none,mbs=4,recompute=none,sp=off
#
# Edit ./hostfile (ssh-reachable hosts), keep this folder on a filesystem every node sees, then:
#   TRAIN_SCRIPT=<your training script> bash launch_deepspeed.sh [script arguments]
# The script gets --deepspeed_config <this folder>/ds_config.json (deepspeed.add_config_arguments reads --deepspeed_config).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"
HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-4}"
MASTER_PORT="${MASTER_PORT:-6000}"
WORLD_SIZE_RENDERED=4

if (( NNODES * GPUS_PER_NODE != WORLD_SIZE_RENDERED )); then
  echo "launch_deepspeed.sh: NNODES ($NNODES) x GPUS_PER_NODE ($GPUS_PER_NODE) must be the $WORLD_SIZE_RENDERED GPUs this layout was rendered for" >&2
  exit 2
fi

export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

# The launcher forwards only NCCL*/PYTHON*/UCX* variables and the lines of a .deepspeed_env file
# to the other nodes: hand it a file with the user's own entries plus the two variables above.
DS_ENV_FILE="$(mktemp)"
export DS_ENV_FILE
trap 'rm -f "$DS_ENV_FILE"' EXIT
for env_file in "$HOME/.deepspeed_env" ./.deepspeed_env; do
  if [[ -f "$env_file" ]]; then
    cat "$env_file" >> "$DS_ENV_FILE"
  fi
done
printf '%s\n' TORCH_NCCL_ASYNC_ERROR_HANDLING=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True >> "$DS_ENV_FILE"

LAUNCHER_ARGS=(--hostfile "$HOSTFILE" --num_nodes "$NNODES" --num_gpus "$GPUS_PER_NODE" --master_port "$MASTER_PORT")
if [[ -n "${MASTER_ADDR:-}" ]]; then
  LAUNCHER_ARGS+=(--master_addr "$MASTER_ADDR")
fi

PROGRAM_ARGS=(
  --deepspeed_config "$HERE/ds_config.json"
)

deepspeed "${LAUNCHER_ARGS[@]}" "$TRAIN_SCRIPT" "${PROGRAM_ARGS[@]}" "$@"
