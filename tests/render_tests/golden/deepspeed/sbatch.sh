#!/usr/bin/env bash
#SBATCH --job-name=golden
##SBATCH --partition=<partition>   (a disabled placeholder: drop one '#' and fill it in)
##SBATCH --account=<account>   (a disabled placeholder: drop one '#' and fill it in)
##SBATCH --time=<time>   (a disabled placeholder: drop one '#' and fill it in)
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
# Slurm job rendered by autotune VERSION.
# Model llama2-7b on dgx-h100:4 (32 GPUs = 4 x 8).
# Layout: tp=2,pp=1,cp=1,vpp=1,zero=3,offload=optimizer+params,mbs=1,recompute=full,sp=off
#
# Submit from the folder that holds the artifacts (or set ARTIFACTS_DIR):
#   cd <artifacts> && TRAIN_SCRIPT=<your training script> sbatch sbatch.sh [script arguments]
#
# What the training script must do for this layout (see README.md):
#   - initialize: deepspeed.initialize(model=..., model_parameters=..., config=<this folder>/ds_config.json) builds the optimizer and the lr scheduler of the recipe (pass no optimizer of your own); call engine.step() once per micro-batch
#   - tp: AutoTP needs Hugging Face / Llama-style module names or tensor_parallel.preset_model; give deepspeed.initialize an mpu whose data-parallel size is dp so train_batch_size = mbs·dp·gas holds
#   - data: shard the samples by the data-parallel rank (0..15, the mpu's get_data_parallel_rank()), not the global rank: the 2 ranks of one replica must read the same batch (DistributedSampler(num_replicas=dp, rank=dp_rank))
#   - recompute=full: checkpoint every decoder layer in the model code (deepspeed.checkpointing.checkpoint or torch.utils.checkpoint, e.g. model.gradient_checkpointing_enable() in transformers); ds_config.json cannot turn it on outside a PipelineModule
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

export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# Minutes a collective may wait before the job fails (DeepSpeed's default is 10).
export DEEPSPEED_TIMEOUT="${DEEPSPEED_TIMEOUT:-60}"
# The run's length, seed and checkpoint interval, for the training script to read.
export TRAIN_TOKENS="${TRAIN_TOKENS:-2000000000000}"
export SEED="${SEED:-1234}"
export SAVE_INTERVAL="${SAVE_INTERVAL:-1000}"
# One iteration is 4194304 tokens: TRAIN_ITERS (when unset) covers TRAIN_TOKENS.
export TRAIN_ITERS="${TRAIN_ITERS:-$(( (TRAIN_TOKENS + 4194304 - 1) / 4194304 ))}"

TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"
PROGRAM_ARGS=(
  --deepspeed_config "$ARTIFACTS_DIR/ds_config.json"
)
TORCHRUN_ARGS=(--nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES")

# One torchrun per node; the c10d rendezvous on node 0 assigns node ranks.
srun "${SRUN_ARGS[@]}" torchrun \
  "${TORCHRUN_ARGS[@]}" \
  --rdzv_id "$SLURM_JOB_ID" \
  --rdzv_backend c10d \
  --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \
  "$TRAIN_SCRIPT" \
  "${PROGRAM_ARGS[@]}" \
  "$@"
