#!/usr/bin/env bash
# Megatron-LM pretraining, rendered by autotune 0.1.0.
# Model llama3-70b on dgx-h100:16 (128 GPUs = 16 x 8).
# Layout: tp=4,pp=1,cp=2,vpp=1,zero=2,offload=none,mbs=1,recompute=none,sp=on
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
#   TRAIN_ITERS      --train-iters (default 20), or TRAIN_TOKENS: iterations = tokens / 4194304
#   EVAL_INTERVAL, EVAL_ITERS  (default 1000, 0: no evaluation); LOG_INTERVAL (default 1)
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

# Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS unset or > 1.
unset CUDA_DEVICE_MAX_CONNECTIONS
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

MEGATRON_ARGS=(
  --tensor-model-parallel-size 4
  --pipeline-model-parallel-size 1
  --context-parallel-size 2
  --sequence-parallel
  --use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads
  --ckpt-format fsdp_dtensor
  --no-gradient-accumulation-fusion
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --micro-batch-size 1
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
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
  --adam-eps 1e-08
  --clip-grad 1.0
)

TOKENS_PER_ITERATION=4194304
if [[ -n "${TRAIN_TOKENS:-}" && -z "${TRAIN_ITERS:-}" ]]; then
  TRAIN_ITERS="$(( (TRAIN_TOKENS + TOKENS_PER_ITERATION - 1) / TOKENS_PER_ITERATION ))"
fi
RUN_ARGS=(
  --train-iters "${TRAIN_ITERS:-20}"
  --log-interval "${LOG_INTERVAL:-1}"
  --eval-interval "${EVAL_INTERVAL:-1000}"
  --eval-iters "${EVAL_ITERS:-0}"
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
