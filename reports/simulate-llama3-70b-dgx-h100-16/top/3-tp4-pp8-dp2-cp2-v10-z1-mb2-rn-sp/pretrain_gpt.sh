#!/usr/bin/env bash
# Megatron-LM pretraining, rendered by autotune 0.1.0.
# Model llama3-70b on dgx-h100:16 (128 GPUs = 16 x 8).
# Layout: tp=4,pp=8,cp=2,vpp=10,zero=1,offload=none,mbs=2,recompute=none,sp=on
#
# A TRAINING RUN of the recipe below: 1168251 iterations = 4899999842304 tokens by default
# (4194304 tokens per iteration), warm-up 2000 iterations, cosine decay.
#
# Training recipe, from the published one: Megatron-Bridge llama3_8b/llama3_70b pretrain_config (NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/llama/, with recipes/utils/optimizer_utils.py distributed_fused_adam_with_cosine_annealing; the scheduler's constant start/end_weight_decay 0.033 is the weight decay that applies).
# Values autotune chose (set them in the config's recipe: section):
#   lr = 0.0003 (published recipe)
#   min_lr = 3e-05 (published recipe)
#   warmup_iters = 2,000 (published recipe)
#   decay_style = cosine (published recipe)
#   decay_iters = the run (1,168,251 iterations) (autotune default: the run's iterations)
#   weight_decay = 0.033 (published recipe)
#   clip_grad = 1.0 (published recipe)
#   adam_beta1 = 0.9 (published recipe)
#   adam_beta2 = 0.95 (published recipe)
#   adam_eps = 1e-05 (published recipe)
#   seed = 1234 (published recipe)
#   train_tokens = 4,899,999,842,304 tokens (1,168,251 iterations) (published recipe)
#   save_interval = 2,000 (published recipe)
#   eval_interval = 2,000 (published recipe)
#   eval_iters = 32 (published recipe)
#   distributed_timeout_minutes = 60 (autotune default: Megatron's and DeepSpeed's 10 minutes are shorter than a large model's checkpoint load or a long-context step)
#
# Run on every node (sbatch.sh does this through srun):
#   MEGATRON_LM=<checkout> NNODES=<nodes> NODE_RANK=<this node> MASTER_ADDR=<node 0> bash pretrain_gpt.sh
# Arguments of this script are appended to the rendered flags (argparse keeps the last value).
#
# What to train on (environment variables):
#   DATA_PATH        --data-path: a preprocessed dataset prefix (tools/preprocess_data.py), or a
#                    blend "0.7 /data/a_text_document 0.3 /data/b_text_document"
#                    (required, unless MOCK_DATA=1 for Megatron's synthetic data)
#   TOKENIZER_MODEL  --tokenizer-model, a Hugging Face tokenizer name or path (with DATA_PATH)
#   TOKENIZER_TYPE   --tokenizer-type (default HuggingFaceTokenizer)
#   SPLIT            --split train,valid,test (default 99,1,0)
#   CHECKPOINT_DIR   --save and --load (unset: no checkpoints); SAVE_INTERVAL (default 2000)
#   TRAIN_ITERS      --train-iters (default 1168251), or TRAIN_TOKENS: iterations = tokens / 4194304
#   LR_WARMUP_ITERS  --lr-warmup-iters (default 2000); it must stay below the decay length
#   EVAL_INTERVAL, EVAL_ITERS  (default 2000, 32; 0: no evaluation); LOG_INTERVAL (default 1)
set -euo pipefail

MEGATRON_LM_DEFAULT=/opt/Megatron-LM
MEGATRON_LM="${MEGATRON_LM:-$MEGATRON_LM_DEFAULT}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
NNODES="${NNODES:-16}"
NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-6000}"
WORLD_SIZE_RENDERED=128

if (( NNODES * GPUS_PER_NODE != WORLD_SIZE_RENDERED )); then
  echo "pretrain_gpt.sh: NNODES ($NNODES) x GPUS_PER_NODE ($GPUS_PER_NODE) must be the $WORLD_SIZE_RENDERED GPUs this layout was rendered for" >&2
  exit 2
