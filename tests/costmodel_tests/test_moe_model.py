"""Mixture-of-Experts terms of the memory, FLOPs and step-time models.

Oracles: Megatron-LM's own formulas worked by hand in the tests (NVIDIA/Megatron-LM @
d98e8a64ddf34856e74b24714e3bedb2f5a39553: `megatron/training/theoretical_memory_usage.py`,
`compute_weight_and_optimizer_memory`; `megatron/training/training.py`,
`num_floating_point_operations`), and laws of the physics as hypothesis properties (sharding
experts over more ranks never grows a rank's states; MoE FLOPs lie between the active and the
total parameters' dense equivalent; an all-to-all inside a node is faster than across nodes).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.flops import attention_flops_per_token_per_layer
from autotune.costmodel.flops import logits_flops_per_token
from autotune.costmodel.flops import model_flops
from autotune.costmodel.memory import estimate_memory
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_config

EXAMPLES = 150
"""Examples per property."""


def _states(cfg: AutotuneConfig, layout: Layout) -> float:
    parts = estimate_memory(cfg, LayoutTable.from_layouts([layout]),
                            constants_for(cfg.cluster.gpu))
    return float(sum(parts.parts[name][0] for name in ("weights", "gradients", "optimizer")))


@pytest.mark.parametrize("tp,pp,ep,etp", [(1, 1, 8, 1), (2, 4, 8, 1), (2, 2, 4, 2)])
def test_mixtral_states_match_megatron_theoretical_memory(tp: int, pp: int, ep: int,
                                                           etp: int) -> None:
    """Weights + gradients + optimizer of Mixtral-8x7B on 64 H100 with the distributed
    optimizer equal Megatron-LM's `compute_weight_and_optimizer_memory` (file@commit in the
    module docstring), worked by hand: tp-sharded params (attention, embedding; the untied output
    layer too when pp = 1) and replicated ones (norms, router) at 6 + 12/dp bytes, routed experts
    /(pp·etp·ep) at 6 + 12/edp with edp = world/(etp·ep·pp). Megatron spreads the final norm
    over stages (h/pp params): the tolerance covers it."""
    cfg = load_config("mixtral-8x7b", "dgx-h100:8", framework="megatron")
    world, layers = 64, 32
    h, kv_channels, heads, groups, f, experts, vocab = 4096, 128, 32, 8, 14336, 8, 32000
    attention = 2 * h * h * ((1 + groups / heads) * (kv_channels * heads / h))
    routed = 2 * h * f * experts * 3 / 2
    norms, router, final_norm = 2 * h, h * experts, h
    tp_sharded = attention * layers
    replicated = (norms + router) * layers + final_norm
    expert_sharded = routed * layers
    on_tp = (tp_sharded / pp + h * vocab) / tp + (h * vocab / tp if pp == 1 else 0)
    on_replicated = replicated / pp
    on_expert = expert_sharded / pp / (etp * ep)
    dp, edp = world // (tp * pp), world // (etp * ep * pp)
    expected = (on_tp + on_replicated) * (6 + 12 / dp) + on_expert * (6 + 12 / edp)
    layout = Layout.derived(world, cfg.train.global_batch_size, tp=tp, pp=pp, zero=1, sp=tp > 1,
                            ep=ep, etp=etp)
    assert _states(cfg, layout) == pytest.approx(expected, rel=1e-5)


def _megatron_flops(b: int, s: int, layers: int, dense_layers: int, h: int, vocab: int,
                    ffn: int, moe_ffn: int, topk: int, shared: int, attention: float,
                    core: float) -> float:
    """Megatron-LM's `transformer_flops` (BSHD, SwiGLU), term by term."""
    expansion, fma, ffn_factor = 3, 2, 3
    moe_layers = layers - dense_layers
    mlp = expansion * fma * h * (ffn * ffn_factor * dense_layers
                                 + moe_ffn * topk * ffn_factor * moe_layers
                                 + shared * ffn_factor * moe_layers)
    logits = expansion * fma * h * vocab
    return b * s * (mlp + attention * layers + logits) + b * s * s * core * layers


