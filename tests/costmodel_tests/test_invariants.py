"""Physics invariants of the memory and step-time models, as hypothesis properties.

Each example draws a dense model, a cluster, a framework and a batch of layouts, keeps those that
break no structural rule, and checks a whole LayoutTable at once. The oracles are conservation
and ordering laws of the physics itself (work is moved, not removed; shards never grow; the 1F1B
bubble is (p−1)/(v·m) of the pipeline's work), not values of the model.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.memory import MEMORY_PARTS
from autotune.costmodel.sharding import largest_module_params
from autotune.costmodel.sharding import layer_params_on_rank
from autotune.costmodel.step_time import TIME_PARTS
from autotune.frameworks import framework_of
from autotune.frameworks.megatron.args import pipeline_plan
from autotune.layout import OFFLOADS
from autotune.layout import RECOMPUTES
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.space.rules import first_broken
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster

EXAMPLES = 500
"""Examples per property (four properties: 2,000 in all)."""


@st.composite
def problems(draw: st.DrawFn, nodes: tuple[int, ...] = (1, 2, 4, 8, 16)) -> AutotuneConfig:
    """A dense model on a GPU cluster with a framework and a training setup."""
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    head_dim = draw(st.sampled_from([64, 128]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, heads) if heads % g == 0]))
    hidden = heads * head_dim
    model = ModelSpec(
        num_layers=draw(st.integers(2, 96)),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        ffn_hidden_size=256 * draw(st.integers(1, 4 * hidden // 256 + 8)),
        vocab_size=draw(st.integers(32000, 160000)),
        activation=draw(st.sampled_from(["gelu", "swiglu"])),
        tied_embeddings=draw(st.booleans()),
        max_position_embeddings=32768,
        position_embedding="rope",
        hidden_dropout=draw(st.sampled_from([0.0, 0.1])),
    )
    gpu = draw(st.sampled_from(["dgx-a100", "dgx-h100", "hgx-h200"]))
    cluster = load_cluster(f"{gpu}:{draw(st.sampled_from(nodes))}")
    train = TrainSpec(
        seq_length=draw(st.sampled_from([1024, 2048, 4096, 8192, 16384])),
        global_batch_size=cluster.world_size * draw(st.sampled_from([1, 2, 4, 8, 16])),
        precision=draw(st.sampled_from(["bf16", "fp8"] if gpu != "dgx-a100" else ["bf16"])),
        framework=draw(st.sampled_from(["megatron", "deepspeed"])),
        flash_attention=draw(st.booleans()),
    )
    return AutotuneConfig(model=model, cluster=cluster, train=train)


def layouts(cfg: AutotuneConfig, draw: st.DrawFn, size: int = 64) -> list[Layout]:
    """Random layouts of the problem (dp and gas derived; some break rules), drawn from one
    seeded generator so an example stays cheap to make."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    choices = {"tp": [1, 2, 4, 8], "pp": [1, 1, 2, 3, 4, 8], "cp": [1, 1, 2, 4],
               "vpp": [1, 1, 2, 3, 4], "zero": [0, 1, 2, 3], "offload": list(OFFLOADS),
               "mbs": [1, 2, 4], "recompute": list(RECOMPUTES), "sp": [True, False]}
    drawn = [{dim: values[rng.integers(len(values))] for dim, values in choices.items()}
             for _ in range(size)]
    return [Layout.derived(cfg.world_size, cfg.train.global_batch_size,
                           **{d: (v.item() if hasattr(v, "item") else v) for d, v in row.items()})
            for row in drawn]


