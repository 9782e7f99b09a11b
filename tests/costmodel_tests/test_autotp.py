"""DeepSpeed AutoTP's tensor-parallel terms against the preset the rendered ds_config names.

Oracle: DeepSpeed's own `AutoTPPresets.llama()` (`deepspeed/module_inject/autotp_config.py`,
the preset `autotune.workloads.deepspeed_gpt` asks for), matched against the parameter names
of the workload's model: the column-parallel projections of a layer are the `LinearLayer`s
whose `ColumnParallel.backward` all-reduces the input gradient, and a parameter no spec
matches (the output layer) is left whole on every tensor-parallel rank. The step-time figures
are then worked out by hand from `collective_s` and `head_times` at tp 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from autotune.costmodel.collectives import collective_s
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import estimate
from autotune.costmodel.kernels import head_times
from autotune.frameworks import framework_of
from autotune.frameworks.deepspeed import config
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs.inputs import load_config
from autotune.workloads.deepspeed_gpt import GPT
from autotune.workloads.deepspeed_gpt import MoEPlan


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_autotp_preset_sets_the_backward_all_reduces_and_the_whole_output_layer(
        activation: str) -> None:
    """Column-parallel specs of one layer = `tp_backward_all_reduces`; lm_head unmatched."""
    autotp = pytest.importorskip("deepspeed.module_inject.autotp_config")
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
        update={"activation": activation})})
    framework = framework_of(cfg)
    preset = autotp.AutoTPPresets.llama()
    model = GPT(cfg.model, "none", None, 0, MoEPlan())
    specs = {name: preset.find_matching_spec(name) for name, _ in model.named_parameters()}
    column = [name for name, spec in specs.items() if name.startswith("model.layers.0.")
              and spec is not None and spec.partition_type == autotp.PartitionType.COLUMN]
    assert len(column) == framework.tp_backward_all_reduces(cfg)
    assert specs["lm_head.weight"] is None
    assert not framework.tp_splits_output_layer


def test_deepspeed_tp_step_charges_each_all_reduce_and_the_whole_head() -> None:
    """tp 2, dp 1 on two CPU workers: tp_comm = micro-batches · layers · (2 forward + 5
    backward) all-reduces of the micro-batch's hidden states, none hidden; the output layer
    costs what it costs at tp 1 (the same tokens and the whole vocabulary)."""
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    framework = framework_of(cfg)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    layouts = [Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework)
               for text in ("tp=2,pp=1,cp=1,zero=0,mbs=2", "tp=1,pp=1,cp=1,zero=0,mbs=2")]
    table = LayoutTable.from_layouts(layouts)
    m = cfg.model
    volume = 4 * 2 * cfg.train.seq_length * m.hidden_size  # fp32, mbs 2
    one = collective_s("all_reduce", np.array([volume]), np.array([2]),
                       np.array([cfg.cluster.gpus_per_node]), cfg, k)[0]
    micro = cfg.train.global_batch_size // 2
    predicted = estimate(cfg, layouts[0])
    assert predicted.time_parts["tp_comm"] == pytest.approx(micro * m.num_layers * 7 * one)
    vocab = framework.padded_vocab(m.vocab_size, table.tp)
    head_s, _ = head_times(cfg, table, vocab, k)
    assert head_s[0] == pytest.approx(head_s[1])


def test_cpu_workers_hide_no_communication_under_compute() -> None:
    """Oracle: DeepSpeed's CPU accelerator (`deepspeed/accelerator/cpu_accelerator.py`) has no
    streams (`Stream` None, `stream()` a no-op context) and is a synchronized device, and
    gloo's collectives block the caller. So ZeRO-3 on two CPU workers pays, per micro-batch,
    in full, the gathers of each weight tensor in the forward and again in the backward, its
    share of the reduce bucket's reduce-scatter (the bucket DeepSpeed's own
    `DeepSpeedZeroConfig` reads from the rendered ds_config) and the embedding's and output
    layer's gather and reduce-scatter (worked out from `collective_s`)."""
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    cpu = CPU_Accelerator()
    assert cpu.Stream is None and cpu.is_synchronized_device()
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    framework = framework_of(cfg)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    layout = Layout.parse("tp=1,pp=1,cp=1,zero=3,mbs=2,recompute=none", cfg.world_size,
                          cfg.train.global_batch_size, framework)
    zero = DeepSpeedZeroConfig(**config(cfg, layout)["zero_optimization"])
    table = LayoutTable.from_layouts([layout])
    m = cfg.model
    vocab = framework.padded_vocab(m.vocab_size, table.tp)
    params = m.num_layers * m.layer_params() + 2 * m.hidden_size * vocab[0] + m.hidden_size
    h, d = m.hidden_size, m.head_dim
    q, kv, mlp = h * m.num_attention_heads * d, h * m.query_groups * d, h * m.ffn
    weights = [q, kv, kv, q] + [mlp] * (3 if m.gated else 2)  # one gather per weight tensor
    layer_numel = sum(weights)
    rest = params - m.num_layers * layer_numel  # embedding, output layer, norms: one each
    ranks, per_node = np.array([2]), np.array([cfg.cluster.gpus_per_node])

    def full(op: str, numel: float) -> float:
        return float(collective_s(op, 4 * np.array([numel]), ranks, per_node, cfg, k)[0])

    bucket = min(zero.reduce_bucket_size, m.num_layers * layer_numel)
    per_layer = (2 * sum(full("all_gather", n) for n in weights)  # forward and backward
                 + layer_numel / bucket * full("reduce_scatter", bucket))
    micro = cfg.train.global_batch_size // (2 * 2)
    expected = micro * (full("all_gather", rest) + full("reduce_scatter", rest)
                        + m.num_layers * per_layer)
    assert estimate(cfg, layout).time_parts["zero3_gather"] == pytest.approx(expected, rel=1e-6)