def test_mixtral_flops_match_megatron_formula() -> None:
    """Mixtral-8x7B (h 4096, 32 layers, 32 heads of 128, 8 groups, experts of 14336, top-2,
    vocabulary 32000) at B = 1024, s = 4096: `num_floating_point_operations` of Megatron-LM
    worked by hand: routed experts count top-k, the attention projections 6·(h·(q + 2κ) + q·h)
    and the causal scores 6·q per token and key."""
    model = load_config("mixtral-8x7b", "dgx-h100:8").model
    q, kv = 128 * 32, 128 * 8
    attention = 3 * 2 * (4096 * (q + 2 * kv) + q * 4096)
    core = 3 * 2 * q / 2 * 2
    expected = _megatron_flops(1024, 4096, 32, 0, 4096, 32000, 14336, 14336, 2, 0,
                               attention, core)
    assert model_flops(model, 4096, 1024, 32000) == pytest.approx(expected, rel=1e-12)


def test_deepseek_v3_flops_match_megatron_formula() -> None:
    """DeepSeek-V3 (61 layers, first 3 dense of width 18432, 256 experts of 2048, top-8, one
    shared expert of 2048, multi-latent attention: 128 heads, q rank 1536, kv rank 512, head
    widths 128 + 64 rotary, values 128) at B = 15360, s = 4096: Megatron-LM's MLA branch by hand,
    projections q_rank·(h + a·(d_n + d_r) + 1) + kv_rank·(h + a·(d_n + d_v) + 1) + h·d_r +
    a·d_v·h and scores a·(d_n + d_r)/2 + a·d_v/2, each times 6."""
    model = load_config("deepseek-v3", "dgx-h100:8").model
    h, a = 7168, 128
    projections = (1536 * (h + a * (128 + 64) + 1) + 512 * (h + a * (128 + 128) + 1) + h * 64
                   + a * 128 * h)
    core = 6 * (a * (128 + 64) / 2 + a * 128 / 2)
    expected = _megatron_flops(15360, 4096, 61, 3, h, 129280, 18432, 2048, 8, 2048,
                               6 * projections, core)
    assert model_flops(model, 4096, 15360, 129280) == pytest.approx(expected, rel=1e-12)


@st.composite
def moe_problems(draw: st.DrawFn, nodes: tuple[int, ...] = (2, 4, 8)) -> AutotuneConfig:
    """A Mixture-of-Experts model (GQA, SwiGLU or GELU experts, maybe shared experts and dense
    first layers) on a multi-node cluster, Megatron."""
    heads = draw(st.sampled_from([16, 32, 64]))
    hidden = heads * 128
    experts = draw(st.sampled_from([8, 16, 64, 128]))
    model = ModelSpec(
        num_layers=draw(st.sampled_from([8, 16, 24, 32])),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=draw(st.sampled_from([4, 8])),
        ffn_hidden_size=4 * hidden,
        vocab_size=draw(st.integers(32000, 160000)),
        activation=draw(st.sampled_from(["gelu", "swiglu"])),
        tied_embeddings=False,
        max_position_embeddings=32768,
        position_embedding="rope",
        add_bias_linear=False,
        num_experts=experts,
        moe_router_topk=draw(st.sampled_from([1, 2, 4, 8])),
        moe_ffn_hidden_size=256 * draw(st.integers(1, 16)),
        moe_shared_expert_intermediate_size=draw(st.sampled_from([None, 1024, 2048])),
        moe_first_dense_layers=draw(st.sampled_from([0, 1, 3])),
    )
    cluster = load_cluster(f"{draw(st.sampled_from(['dgx-h100', 'dgx-a100']))}:"
                           f"{draw(st.sampled_from(nodes))}")
    train = TrainSpec(seq_length=draw(st.sampled_from([2048, 4096])),
                      global_batch_size=cluster.world_size * 4, framework="megatron")
    return AutotuneConfig(model=model, cluster=cluster, train=train)


def _layout(cfg: AutotuneConfig, **dims: int | bool | str) -> Layout:
    return Layout.derived(cfg.world_size, cfg.train.global_batch_size, **dims)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=moe_problems(), tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]),
       zero=st.sampled_from([0, 1]), ep=st.sampled_from([1, 2, 4]))
def test_more_expert_parallelism_shrinks_each_gpus_states(cfg: AutotuneConfig, tp: int,
                                                          pp: int, zero: int, ep: int) -> None:
    """Doubling ep halves the experts a GPU holds (E/ep shrinks): its weights + gradients +
    optimizer strictly shrink, and its peak memory never grows (the routed tokens a rank
    receives do not depend on ep)."""
    assume(cfg.model.num_experts is not None and cfg.model.num_experts % (2 * ep) == 0)
    assume(cfg.model.num_layers % pp == 0)
    small = _layout(cfg, tp=tp, pp=pp, zero=zero, sp=tp > 1, ep=ep)
    large = dataclasses.replace(small, ep=2 * ep)
    assert _states(cfg, large) < _states(cfg, small)
    k = constants_for(cfg.cluster.gpu)
    peak = estimate_memory(cfg, LayoutTable.from_layouts([small, large]), k).total
    assert peak[1] <= peak[0]


