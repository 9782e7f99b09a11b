"""Peak memory per GPU (the most loaded rank), as named parts, for many layouts at once.

Model states, their sharding and communication buffers are the framework's
(`autotune.frameworks`: DeepSpeed's estimators, Megatron-LM's `theoretical_memory_usage`).
Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4): per layer s·b·h·(10 + 24/t) bytes plus 5·a·s²·b/t for the attention
scores, generalised here to GQA and SwiGLU; sequence parallelism divides the replicated 10·sbh
by t;
flash attention and selective recompute drop the score term; full recompute keeps only each
layer's 2·s·b·h input. A MoE layer stores, instead of the dense MLP's intermediates, its shared
experts' (split by tp), the routed copies the slowest expert-parallel rank receives
(`kernels.routed_tokens` times `kernels.load_imbalance`: expert input and output, 2h + 2h, and the
expert MLP intermediates split by etp) and the router's probabilities and routing map; a stage
holds dense and MoE layers in the model's proportion. Model states of routed experts (E/ep
experts split by etp, `autotune.costmodel.sharding`) are sharded by ZeRO over the expert
data-parallel
degree edp = world/(etp·ep·pp), dense states over dp·cp (Megatron-LM
`theoretical_memory_usage.py`: 6 + 12/edp bytes for experts with the distributed optimizer).
The dispatch/combine all-to-all buffers are transient (freed within the layer) and not counted.
ZeRO-3 holds, beside the shards, what its framework gathers at once (`FrameworkTerms.zero3_live`:
DeepSpeed's largest module, PyTorch FSDP's current and next transformer-block units,
Megatron-FSDP's current unit, its prefetch and the gradient buckets waiting for their
reduce-scatter).
CPU workers keep what their eager layers save instead (`autotune.costmodel.eager`).
The first 1F1B stage holds min(m, p) micro-batches in flight, p + (p−1)/v
with interleaving (Megatron's factor). The last stage holds the fp32 logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.eager import runs_eager
from autotune.costmodel.eager import saved_activation_bytes
from autotune.costmodel.kernels import load_imbalance
from autotune.costmodel.kernels import routed_tokens
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.sharding import expert_params_on_rank
from autotune.costmodel.sharding import largest_module_params
from autotune.costmodel.sharding import layer_params_on_rank
from autotune.costmodel.sharding import params_on_rank
from autotune.costmodel.terms import Zero3Live
from autotune.costmodel.terms import terms_for
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.units import GIB

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "runtime")
"""Named parts of the per-GPU memory estimate, in report order."""


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Per-GPU peak memory of many layouts (bytes, one entry per row): the parts on the most
    loaded rank, their sum and the offloaded host bytes."""

    parts: dict[str, np.ndarray]
    """One array per name of MEMORY_PARTS."""
    total: np.ndarray
    """The sum of the parts: the peak of the most loaded rank."""
    host: np.ndarray
    """Offloaded states held in one node's host memory."""
    stage: np.ndarray
    """Which stage was the most loaded: 0 first, 1 middle, 2 last."""


def layer_activation_bytes(cfg: AutotuneConfig, t: LayoutTable, k: Constants,
                           moe: bool = False) -> np.ndarray:
    """Bytes one dense (or MoE) layer stores for backward, for one micro-batch, without full
    recompute."""
    m = cfg.model
    if runs_eager(cfg):
        return _eager_activation_bytes(cfg, t, k, moe)
    s = cfg.train.seq_length / t.cp
    sbh = s * t.mbs * m.hidden_size
    groups = m.query_groups / m.num_attention_heads
    # 2 norm inputs (4) + attention and MLP inputs (2 + 2) + two 1-byte dropout masks (with
    # dropout: Korthikanti's 2sbh of masks; a model trained without dropout stores none)
    replicated = (8 + (2 if m.hidden_dropout > 0 else 0)) * sbh
    # Q, K, V (GQA shrinks K and V), output-projection input, MLP intermediates (SwiGLU stores 3f)
    act = 6 if m.gated else 4
    width = (m.moe_shared_expert_intermediate_size or 0) if moe else m.ffn
    sharded = (4 + 4 * groups) * sbh + act * s * t.mbs * width
    scores = 0 if cfg.train.flash_attention else 5 * m.num_attention_heads * s * s * t.mbs
    sharded = sharded + scores * (t.recompute == 0)
    te_fp8 = fp8_saved_inputs(cfg)
    if te_fp8:
        # the QKV and MLP inputs (norm outputs) and the MLP down-projection input are kept in
        # fp8 (1 B); the attention output stays 16-bit for the attention backward and the
        # output projection keeps an fp8 copy of it (+1 B)
        q = m.head_dim * m.num_attention_heads
        replicated = replicated - 2 * sbh
        sharded = sharded - s * t.mbs * (width - q)
    stored: np.ndarray = replicated / np.where(t.sp, t.tp, 1) + sharded / t.tp
    stored = stored * element_bytes(cfg) / 2  # the counts above are 16-bit
    if not moe:
        return stored
    # the slowest rank's routed copies: expert input and output (2h + 2h, the output kept for
    # the routing-probability gradient) and the expert MLP intermediates (width / etp); the
    # router's fp32 probabilities and 1-byte routing map over E experts for its own tokens
    copies = routed_tokens(cfg, t) * load_imbalance(cfg, t, k)
    routed = copies * (4 * m.hidden_size + act * m.moe_ffn / t.etp)
    if te_fp8:  # the grouped GEMMs keep their inputs in fp8
        routed = routed - copies * (m.hidden_size + m.moe_ffn / t.etp)
    moe_stored: np.ndarray = stored + routed * element_bytes(cfg) / 2 + _router_bytes(cfg, t)
    return moe_stored


