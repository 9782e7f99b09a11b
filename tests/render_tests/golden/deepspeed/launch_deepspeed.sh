#!/usr/bin/env bash
# DeepSpeed launch, rendered by autotune VERSION.
# Model llama2-7b on dgx-h100:4 (32 GPUs = 4 x 8).
# Layout: tp=2,pp=1,cp=1,vpp=1,zero=3,offload=optimizer+params,mbs=1,recompute=full,sp=off
#
# Edit ./hostfile (ssh-reachable hosts), keep this folder on a filesystem every node sees, then:
#   TRAIN_SCRIPT=<your training script> bash launch_deepspeed.sh [script arguments]
# The script gets --deepspeed_config <this folder>/ds_config.json (deepspeed.add_config_arguments reads --deepspeed_config).
#
# What to train on: ds_config.json fixes the layout and the optimizer; the data, tokenizer,
# checkpoints and length of the run are the training script's. These variables reach it on every
# node (through the launcher's .deepspeed_env), for the script to read:
#   DATA_PATH, TOKENIZER_MODEL, CHECKPOINT_DIR, SAVE_INTERVAL, TRAIN_ITERS or TRAIN_TOKENS
#   (one iteration is 4194304 tokens: TRAIN_ITERS = TRAIN_TOKENS / 4194304).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"
HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
NNODES="${NNODES:-4}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
MASTER_PORT="${MASTER_PORT:-6000}"
WORLD_SIZE_RENDERED=32

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
if [[ -n "${TRAIN_TOKENS:-}" && -z "${TRAIN_ITERS:-}" ]]; then
  TRAIN_ITERS="$(( (TRAIN_TOKENS + 4194304 - 1) / 4194304 ))"
fi
for name in DATA_PATH TOKENIZER_MODEL CHECKPOINT_DIR SAVE_INTERVAL TRAIN_ITERS TRAIN_TOKENS; do
  if [[ -n "${!name:-}" ]]; then
    printf '%s=%s\n' "$name" "${!name}" >> "$DS_ENV_FILE"
  fi
done

LAUNCHER_ARGS=(--hostfile "$HOSTFILE" --num_nodes "$NNODES" --num_gpus "$GPUS_PER_NODE" --master_port "$MASTER_PORT")
if [[ -n "${MASTER_ADDR:-}" ]]; then
  LAUNCHER_ARGS+=(--master_addr "$MASTER_ADDR")
fi

PROGRAM_ARGS=(
  --deepspeed_config "$HERE/ds_config.json"
)

deepspeed "${LAUNCHER_ARGS[@]}" "$TRAIN_SCRIPT" "${PROGRAM_ARGS[@]}" "$@"
