"""MoE token dispatch: distinct destination nodes, bytes per dispatch, and their time.

Oracles: counting by hand and by enumerating every top-k choice (uniform routing); the
node-limited routing of DeepSeek-V3 (arXiv:2412.19437 §3.2.2: each token to at most M = 4
nodes) with its released router (256 experts, 8 groups, group top-4, top-8); one MoE layer's
dispatch time worked by hand from the cluster's links and NCCL's latencies; and, as a
hypothesis property, the DeepEP scheme's point (deepseek-ai/DeepEP README): deduplicating per
node never sends more over the network than the plain all-to-all, and the same (nothing) when the
ep group fits in one node.
"""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from pydantic import ValidationError

from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.expert_dispatch import dispatch_bytes
from autotune.costmodel.expert_dispatch import expected_bins
from autotune.costmodel.expert_dispatch import remote_nodes
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_config


def _moe(experts: int, topk: int, hidden: int = 1024, groups: int | None = None,
         group_topk: int | None = None, layers: int = 2) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=hidden, num_attention_heads=8,
                     ffn_hidden_size=4 * hidden, vocab_size=32000, max_position_embeddings=4096,
                     num_experts=experts, moe_router_topk=topk, moe_router_num_groups=groups,
                     moe_router_group_topk=group_topk)


def test_distinct_nodes_by_hand_and_by_enumeration() -> None:
    """E = 8 experts on 2 nodes, top-2: both on one node with chance 2·C(4,2)/C(8,2) = 12/28,
    so 2 − 12/28 = 11/7 nodes. E = 16 on 4 nodes, top-4: the mean over all C(16,4) choices,
    enumerated. Many experts (2^20) on 4 nodes, top-8: each pick nearly independent, the
    with-replacement count 4·(1 − (3/4)^8)."""
    assert expected_bins(8, np.array([2.0]), 2)[0] == pytest.approx(11 / 7, rel=1e-12)
    node_of = [e // 4 for e in range(16)]
    counts = [len({node_of[e] for e in pick}) for pick in itertools.combinations(range(16), 4)]
    assert len(counts) == comb(16, 4)
    assert expected_bins(16, np.array([4.0]), 4)[0] == pytest.approx(np.mean(counts), rel=1e-12)
    assert expected_bins(2**20, np.array([4.0]), 8)[0] == pytest.approx(
        4 * (1 - (3 / 4) ** 8), rel=1e-4)


def test_node_limited_routing_caps_the_remote_nodes() -> None:
    """DeepSeek-V3's router (256 experts, 8 groups, group top-4, top-8). ep 64 on 8 nodes: one
    group per node, uniform routing would reach 8·(1 − C(224,8)/C(256,8)) ≈ 5.3 nodes, the
    group limit caps it at M = 4, of which 7/8 are other nodes: 3.5. ep 256 on 32 nodes: a group
    spans 4 nodes, so up to 16; uniform routing reaches fewer, 32·(1 − C(248,8)/C(256,8)),
    uncapped, less the own node's 1/32. Without groups, ep 64: the uniform count, less 1/8."""
    model = load_config("deepseek-v3", "dgx-h100:8").model
    uniform8 = 8 * (1 - comb(224, 8) / comb(256, 8))
    assert uniform8 > 4
    assert remote_nodes(model, np.array([8.0]))[0] == pytest.approx(3.5, rel=1e-12)
    uniform32 = 32 * (1 - comb(248, 8) / comb(256, 8))
    assert remote_nodes(model, np.array([32.0]))[0] == pytest.approx(uniform32 * 31 / 32,
                                                                     rel=1e-12)
    free = model.model_copy(update={"moe_router_num_groups": None, "moe_router_group_topk": None})
    assert remote_nodes(free, np.array([8.0]))[0] == pytest.approx(uniform8 * 7 / 8, rel=1e-12)


def test_one_dispatch_moves_these_bytes() -> None:
    """h = 1024, 16 experts, top-4, 1000 tokens, ep 16 on 2 nodes of 8: 2h·1000·4 = 8,192,000
    bytes of copies. Plain all-to-all: half to the other node (4,096,000 over the NIC), 7/16 to
    the 7 other GPUs of the node (3,584,000 over NVLink). DeepEP: the other node is among a
    token's experts unless all 4 lie on the sender's: 1 − C(8,4)/C(16,4) = 25/26, so
    2,048,000·25/26 over the NIC; one expert per GPU, so 4 distinct GPUs, each reached over
    NVLink from the node's receiving GPU unless it is that GPU (7/8): 2,048,000·4·7/8."""
    model = _moe(16, 4)
    plain = dispatch_bytes(model, np.array([1000.0]), np.array([16.0]), np.array([8.0]), False)
    dedup = dispatch_bytes(model, np.array([1000.0]), np.array([16.0]), np.array([8.0]), True)
    assert (plain[0][0], plain[1][0]) == pytest.approx((4_096_000, 3_584_000), rel=1e-12)
    assert (dedup[0][0], dedup[1][0]) == pytest.approx((2_048_000 * 25 / 26, 7_168_000),
                                                       rel=1e-12)


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_one_layer_of_expert_traffic_by_hand(dispatcher: str) -> None:
    """Two MoE layers (h = 1024, 16 experts, top-4) on 2 DGX-H100 nodes, tp = pp = 1, ep = 16,
    mbs 1 of 1024 tokens, 32 sequences (2 micro-batches), balanced routing: each layer and
    micro-batch runs 4 exchanges (dispatch and combine, forward and backward), each the slower
    of its NIC and NVLink bytes (`test_one_dispatch_moves_these_bytes`, scaled to 1024 tokens)
    plus NCCL's base and one network step of latency."""
    cluster = load_cluster("dgx-h100:2")
    train = TrainSpec(seq_length=1024, global_batch_size=32, moe_token_dispatcher=dispatcher)
    cfg = AutotuneConfig(model=_moe(16, 4), cluster=cluster, train=train)
    k = constants_for(cluster.gpu).model_copy(update={"moe_load_imbalance": 1.0})
    layout = Layout.derived(cluster.world_size, 32, ep=16)
    scale = 1024 / 1000
    network, nvlink = ((4_096_000, 3_584_000) if dispatcher == "alltoall"
                       else (2_048_000 * 25 / 26, 7_168_000))
    seconds = max(scale * network / (cluster.inter_node_gb_s * 1e9 * k.comm_efficiency),
                  scale * nvlink / (cluster.intra_node_gb_s * 1e9 * k.nvlink_efficiency))
    exchange = k.latency_base_s + k.latency_inter_s + seconds
    ep_comm = evaluate(cfg, LayoutTable.from_layouts([layout]), k).time.parts["ep_comm"][0]
    assert ep_comm == pytest.approx(2 * 2 * 4 * exchange, rel=1e-9)


@st.composite
def _groups(draw: st.DrawFn, experts: int, topk: int) -> tuple[int | None, int | None]:
    divisors = [g for g in (2, 4, 8, 16) if experts % g == 0]
    if not draw(st.booleans()) or not divisors:
        return None, None
    groups = draw(st.sampled_from(divisors))
    return groups, draw(st.integers(1, groups))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), experts=st.sampled_from([8, 16, 64, 128, 256]),
       topk=st.sampled_from([1, 2, 4, 6, 8]), ranks=st.sampled_from([2, 4, 8, 16, 32, 64]),
       local=st.sampled_from([1, 2, 4, 8]), tokens=st.floats(1, 1e5))