def legal(cfg: AutotuneConfig, candidates: list[Layout]) -> LayoutTable:
    """The layouts that break no structural rule (memory aside)."""
    table = LayoutTable.from_layouts(candidates)
    k = constants_for(cfg.cluster.gpu)
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = first_broken(cfg, table, k, memory=False) < 0
    return table.take(ok)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_parts_are_finite_and_work_is_moved_not_removed(data: st.DataObject) -> None:
    """Every memory and time part is ≥ 0 and finite; the FLOPs all GPUs execute in a step depend
    only on recompute (and the vocabulary padding Megatron ties to tp): tp, pp, cp and dp
    move work between GPUs, they never remove it. MFU stays under the best kernel efficiency
    (no step can run its FLOPs faster than its fastest kernels)."""
    cfg = data.draw(problems())
    table = legal(cfg, layouts(cfg, data.draw))
    assume(len(table))
    k = constants_for(cfg.cluster.gpu)
    values = evaluate(cfg, table, k)
    memory = [values.memory.parts[name] for name in MEMORY_PARTS]
    for part in (*memory, *(values.time.parts[name] for name in TIME_PARTS), values.time.total):
        assert np.all(np.isfinite(part)) and np.all(part >= 0)
    vocab = framework_of(cfg).padded_vocab(cfg.model.vocab_size, table.tp)
    flops = values.time.flops
    for key in {(int(r), int(v)) for r, v in zip(table.recompute, vocab, strict=True)}:
        same = (table.recompute == key[0]) & (vocab == key[1])
        assert np.allclose(flops[same], flops[same][0], rtol=1e-9)
    gpu = cfg.cluster.gpu
    sixteen = gpu.peak_tflops["bf16"] / gpu.peak_tflops[cfg.train.precision]
    best = max(k.gemm_efficiency, k.fp8_gemm_efficiency, k.attention_efficiency * sixteen)
    assert np.all(values.mfu <= best)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_pipeline_bubble_is_p_minus_one_over_v_m_of_the_work(data: st.DataObject) -> None:
    """The 1F1B bubble (interleaved: divided by v) idles each stage for (p−1)/v micro-batch
    times, so it is (p−1)/(v·m) of the micro-batches' compute and exposed tp/cp time. A custom
    Megatron pipeline layout (chunks of q and q+1 layers on one stage) idles for p−1 times its
    heaviest chunk: between that and (p−1)/m of the work (a chunk never outweighs its stage)."""
    cfg = data.draw(problems())
    table = legal(cfg, layouts(cfg, data.draw))
    assume(len(table))
    time = evaluate(cfg, table, constants_for(cfg.cluster.gpu)).time.parts
    work = time["compute"] + time["tp_comm"] + time["cp_comm"]
    expected = (table.pp - 1) / (table.vpp * table.micro_batches) * work
    custom = np.array([cfg.train.framework == "megatron" and bool(
        (plan := pipeline_plan(cfg.model.num_layers, int(p), int(v))) and plan.chunks)
        for p, v in zip(table.pp, table.vpp, strict=True)], dtype=bool)
    bubble = time["pp_bubble"]
    assert np.allclose(bubble[~custom], expected[~custom], rtol=1e-9, atol=0.0)
    assert np.all(bubble[custom] >= expected[custom] * (1 - 1e-9))
    most = (table.pp - 1) / table.micro_batches * work
    assert np.all(bubble[custom] <= most[custom] * (1 + 1e-9))


def _grown(cfg: AutotuneConfig, factor: int) -> AutotuneConfig:
    """The same problem on `factor` times the nodes and the global batch (weak scaling)."""
    cluster = cfg.cluster.model_copy(update={"nodes": cfg.cluster.nodes * factor})
    train = cfg.train.model_copy(
        update={"global_batch_size": cfg.train.global_batch_size * factor})
    return cfg.model_copy(update={"cluster": cluster, "train": train})


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_twice_the_gpus_never_more_than_twice_the_tokens(data: st.DataObject) -> None:
    """The same layout (tp, pp, cp, mbs, micro-batches) on twice the GPUs with twice dp does the
    same work per GPU and can only communicate more: at most twice the tokens per second.
    ZeRO and offload shard the optimizer step over dp, which is genuinely superlinear, so
    that part is compared on its own: it never grows. So is Megatron's gradient reduce where
    its bucket (max(40M, 1M·dp·cp) parameters) grows with dp: fewer, larger buckets pay fewer
    latencies, a real gain the rule is only held to where the bucket stays the same."""
    cfg = data.draw(problems(nodes=(1, 2, 4, 8)))
    table = legal(cfg, layouts(cfg, data.draw))
    assume(len(table))
    big = _grown(cfg, 2)
    wide = dataclasses.replace(table, dp=table.dp * 2)
    k = constants_for(cfg.cluster.gpu)
    small, large = evaluate(cfg, table, k).time, evaluate(big, wide, k).time
    small_time, big_time = small.parts, large.parts
    framework = framework_of(cfg)
    same_bucket = np.ones(len(table), dtype=bool)
    if framework.name == "megatron":
        same_bucket = (framework.grad_bucket_params(cfg, table, np.ones(len(table)))
                       == framework.grad_bucket_params(big, wide, np.ones(len(table))))
    step = [t.total - t.parts["optimizer"] - t.parts["offload"] - t.parts["dp_comm"]
            for t in (small, large)]
    # the parts are the slowest stage's, and which stage is slowest can change with dp (the
    # gradient reduce of a last stage holding the output layer and few layers grows past a
    # fuller stage's): its micro-batch time (no dp term in it, but FP8's amax all-reduces)
    # then changes, and only the whole step is bound
    same_stage = np.isclose(large.microbatch_s, small.microbatch_s, rtol=1e-12, atol=0.0)
    assert np.all((step[1] >= step[0] * (1 - 1e-9)) | ~same_stage)
    # the exposed gradient reduce may shrink where the slowest stage changes (an FP8 stage's
    # amax all-reduces grow with dp), but never by more than the rest of the step grew
    grown = step[1] + big_time["dp_comm"] >= (step[0] + small_time["dp_comm"]) * (1 - 1e-9)
    assert np.all(grown | ~same_bucket)
    for name in ("optimizer", "offload"):
        assert np.all((big_time[name] <= small_time[name] * (1 + 1e-9)) | ~same_stage)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), dim=st.sampled_from(["mbs", "tp", "pp", "cp", "zero"]))
