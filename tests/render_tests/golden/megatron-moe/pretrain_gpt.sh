#!/usr/bin/env bash
# Megatron-LM pretraining, rendered by autotune VERSION.
# Model mixtral-8x7b on dgx-h100:8 (64 GPUs = 8 x 8).
# Layout: tp=2,pp=4,cp=2,vpp=1,zero=1,offload=none,mbs=1,recompute=none,sp=on,ep=8,etp=1
#
# A TRAINING RUN of the recipe below: 222697 iterations = 934055854080 tokens by default
# (4194304 tokens per iteration), warm-up 2000 iterations, cosine decay.
#
# Training recipe.
# Values autotune chose (set them in the config's recipe: section):
#   lr = 0.0003 (autotune default: Llama 2 7B/13B's peak lr (Touvron et al. 2023, Table 1))
#   min_lr = 3e-05 (autotune default: a tenth of the peak lr (Llama 2, GPT-3))
#   warmup_iters = 2,000 (autotune default: Llama 2's 2,000 steps, at most a tenth of the run)
#   decay_style = cosine (autotune default: Llama 2, Llama 3 and GPT-3 decay by a cosine)
#   decay_iters = the run (222,697 iterations) (autotune default: the run's iterations)
#   weight_decay = 0.1 (autotune default: AdamW weight decay of Llama 2 and GPT-3)
#   clip_grad = 1.0 (autotune default: global gradient-norm clip of Llama 2 and GPT-3)
#   adam_beta1 = 0.9 (autotune default: Llama 2 and GPT-3)
#   adam_beta2 = 0.95 (autotune default: Llama 2 and GPT-3)
#   adam_eps = 1e-08 (autotune default: GPT-3 (Brown et al. 2020, Appendix B))
#   seed = 1234 (autotune default: Megatron-LM's default --seed)
#   train_tokens = 934,055,854,080 tokens (222,697 iterations) (autotune default: 20 tokens per parameter, compute-optimal per Hoffmann et al. 2022)
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
#   TRAIN_ITERS      --train-iters (default 222697), or TRAIN_TOKENS: iterations = tokens / 4194304
#   LR_WARMUP_ITERS  --lr-warmup-iters (default 2000); it must stay below the decay length
#   EVAL_INTERVAL, EVAL_ITERS  (default 1000, 10; 0: no evaluation); LOG_INTERVAL (default 1)
set -euo pipefail

MEGATRON_LM_DEFAULT=/opt/Megatron-LM
MEGATRON_LM="${MEGATRON_LM:-$MEGATRON_LM_DEFAULT}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
NNODES="${NNODES:-8}"
NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-6000}"
WORLD_SIZE_RENDERED=64

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
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 4
  --context-parallel-size 2
  --sequence-parallel
  --expert-model-parallel-size 8
  --expert-tensor-parallel-size 1
  --moe-token-dispatcher-type alltoall
  --moe-grouped-gemm
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --micro-batch-size 1
  --global-batch-size 1024
  --num-layers 32
  --hidden-size 4096
  --num-attention-heads 32
  --ffn-hidden-size 14336
  --seq-length 4096
  --max-position-embeddings 32768
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
  --rotary-base 1000000
  --num-experts 8
  --moe-router-topk 2
  --moe-ffn-hidden-size 14336
  --moe-layer-freq 1
  --moe-router-score-function softmax
  --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 0.02
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
  --seed 1234
  --distributed-timeout-minutes 60
)

TOKENS_PER_ITERATION=4194304
if [[ -n "${TRAIN_TOKENS:-}" && -z "${TRAIN_ITERS:-}" ]]; then
  TRAIN_ITERS="$(( (TRAIN_TOKENS + TOKENS_PER_ITERATION - 1) / TOKENS_PER_ITERATION ))"
fi
TRAIN_ITERS="${TRAIN_ITERS:-222697}"
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
  --eval-interval "${EVAL_INTERVAL:-1000}"
  --eval-iters "${EVAL_ITERS:-10}"
)
if [[ -n "${DATA_PATH:-}" ]]; then
  read -r -a DATA_PREFIXES <<< "$DATA_PATH"
  RUN_ARGS+=(--data-path "${DATA_PREFIXES[@]}" --split "${SPLIT:-99,1,0}")
  RUN_ARGS+=(--tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}")
  RUN_ARGS+=(--tokenizer-model "${TOKENIZER_MODEL:?pretrain_gpt.sh: set TOKENIZER_MODEL with DATA_PATH}")
elif [[ "${MOCK_DATA:-0}" == 1 ]]; then
  RUN_ARGS+=(--mock-data --tokenizer-type NullTokenizer --vocab-size 32000)
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