@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=moe_problems())
def test_moe_flops_lie_between_active_and_total_dense_equivalents(cfg: AutotuneConfig) -> None:
    """Linear FLOPs per token (scores aside) are at most 6 × the active parameters (those one
    token uses) and at least 6 × the active parameters less the embedding table, norms and
    routers (which run no GEMM in Megatron's count); with top-k below the expert count, below
    6 × all parameters."""
    m, s = cfg.model, cfg.train.seq_length
    counts = m.param_counts()
    per_token = (model_flops(m, s, 1, m.vocab_size) / s
                 - m.num_layers * attention_flops_per_token_per_layer(m, s))
    assert per_token - logits_flops_per_token(m, m.vocab_size) > 0
    moe = counts.moe_layer
    assert moe is not None
    norms = (counts.dense_layers * counts.dense_layer.norms + counts.moe_layers * moe.norms
             + counts.final_norm)
    lower = m.active_params() - counts.embedding - norms - counts.moe_layers * moe.router
    assert 6 * lower <= per_token <= 6 * m.active_params()
    if m.moe_router_topk < (m.num_experts or 0):
        assert per_token < 6 * m.num_params()


@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=moe_problems(), mbs=st.sampled_from([1, 2]))
def test_all_to_all_is_free_without_ep_and_slower_across_nodes(cfg: AutotuneConfig,
                                                               mbs: int) -> None:
    """ep = etp = 1 moves no token (ep_comm 0); an ep group spanning two nodes (2·gpus per
    node ranks) pays the NIC for half its bytes and takes longer than one inside a node, whose
    bytes go over NVLink (the bytes a rank sends do not depend on ep)."""
    gpn = cfg.cluster.gpus_per_node
    assume((cfg.model.num_experts or 0) % (2 * gpn) == 0)
    rows = [_layout(cfg, mbs=mbs, ep=ep) for ep in (1, gpn, 2 * gpn)]
    ep_comm = evaluate(cfg, LayoutTable.from_layouts(rows)).time.parts["ep_comm"]
    assert ep_comm[0] == 0.0
    assert 0.0 < ep_comm[1] < ep_comm[2]


@settings(max_examples=50, deadline=None)
@given(layers=st.integers(2, 48), nodes=st.sampled_from([1, 2, 4]))
def test_dense_models_ignore_the_moe_terms(layers: int, nodes: int) -> None:
    """A dense model has no expert traffic and no expert states: its ep_comm is 0 and none of
    its numbers move with the MoE load-imbalance constant."""
    cfg = load_config("llama3-8b", f"dgx-h100:{nodes}")
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"num_layers": layers})})
    table = LayoutTable.from_layouts([_layout(cfg, tp=t, zero=z, sp=t > 1)
                                      for t in (1, 2, 8) for z in (0, 1, 3)])
    k = constants_for(cfg.cluster.gpu)
    base = evaluate(cfg, table, k)
    skewed = evaluate(cfg, table, k.model_copy(update={"moe_load_imbalance": 3.0}))
    assert np.all(base.time.parts["ep_comm"] == 0.0)
    assert np.array_equal(base.step_time_s, skewed.step_time_s)
    assert np.array_equal(base.peak_memory_bytes, skewed.peak_memory_bytes)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=moe_problems(), recompute=st.sampled_from(["none", "selective", "full"]))
def test_expert_parallelism_moves_expert_work_not_removes_it(cfg: AutotuneConfig,
                                                             recompute: str) -> None:
    """The FLOPs all GPUs execute in a step do not depend on how the experts are split (ep,
    etp) or the layers staged (pp): every routed token copy still meets its expert once."""
    experts = cfg.model.num_experts or 0
    rows = [_layout(cfg, tp=2, pp=pp, ep=ep, etp=etp, sp=True, recompute=recompute)
            for pp in (1, 2) for ep in (1, 2, 8) for etp in (1, 2)
            if experts % ep == 0 and cfg.model.num_layers % pp == 0
            and cfg.model.moe_ffn % etp == 0]
    flops = evaluate(cfg, LayoutTable.from_layouts(rows)).time.flops
    assert np.allclose(flops, flops[0], rtol=1e-9)
