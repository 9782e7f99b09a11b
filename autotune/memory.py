"""Peak memory per GPU (the most loaded rank), as named parts, for many layouts at once.

Model states follow DeepSpeed's estimators (`estimate_zero2/3_model_states_mem_needs`: 2 B of
16-bit weights plus 18 B/param of 16-bit and fp32 gradients, fp32 master weights and Adam moments)
and Megatron-LM's `theoretical_memory_usage` (18 B/param, 6 + 12/d with the distributed
optimizer). Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4): per layer s·b·h·(10 + 24/t) bytes plus 5·a·s²·b/t for the attention
scores, generalised here to GQA and SwiGLU; sequence parallelism divides the replicated 10·sbh
by t;
flash attention and selective recompute drop the score term; full recompute keeps only each
layer's 2·s·b·h input. The first 1F1B stage holds min(m, p) micro-batches in flight, p + (p−1)/v
with interleaving (Megatron's factor). The last stage holds the fp32 logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.constants import Constants
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.stages import split_layers

GIB = 1024**3
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "runtime")
"""Named parts of the per-GPU memory estimate, in report order."""


ZERO3_PREFETCH_FRACTION = 0.25
"""ZeRO-3 prefetch bucket as a fraction of the reduce bucket (rendered and counted alike)."""


def deepspeed_bucket_elements(params_per_rank: np.ndarray | int) -> np.ndarray:
    """ZeRO reduce/all-gather bucket size in elements (what the rendered ds_config.json uses)."""
    return np.minimum(200_000_000, np.maximum(params_per_rank, 1_000_000))


def layer_activation_bytes(
    cfg: AutotuneConfig, t: LayoutTable, traffic: bool = False
) -> np.ndarray:
    """Bytes one layer stores for backward, for one micro-batch, without full recompute.

    With `traffic`, the bytes its forward writes whatever the recompute setting (the attention
    scores count whenever flash attention is off): what memory-bound kernels move.
    """
    m = cfg.model
    s = cfg.train.seq_length / t.cp
    sbh = s * t.mbs * m.hidden_size
    groups = m.query_groups / m.num_attention_heads
    # 2 norm inputs (4) + attention and MLP inputs (2 + 2) + two dropout masks (1 + 1)
    replicated = 10 * sbh
    # Q, K, V (GQA shrinks K and V), output-projection input, MLP intermediates (SwiGLU stores 3f)
    sharded = (4 + 4 * groups) * sbh + (6 if m.gated else 4) * s * t.mbs * m.ffn
    scores = 0 if cfg.train.flash_attention else 5 * m.num_attention_heads * s * s * t.mbs
    sharded = sharded + scores * (True if traffic else (t.recompute == 0))
    return replicated / np.where(t.sp, t.tp, 1) + sharded / t.tp


def _layer_input_bytes(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    s = cfg.train.seq_length / t.cp
    return 2 * s * t.mbs * cfg.model.hidden_size / np.where(t.sp, t.tp, 1)


@dataclasses.dataclass(slots=True)
class _Stage:
    layers: np.ndarray
    in_flight: np.ndarray
    embedding: bool
    output: bool


def _stages(cfg: AutotuneConfig, t: LayoutTable) -> list[_Stage]:
    split = split_layers(cfg, t.pp, t.vpp)
    m = np.maximum(t.gas, 1)  # micro-batches per step
    interleave = np.where(t.vpp > 1, (t.pp - 1) / t.vpp, 0.0)
    single = t.pp == 1
    first = np.where(single, 1, np.minimum(m, t.pp) + interleave)
    middle = np.where(t.pp > 2, np.minimum(m, t.pp - 1) + interleave, 0)
    last = np.where(single, 1, 1 + interleave)
    return [
        _Stage(split.first, first, True, False),
        _Stage(np.where(t.pp > 2, split.middle, 0), middle, False, False),
        _Stage(np.where(single, split.first, split.last), last, False, True),
    ]


def params_on_rank(
    cfg: AutotuneConfig,
    t: LayoutTable,
    layers: np.ndarray,
    embedding: np.ndarray,
    output: np.ndarray,
) -> np.ndarray:
    """Parameters held (before ZeRO sharding) by one tensor-parallel rank of a stage."""
    m = cfg.model
    vocab = cfg.padded_vocab(t.tp)
    norms = 2 * m.hidden_size * m.norm_factor
    sharded = (m.layer_params() - norms) / t.tp
    table = m.hidden_size * vocab / t.tp
    # a tied output layer still needs its own copy of the embedding on the last stage when pp > 1
    has_output_weight = output & ((~embedding) | (not m.tied_embeddings))
    return (
        layers * (sharded + norms)
        + embedding * table
        + has_output_weight * table
        + output * m.hidden_size * m.norm_factor
    )


def largest_module_params(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    """Parameters of the largest single module on a rank (what ZeRO-3 gathers at once)."""
    m = cfg.model
    mlp = m.hidden_size * m.ffn * (2 if m.gated else 1)
    return np.maximum(m.hidden_size * cfg.padded_vocab(t.tp), mlp) / t.tp


def shard_degree(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    """Ranks that ZeRO / the distributed optimizer shard over: dp·cp in both frameworks.

    Megatron's distributed optimizer uses the data-parallel group with context parallelism;
    DeepSpeed's ZeRO optimizers take `dp_process_group=self.seq_data_parallel_group`, the
    data-parallel group times the Ulysses ranks (deepspeed/runtime/engine.py, 0.19.8).
    """
    return t.dp * t.cp


def _state_bytes(cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray) -> dict[str, np.ndarray]:
    """Weights, gradients, optimizer states on the GPU and optimizer-side bytes on the host."""
    n = shard_degree(cfg, t)
    z, off = t.zero, t.offload
    gathered = largest_module_params(cfg, t)
    if cfg.train.framework == "deepspeed":
        # 16-bit weights; 16-bit grads + fp32 grad partition; fp32 master + Adam m, v (12 B)
        weights = np.where(z >= 3, 2 * params / n + 2 * gathered, 2 * params)
        grads = np.select(
            [z == 0, z == 1, z == 2],
            [6 * params, 2 * params + 4 * params / n, 6 * params / n],
            4 * params / n + 2 * gathered,
        )
        optimizer = np.where(z == 0, 12 * params, 12 * params / n)
        weights = np.where(off == 2, 2 * gathered, weights)
        offloaded = off >= 1
        grads = np.where(offloaded, np.where(z >= 3, 2 * gathered, 0.0), grads)
        optimizer = np.where(offloaded, 0.0, optimizer)
        host = offloaded * 16 * params / n + (off == 2) * 2 * params / n
    else:
        # Megatron: fp32 main grads (4 B); 0 DDP, 1 distributed optimizer, 2/3 Megatron-FSDP
        weights = np.where(z >= 3, 2 * params / n + 2 * gathered, 2 * params)
        grads = np.where(z >= 2, 4 * params / n + 4 * (z >= 3) * gathered, 4 * params)
        optimizer = np.where(z >= 1, 12 * params / n, 12 * params)
        offloaded = off >= 1
        optimizer = np.where(offloaded, 0.0, optimizer)
        host = offloaded * 12 * params / n
    return {"weights": weights, "gradients": grads, "optimizer": optimizer, "host": host}


def _buffers(cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray) -> np.ndarray:
    """Communication buffers the framework allocates beyond the model states."""
    if cfg.train.framework != "deepspeed":
        return np.zeros(len(t))
    bucket = deepspeed_bucket_elements(params)
    # overlap_comm double-buffers the reduce bucket; ZeRO-3 adds a prefetch bucket
    reduce = np.where(t.zero >= 1, 2 * 2 * bucket, 0.0)
    return reduce + np.where(t.zero >= 3, 2 * ZERO3_PREFETCH_FRACTION * bucket, 0.0)


def estimate_memory(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> dict[str, np.ndarray]:
    """Per-GPU peak memory parts (bytes) on the most loaded rank, plus `host` bytes per node.

    Returns arrays for MEMORY_PARTS, `total` (their sum), `host` (offloaded states on one node)
    and `stage` (0 first, 1 middle, 2 last: which stage was the most loaded).
    """
    m = cfg.model
    per_layer = layer_activation_bytes(cfg, t) * k.activation_memory_factor
    full = t.recompute == 2
    stored_per_layer = np.where(full, _layer_input_bytes(cfg, t), per_layer)
    s = cfg.train.seq_length / t.cp
    vocab = cfg.padded_vocab(t.tp)
    candidates = []
    for stage in _stages(cfg, t):
        present = stage.layers > 0
        embedding = np.full(len(t), stage.embedding) | ((t.pp == 1) & stage.output)
        output = np.full(len(t), stage.output)
        params = params_on_rank(cfg, t, stage.layers, embedding, output)
        states = _state_bytes(cfg, t, params)
        activations = stage.layers * stage.in_flight * stored_per_layer
        activations = activations + full * per_layer  # one layer re-materialised at a time
        activations = (
            activations
            + embedding * stage.in_flight * (8 * s * t.mbs + s * t.mbs * m.hidden_size) / t.tp
        )
        logits = output * 4 * s * t.mbs * (m.hidden_size + vocab) / t.tp
        parts = {
            "weights": states["weights"],
            "gradients": states["gradients"],
            "optimizer": states["optimizer"],
            "activations": activations,
            "logits": logits,
            "buffers": _buffers(cfg, t, params),
            "runtime": np.full(len(t), k.runtime_memory_gib * GIB),
        }
        total = sum(parts.values())
        candidates.append((np.where(present, total, -1.0), parts, states["host"]))
    totals = np.stack([c[0] for c in candidates])
    worst = np.argmax(totals, axis=0)
    out = {name: np.choose(worst, [c[1][name] for c in candidates]) for name in MEMORY_PARTS}
    out["total"] = np.max(totals, axis=0)
    host_per_gpu = np.max(np.stack([c[2] for c in candidates]), axis=0)
    out["host"] = host_per_gpu * cfg.cluster.gpus_per_node
    out["stage"] = worst
    return out


def usable_gpu_bytes(cfg: AutotuneConfig, k: Constants) -> float:
    """Device memory a layout may fill: capacity minus the fragmentation margin."""
    return cfg.cluster.gpu.memory_bytes * (1 - k.memory_margin)


def usable_host_bytes(cfg: AutotuneConfig, k: Constants) -> float:
    """Host memory per node that offloaded states may fill."""
    return cfg.cluster.host_memory_gb * 1e9 * (1 - k.memory_margin)