def test_memory_grows_with_mbs_and_shrinks_with_every_shard(data: st.DataObject,
                                                            dim: str) -> None:
    """Peak memory never falls when mbs doubles (same micro-batches), and never grows when a
    layout adds GPUs to tp, pp or cp (twice the GPUs, same dp and micro-batches) or raises its
    ZeRO stage. Where a framework genuinely trades memory, Megatron's theoretical_memory_usage
    is the allowance: pp only with even stages and no interleaving (the first stage holds
    L·(1 + (p−1)/(p·v)) layers' activations, growing with p when v > 1), and up to its
    embedding term, 8sb + sbh bytes per in-flight micro-batch, which grows with the stages;
    ZeRO with at least two shards and what ZeRO-3 holds whole at once (the framework's
    `zero3_live`: gathered weights and unsharded gradients) smaller than the 16-bit weights it
    shards away."""
    cfg = data.draw(problems(nodes=(1, 2, 4, 8)))
    table = legal(cfg, layouts(cfg, data.draw))
    assume(len(table))
    k = constants_for(cfg.cluster.gpu)
    grown, bigger = cfg, table
    if dim == "mbs":
        grown = cfg.model_copy(update={"train": cfg.train.model_copy(
            update={"global_batch_size": cfg.train.global_batch_size * 2})})
        bigger = dataclasses.replace(table, mbs=table.mbs * 2)
    elif dim in ("tp", "pp", "cp"):
        grown = _grown(cfg, 2)
        grown = grown.model_copy(update={"train": cfg.train})
        bigger = dataclasses.replace(table, **{dim: getattr(table, dim) * 2})
    else:
        bigger = dataclasses.replace(table, zero=np.minimum(table.zero + 1, 3))
    keep = legal(grown, bigger.rows()).rows()
    pairs = [(small, big) for small, big in zip(table.rows(), bigger.rows(), strict=True)
             if big in keep and _comparable(cfg, small, big, dim)]
    assume(pairs)
    small_t = LayoutTable.from_layouts([p[0] for p in pairs])
    big_t = LayoutTable.from_layouts([p[1] for p in pairs])
    before = evaluate(cfg, small_t, k).memory.total
    after = evaluate(grown, big_t, k).memory.total
    if dim == "mbs":
        assert np.all(after >= before * (1 - 1e-9))
        return
    allowance = 0.0
    if dim == "pp":  # one more embedding output in flight per added stage (Megatron's term)
        s, h = cfg.train.seq_length / small_t.cp, cfg.model.hidden_size
        added = np.minimum(small_t.micro_batches, big_t.pp) - np.minimum(
            small_t.micro_batches, small_t.pp)
        allowance = added * small_t.mbs * (8 * s + s * h) / small_t.tp
    assert np.all(after <= before * (1 + 1e-9) + allowance)


def _comparable(cfg: AutotuneConfig, small: Layout, big: Layout, dim: str) -> bool:
    """The preconditions under which the memory ordering is a law (see the test)."""
    if dim == "pp":
        layers = cfg.model.num_layers
        return small.vpp == 1 and layers % big.pp == 0
    if dim == "zero":
        shards = small.shard_degree
        if shards < 2 or small.offload != "none" or big.zero == small.zero:
            return False
        if big.zero < 3:
            return True
        m = cfg.model
        t = LayoutTable.from_layouts([small])
        framework = framework_of(cfg)
        vocab = framework.padded_vocab(m.vocab_size, t.tp)
        live = framework.zero3_live(cfg, t, layer_params_on_rank(m, t),
                                    largest_module_params(m, t, vocab),
                                    m.hidden_size * vocab / t.tp)
        held = 2 * float(live.weights[0]) + float(live.gradient_bytes[0])
        stage = m.layer_params() * m.num_layers / small.pp / small.tp
        return held <= 2 * stage * (1 - 1 / shards)
    return True