fi
if [[ ! -f "$MEGATRON_LM/pretrain_gpt.py" ]]; then
  echo "pretrain_gpt.sh: no pretrain_gpt.py in MEGATRON_LM=$MEGATRON_LM; point MEGATRON_LM at a Megatron-LM checkout" >&2
  exit 2
fi

# Tensor/context parallelism: Megatron requires one hardware work queue (pre-Blackwell GPUs).
export CUDA_DEVICE_MAX_CONNECTIONS=1
# A hung collective fails the job after --distributed-timeout-minutes instead of blocking it.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

MEGATRON_ARGS=(
  --tensor-model-parallel-size 4
  --pipeline-model-parallel-size 8
  --context-parallel-size 2
  --num-layers-per-virtual-pipeline-stage 1
  --sequence-parallel
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --micro-batch-size 2
  --global-batch-size 512
  --num-layers 80
  --hidden-size 8192
  --num-attention-heads 64
  --ffn-hidden-size 28672
  --seq-length 8192
  --max-position-embeddings 8192
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --hidden-dropout 0
  --attention-dropout 0
  --swiglu
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --group-query-attention
  --num-query-groups 8
  --position-embedding-type rope
  --rotary-base 500000
  --bf16
  --log-throughput
  --lr 0.0003
  --min-lr 3e-05
  --lr-decay-style cosine
  --weight-decay 0.033
  --adam-beta1 0.9
  --adam-beta2 0.95
  --adam-eps 1e-05
  --clip-grad 1.0
  --seed 1234
  --distributed-timeout-minutes 60
)

TOKENS_PER_ITERATION=4194304
if [[ -n "${TRAIN_TOKENS:-}" && -z "${TRAIN_ITERS:-}" ]]; then
  TRAIN_ITERS="$(( (TRAIN_TOKENS + TOKENS_PER_ITERATION - 1) / TOKENS_PER_ITERATION ))"
fi
TRAIN_ITERS="${TRAIN_ITERS:-1168251}"
LR_WARMUP_ITERS="${LR_WARMUP_ITERS:-2000}"
DECAY_ITERS="$TRAIN_ITERS"
if (( LR_WARMUP_ITERS >= DECAY_ITERS )); then
  echo "pretrain_gpt.sh: LR_WARMUP_ITERS ($LR_WARMUP_ITERS) must be below the $DECAY_ITERS decay iterations (Megatron asserts it); train longer (TRAIN_TOKENS, TRAIN_ITERS) or lower LR_WARMUP_ITERS" >&2
  exit 2
fi
RUN_ARGS=(
  --train-iters "$TRAIN_ITERS"
  --lr-warmup-iters "$LR_WARMUP_ITERS"
  --log-interval "${LOG_INTERVAL:-1}"
  --eval-interval "${EVAL_INTERVAL:-2000}"
  --eval-iters "${EVAL_ITERS:-32}"
)
if [[ -n "${DATA_PATH:-}" ]]; then
  read -r -a DATA_PREFIXES <<< "$DATA_PATH"
  RUN_ARGS+=(--data-path "${DATA_PREFIXES[@]}" --split "${SPLIT:-99,1,0}")
  RUN_ARGS+=(--tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}")
  RUN_ARGS+=(--tokenizer-model "${TOKENIZER_MODEL:?pretrain_gpt.sh: set TOKENIZER_MODEL with DATA_PATH}")
elif [[ "${MOCK_DATA:-0}" == 1 ]]; then
  RUN_ARGS+=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128256)
else
  echo "pretrain_gpt.sh: set DATA_PATH and TOKENIZER_MODEL to train (or MOCK_DATA=1 for synthetic data)" >&2
  exit 2
fi
if [[ -n "${CHECKPOINT_DIR:-}" ]]; then
  RUN_ARGS+=(--save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" --save-interval "${SAVE_INTERVAL:-2000}")
fi

exec torchrun \
  --nproc_per_node "$GPUS_PER_NODE" \
  --nnodes "$NNODES" \
  --node_rank "$NODE_RANK" \
  --master_addr "$MASTER_ADDR" \
  --master_port "$MASTER_PORT" \
  "$MEGATRON_LM/pretrain_gpt.py" \
  "${MEGATRON_ARGS[@]}" \
  "${RUN_ARGS[@]}" \
  "$@"
