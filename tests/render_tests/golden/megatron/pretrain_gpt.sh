#!/usr/bin/env bash
# Megatron-LM pretraining, rendered by autotune VERSION.
# Model llama3-405b on dgx-h100:2048 (16384 GPUs = 2048 x 8).
# Layout: tp=8,pp=16,cp=8,vpp=1,zero=1,offload=optimizer,mbs=1,recompute=selective,sp=on
# Pipeline stages hold 7 (first), 8 (middle) and 7 (last) layers: the embedding and/or loss count as layers.
#
# A TRAINING RUN of the recipe below: 929833 iterations = 15600000000000 tokens by default
# (16777216 tokens per iteration), warm-up 8000 iterations, cosine decay.
#
# Training recipe, from the published one: Llama 3 Herd of Models (Dubey et al. 2024), section 3.4.1: peak lr 8e-5, linear warm-up of 8,000 steps, cosine decay to 8e-7 over 1,200,000 steps; 15.6T pre-training tokens (section 3).
# Values autotune chose (set them in the config's recipe: section):
#   lr = 8e-05 (published recipe)
#   min_lr = 8e-07 (published recipe)
#   warmup_iters = 8,000 (published recipe)
#   decay_style = cosine (published recipe)
#   decay_iters = 1,200,000 (published recipe)
#   weight_decay = 0.1 (autotune default: AdamW weight decay of Llama 2 and GPT-3)
#   clip_grad = 1.0 (autotune default: global gradient-norm clip of Llama 2 and GPT-3)
#   adam_beta1 = 0.9 (autotune default: Llama 2 and GPT-3)
#   adam_beta2 = 0.95 (autotune default: Llama 2 and GPT-3)
#   adam_eps = 1e-08 (autotune default: GPT-3 (Brown et al. 2020, Appendix B))
#   seed = 1234 (autotune default: Megatron-LM's default --seed)
#   train_tokens = 15,600,000,000,000 tokens (929,833 iterations) (published recipe)
#   save_interval = 1,000 (autotune default: a checkpoint every 1,000 iterations)
#   eval_interval = 1,000 (autotune default: Megatron-LM's default --eval-interval)
#   eval_iters = 10 (autotune default: ten validation batches per evaluation)
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
#   CHECKPOINT_DIR   --save and --load (unset: no checkpoints); SAVE_INTERVAL (default 1000)
#   TRAIN_ITERS      --train-iters (default 929833), or TRAIN_TOKENS: iterations = tokens / 16777216
#   LR_WARMUP_ITERS  --lr-warmup-iters (default 8000); it must stay below the decay length
#   EVAL_INTERVAL, EVAL_ITERS  (default 1000, 10; 0: no evaluation); LOG_INTERVAL (default 1)
set -euo pipefail

MEGATRON_LM_DEFAULT=/opt/Megatron-LM
MEGATRON_LM="${MEGATRON_LM:-$MEGATRON_LM_DEFAULT}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
NNODES="${NNODES:-2048}"
NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-6000}"
WORLD_SIZE_RENDERED=16384

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
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 16
  --context-parallel-size 8
  --account-for-embedding-in-pipeline-split
  --account-for-loss-in-pipeline-split
  --sequence-parallel
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --optimizer-cpu-offload
  --use-precision-aware-optimizer
  --optimizer-offload-fraction 1.0
  --recompute-granularity selective
  --micro-batch-size 1
  --global-batch-size 2048
  --num-layers 126
  --hidden-size 16384
  --num-attention-heads 128
  --ffn-hidden-size 53248
  --seq-length 8192
  --max-position-embeddings 131072
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
  --use-rope-scaling
  --rope-scaling-factor 8
  --bf16
  --log-throughput
  --lr 8e-05
  --min-lr 8e-07
  --lr-decay-style cosine
  --lr-decay-iters 1200000
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
  --adam-eps 1e-08
  --clip-grad 1.0
  --seed 1234
  --distributed-timeout-minutes 60
)

TOKENS_PER_ITERATION=16777216
if [[ -n "${TRAIN_TOKENS:-}" && -z "${TRAIN_ITERS:-}" ]]; then
  TRAIN_ITERS="$(( (TRAIN_TOKENS + TOKENS_PER_ITERATION - 1) / TOKENS_PER_ITERATION ))"
fi
TRAIN_ITERS="${TRAIN_ITERS:-929833}"
LR_WARMUP_ITERS="${LR_WARMUP_ITERS:-8000}"
DECAY_ITERS=1200000
if (( LR_WARMUP_ITERS >= DECAY_ITERS )); then
  echo "pretrain_gpt.sh: LR_WARMUP_ITERS ($LR_WARMUP_ITERS) must be below the $DECAY_ITERS decay iterations (Megatron asserts it); train longer (TRAIN_TOKENS, TRAIN_ITERS) or lower LR_WARMUP_ITERS" >&2
  exit 2
fi
RUN_ARGS=(
  --train-iters "$TRAIN_ITERS"
  --lr-warmup-iters "$LR_WARMUP_ITERS"
  --log-interval "${LOG_INTERVAL:-1}"
  --eval-interval "${EVAL_INTERVAL:-1000}"
  --eval-iters "${EVAL_ITERS:-10}"
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
  RUN_ARGS+=(--save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" --save-interval "${SAVE_INTERVAL:-1000}")
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