def _eager_activation_bytes(cfg: AutotuneConfig, t: LayoutTable, k: Constants,
                            moe: bool) -> np.ndarray:
    """An eager layer's saved tensors (`autotune.costmodel.eager.saved_activation_bytes`); a
    MoE layer's router keeps fp32 probabilities and a 1-byte routing map over E experts."""
    if not moe:
        return saved_activation_bytes(cfg, t)
    copies = routed_tokens(cfg, t) * load_imbalance(cfg, t, k)
    stored: np.ndarray = saved_activation_bytes(cfg, t, copies) + _router_bytes(cfg, t)
    return stored


def _router_bytes(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    """The router's fp32 probabilities and 1-byte routing map over E experts, own tokens."""
    tokens = cfg.train.seq_length / t.cp * t.mbs / t.tp
    router: np.ndarray = tokens * 5 * (cfg.model.num_experts or 1)
    return router


def fp8_saved_inputs(cfg: AutotuneConfig) -> bool:
    """Whether linear layers keep their inputs for the weight gradient in fp8: Transformer
    Engine in fp8 training (megatron-core stack). Source: NVIDIA/TransformerEngine
    `transformer_engine/pytorch/module/linear.py`, `_Linear.forward`: with fp8 (and no
    wgrad precision override) it saves the fp8-cast input, or its fp8 transpose, instead of
    the 16-bit input; `layernorm_linear.py` likewise for the norm output."""
    return cfg.train.precision == "fp8" and cfg.train.software_stack == "megatron-core"


def _layer_input_bytes(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    s = cfg.train.seq_length / t.cp
    inputs: np.ndarray = (element_bytes(cfg) * s * t.mbs * cfg.model.hidden_size
                          / np.where(t.sp, t.tp, 1))
    return inputs


@dataclasses.dataclass(slots=True)
class _Stage:
    layers: np.ndarray
    in_flight: np.ndarray
    embedding: bool
    output: bool


def _stages(cfg: AutotuneConfig, t: LayoutTable) -> list[_Stage]:
    split = terms_for(cfg).split_layers(cfg, t.pp, t.vpp)
    m = t.micro_batches
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


def estimate_memory(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> MemoryEstimate:
    """Per-GPU peak memory parts (bytes) on the most loaded rank, plus `host` bytes per node."""
    m = cfg.model
    share = m.moe_layer_share
    per_layer = layer_activation_bytes(cfg, t, k)
    if share:
        per_layer = (1 - share) * per_layer + share * layer_activation_bytes(cfg, t, k, moe=True)
    per_layer = per_layer * k.activation_memory_factor
    full = t.recompute == 2
    stored_per_layer = np.where(full, _layer_input_bytes(cfg, t), per_layer)
    s = cfg.train.seq_length / t.cp
    framework = terms_for(cfg)
    vocab = framework.padded_vocab(m.vocab_size, t.tp)
    live = framework.zero3_live(cfg, t, layer_params_on_rank(m, t),
                                largest_module_params(m, t, vocab), m.hidden_size * vocab / t.tp)
    candidates = []
    for stage in _stages(cfg, t):
        present = stage.layers > 0
        embedding = np.full(len(t), stage.embedding) | ((t.pp == 1) & stage.output)
        output = np.full(len(t), stage.output)
        params = params_on_rank(m, t, vocab, stage.layers, embedding, output,
                                experts=False)
        states = framework.state_bytes(cfg, t, params, live, shard=t.shard_degree)
        if share:
            experts = expert_params_on_rank(m, t, stage.layers)
            expert_states = framework.state_bytes(cfg, t, experts, Zero3Live.none(len(t)),
                                                  shard=t.expert_data_parallel)
            states = {name: states[name] + expert_states[name] for name in states}
            params = params + experts
        activations = stage.layers * stage.in_flight * stored_per_layer
        activations = activations + full * per_layer  # one layer re-materialised at a time
        activations = (
            activations
            + embedding * stage.in_flight * (8 * s * t.mbs + s * t.mbs * m.hidden_size) / t.tp
        )
        # eager cross entropy keeps its fp32 log-softmax beside the logits (the fused
        # vocabulary-parallel loss of the GPU stacks works in place)
        copies = 2 if runs_eager(cfg) else 1
        logits = output * 4 * s * t.mbs * (m.hidden_size + copies * vocab) / t.tp
        parts = {
            "weights": states["weights"],
            "gradients": states["gradients"],
            "optimizer": states["optimizer"],
            "activations": activations,
            "logits": logits,
            "buffers": framework.buffer_bytes(cfg, t, params),
            "runtime": np.full(len(t), k.runtime_memory_gib * GIB),
        }
        total = sum(parts.values())
        candidates.append((np.where(present, total, -1.0), parts, states["host"]))
    totals = np.stack([c[0] for c in candidates])
    worst = np.argmax(totals, axis=0)
    host_per_gpu = np.max(np.stack([c[2] for c in candidates]), axis=0)
    return MemoryEstimate(
        parts={name: np.choose(worst, [c[1][name] for c in candidates]) for name in MEMORY_PARTS},
        total=np.max(totals, axis=0),
        host=host_per_gpu * cfg.cluster.gpus_per_node,
        stage=worst,
    )


def usable_gpu_bytes(cfg: AutotuneConfig, k: Constants) -> float:
    """Device memory a layout may fill: capacity minus the fragmentation margin."""
    return cfg.cluster.gpu.memory_bytes * (1 - k.memory_margin)


def usable_host_bytes(cfg: AutotuneConfig, k: Constants) -> float:
    """Host memory per node that offloaded states may fill."""
    return cfg.cluster.host_memory_gb * 1e9 * (1 - k.memory_margin)
