#!/usr/bin/env bash
# DeepSpeed launch, rendered by autotune VERSION.
# Model llama2-7b on dgx-h100:4 (32 GPUs = 4 x 8).
# Layout: tp=2,pp=1,cp=1,vpp=1,zero=3,offload=optimizer+params,mbs=1,recompute=full,sp=off
#
# What the training script must do for this layout (ds_config.json cannot do it; README.md):
#   - initialize: deepspeed.initialize(model=..., model_parameters=..., config=<this folder>/ds_config.json) builds the optimizer and the lr scheduler of the recipe (pass no optimizer of your own); call engine.step() once per micro-batch
#   - tp: AutoTP needs Hugging Face / Llama-style module names or tensor_parallel.preset_model; give deepspeed.initialize an mpu whose data-parallel size is dp so train_batch_size = mbs·dp·gas holds
#   - data: shard the samples by the data-parallel rank (0..15, the mpu's get_data_parallel_rank()), not the global rank: the 2 ranks of one replica must read the same batch (DistributedSampler(num_replicas=dp, rank=dp_rank))
#   - recompute=full: checkpoint every decoder layer in the model code (deepspeed.checkpointing.checkpoint or torch.utils.checkpoint, e.g. model.gradient_checkpointing_enable() in transformers); ds_config.json cannot turn it on outside a PipelineModule
#
# Training recipe in ds_config.json, from the published one: Llama 2 (Touvron et al. 2023), section 2.2 and Table 1: AdamW (0.9, 0.95, eps 1e-5), cosine schedule, 2,000 warm-up steps, decay to 10% of the peak lr, weight decay 0.1, clipping 1.0, peak lr 3e-4 (7B, 13B) or 1.5e-4 (70B), 2.0T tokens.
# Values autotune chose (set them in the config's recipe: section; the run's length, seed and
# intervals are the script's, from these variables):
#   lr = 0.0003 (published recipe)
#   min_lr = 3e-05 (published recipe)
#   warmup_iters = 2,000 (published recipe)
#   decay_style = cosine (published recipe)
#   decay_iters = the run (476,838 iterations) (autotune default: the run's iterations)
#   weight_decay = 0.1 (published recipe)
#   clip_grad = 1.0 (published recipe)
#   adam_beta1 = 0.9 (published recipe)
#   adam_beta2 = 0.95 (published recipe)
#   adam_eps = 1e-05 (published recipe)
#   seed = 1234 (autotune default: Megatron-LM's default --seed)
#   train_tokens = 2,000,000,000,000 tokens (476,838 iterations) (published recipe)
#   save_interval = 1,000 (autotune default: a checkpoint every 1,000 iterations)
#   eval_interval = 1,000 (autotune default: Megatron-LM's default --eval-interval)
#   eval_iters = 10 (autotune default: ten validation batches per evaluation)
#   distributed_timeout_minutes = 60 (autotune default: Megatron's and DeepSpeed's 10 minutes are shorter than a large model's checkpoint load or a long-context step)
#
# Edit ./hostfile (ssh-reachable hosts), keep this folder on a filesystem every node sees, then:
#   TRAIN_SCRIPT=<your training script> bash launch_deepspeed.sh [script arguments]
# The script gets --deepspeed_config <this folder>/ds_config.json (deepspeed.add_config_arguments reads --deepspeed_config).
#
# What to train on: ds_config.json fixes the layout and the optimizer; the data, tokenizer,
# checkpoints and length of the run are the training script's. These variables reach it on every
# node (through the launcher's .deepspeed_env), for the script to read:
#   DATA_PATH, TOKENIZER_MODEL, CHECKPOINT_DIR, SAVE_INTERVAL, TRAIN_ITERS or TRAIN_TOKENS, SEED
#   (one iteration is 4194304 tokens: TRAIN_ITERS = TRAIN_TOKENS / 4194304;
#   defaults: the recipe's 2000000000000 tokens, seed 1234, a checkpoint every 1000).
# DEEPSPEED_TIMEOUT (minutes, default 60) bounds how long a collective waits.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"
# One node runs on local resources (the launcher would ssh to a hostfile's localhost); set
# HOSTFILE to use one anyway.
if [[ -z "${HOSTFILE:-}" ]] && (( ${NNODES:-4} > 1 )); then
  HOSTFILE="$HERE/hostfile"
fi
HOSTFILE="${HOSTFILE:-}"
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
export DEEPSPEED_TIMEOUT="${DEEPSPEED_TIMEOUT:-60}"
TRAIN_TOKENS="${TRAIN_TOKENS:-2000000000000}"
SEED="${SEED:-1234}"
SAVE_INTERVAL="${SAVE_INTERVAL:-1000}"

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
printf '%s\n' TORCH_NCCL_ASYNC_ERROR_HANDLING=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "DEEPSPEED_TIMEOUT=$DEEPSPEED_TIMEOUT" >> "$DS_ENV_FILE"
if [[ -n "${TRAIN_TOKENS:-}" && -z "${TRAIN_ITERS:-}" ]]; then
  TRAIN_ITERS="$(( (TRAIN_TOKENS + 4194304 - 1) / 4194304 ))"
fi
for name in DATA_PATH TOKENIZER_MODEL CHECKPOINT_DIR SAVE_INTERVAL TRAIN_ITERS TRAIN_TOKENS SEED; do
  if [[ -n "${!name:-}" ]]; then
    printf '%s=%s\n' "$name" "${!name}" >> "$DS_ENV_FILE"
    export "${name?}"  # and to this node's processes (the launcher reads the file for others)
  fi
done

LAUNCHER_ARGS=(--num_nodes "$NNODES" --num_gpus "$GPUS_PER_NODE" --master_port "$MASTER_PORT")
if [[ -n "$HOSTFILE" ]]; then
  LAUNCHER_ARGS=(--hostfile "$HOSTFILE" "${LAUNCHER_ARGS[@]}")
fi
if [[ -n "${MASTER_ADDR:-}" ]]; then
  LAUNCHER_ARGS+=(--master_addr "$MASTER_ADDR")
fi

PROGRAM_ARGS=(
  --deepspeed_config "$HERE/ds_config.json"
)

deepspeed "${LAUNCHER_ARGS[@]}" "$TRAIN_SCRIPT" "${PROGRAM_ARGS[@]}" "$@"