def test_deduplication_never_sends_more_over_the_network(data: st.DataObject, experts: int,
                                                         topk: int, ranks: int, local: int,
                                                         tokens: float) -> None:
    """Per node deduplication sends a token at most once to each other node its copies go to,
    never more than the plain all-to-all's one send per copy; when the ep group fits in one
    node neither uses the network."""
    topk = min(topk, experts)
    ranks = min(ranks, experts)
    local = min(local, ranks)
    groups, group_topk = data.draw(_groups(experts, topk))
    model = _moe(experts, topk, groups=groups, group_topk=group_topk)
    args = (model, np.array([tokens]), np.array([float(ranks)]), np.array([float(local)]))
    plain, dedup = dispatch_bytes(*args, False)[0][0], dispatch_bytes(*args, True)[0][0]
    assert dedup <= plain * (1 + 1e-12)
    if ranks == local:
        assert dedup == plain == 0.0


def test_overlap_hides_the_traffic_only_where_megatron_runs_it() -> None:
    """Megatron's EP all-to-all overlap runs under the other micro-batch's compute, leaving
    (1 − overlap_fraction) of it (or what exceeds the compute): DeepSeek-V3 on 128 nodes at
    ep 64, pp 8 with vpp 4 (64 layers, so they split over the 32 chunks), selective recompute
    pays less; full recompute, which megatron-core refuses with the overlap, pays the same."""
    base = load_config("deepseek-v3", "dgx-h100:128")
    base = base.model_copy(update={"model": base.model.model_copy(update={"num_layers": 64})})
    over = base.model_copy(update={"train": base.train.model_copy(
        update={"moe_a2a_overlap": True})})
    rows = [Layout.derived(base.world_size, base.train.global_batch_size, tp=2, pp=8, vpp=4,
                           zero=1, sp=True, ep=64, recompute=r) for r in ("selective", "full")]
    table = LayoutTable.from_layouts(rows)
    plain = evaluate(base, table).time.parts["ep_comm"]
    hidden = evaluate(over, table).time.parts["ep_comm"]
    assert hidden[0] < plain[0]
    assert hidden[1] == plain[1]


def test_deepspeed_refuses_megatron_dispatchers() -> None:
    """DeepSpeed's MoE has one all-to-all: the flex dispatcher and the EP overlap are
    Megatron's, refused with the field named."""
    with pytest.raises(ValidationError, match="moe_token_dispatcher 'flex' is Megatron's"):
        TrainSpec(seq_length=2048, global_batch_size=8, framework="deepspeed",
                  moe_token_dispatcher="flex")
    with pytest.raises(ValidationError, match="moe_a2a_overlap True is Megatron's"):
        TrainSpec(seq_length=2048, global_batch_size=8, framework="deepspeed",
                  moe_a2a_overlap=True)
