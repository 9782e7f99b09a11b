"""MoE kernel terms: sliding-window attention, grouped expert GEMMs, forced balancing.

Oracles: the attention mask enumerated key by key (megatron-core `is_layer_window_attention`:
a layer with 1-based number l slides its window where l % window_attn_skip_freq != 0); the
Gemm arithmetic of a layer worked by hand (a grouped GEMM at efficiency e takes 1/e of the time
one GEMM of its shape takes, the others are untouched); Megatron-LM's
`--moe-router-force-load-balancing` flag (megatron/training/arguments.py) and megatron-core's
`TransformerConfig` built with the rendered keyword arguments.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from autotune.costmodel.constants import constants_for
from autotune.costmodel.kernels import gemm_seconds
from autotune.costmodel.kernels import layer_gemms
from autotune.costmodel.kernels import layer_times
from autotune.costmodel.kernels import window_share
from autotune.costmodel.step_time import estimate_time
from autotune.frameworks.megatron.args import megatron_args
from autotune.frameworks.megatron.args import transformer_config_kwargs
from autotune.frameworks.megatron.model import transformer_config_class
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import ModelSpec
from autotune.specs.inputs import load_config


def _mask_share(layers: int, seq: int, window: int, freq: int | None) -> float:
    """Attended (query, key) pairs over all layers relative to causal ones, from the masks."""
    query, key = np.meshgrid(np.arange(seq), np.arange(seq), indexing="ij")
    causal = key <= query
    slid = causal & (query - key <= window)
    pairs = [slid.sum() if freq is None or layer % freq != 0 else causal.sum()
             for layer in range(1, layers + 1)]
    return float(sum(pairs) / (layers * causal.sum()))


@pytest.mark.parametrize(("layers", "seq", "window", "freq"),
                         [(4, 64, 7, 2), (6, 96, 15, 3), (3, 32, 4, None), (2, 16, 40, 2)])
def test_window_share_counts_the_masks_keys(layers: int, seq: int, window: int,
                                            freq: int | None) -> None:
    """Oracle: the masks enumerated (window W: keys j with i − W <= j <= i)."""
    model = ModelSpec(num_layers=layers, hidden_size=64, num_attention_heads=4, vocab_size=256,
                      max_position_embeddings=seq, position_embedding="rope",
                      window_size=window, window_attn_skip_freq=freq)
    assert window_share(model, seq) == pytest.approx(_mask_share(layers, seq, window, freq))


def _moe_setup(**train: object) -> tuple:
    cfg = load_config("mixtral-8x7b", "dgx-h100:8", framework="megatron", seq_length=4096,
                      global_batch_size=256, **train)
    table = LayoutTable.from_layouts([Layout.derived(64, 256, tp=1, pp=1, ep=8, mbs=1)])
    return cfg, table, constants_for(cfg.cluster.gpu, cfg.train.software_stack)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_grouped_efficiency_slows_only_the_routed_experts(precision: str) -> None:
    """Oracle: by hand, halving the grouped efficiency of the training precision adds exactly
    the routed GEMMs' time once more to the layer's linear forward; the other precision's
    constant changes nothing."""
    cfg, table, k = _moe_setup(precision=precision)
    name = "fp8_grouped_gemm_efficiency" if precision == "fp8" else "grouped_gemm_efficiency"
    other = "grouped_gemm_efficiency" if precision == "fp8" else "fp8_grouped_gemm_efficiency"
    one = k.model_copy(update={name: 1.0, other: 1.0})
    routed = sum(float(gemm_seconds(cfg, g, one)[0][0]) for g in layer_gemms(cfg, table, one, True)
                 if g.routed)
    base = layer_times(cfg, table, one, moe=True).linear_forward[0]
    half = layer_times(cfg, table, one.model_copy(update={name: 0.5}), moe=True)
    untouched = layer_times(cfg, table, one.model_copy(update={other: 0.5}), moe=True)
    assert routed > 0
    assert half.linear_forward[0] - base == pytest.approx(routed)
    assert untouched.linear_forward[0] == pytest.approx(base)


def test_forced_balancing_charges_the_mean_load_and_renders_megatrons_flag() -> None:
    """Oracle: forced balancing gives every rank the mean load, so the step equals the one with
    `moe_load_imbalance` 1, and the rendered arguments carry Megatron's flag
    `--moe-router-force-load-balancing`, which megatron-core's TransformerConfig accepts."""
    cfg, table, k = _moe_setup(moe_force_balance=True)
    plain, _, _ = _moe_setup()
    skewed = k.model_copy(update={"moe_load_imbalance": 1.5})
    balanced = estimate_time(cfg, table, skewed).total[0]
    assert balanced == pytest.approx(
        estimate_time(plain, table, k.model_copy(update={"moe_load_imbalance": 1.0})).total[0])
    assert estimate_time(plain, table, skewed).total[0] > balanced
    layout = Layout.derived(64, 256, tp=1, pp=1, ep=8, mbs=1)
    assert "--moe-router-force-load-balancing" in megatron_args(cfg, layout)
    assert "--moe-router-force-load-balancing" not in megatron_args(plain, layout)
    with warnings.catch_warnings():  # megatron-core warns that Transformer Engine is absent
        warnings.simplefilter("ignore")
        config = transformer_config_class(cfg.model)(**transformer_config_kwargs(cfg, layout))
    assert config.moe_router_force_load_balancing is True


def test_cpu_workers_load_shrinks_with_the_sequences_of_a_micro_batch() -> None:
    """Worked by hand: on CPU workers `moe_load_imbalance` I is one sequence's load and a
    micro-batch of b sequences charges 1 + (I − 1)/sqrt(b) (I = 1.9: 1.9, 1.45, 1.225 at b 1,
    4, 16) on the routed GEMMs' rows; on GPUs every b charges I."""
    cpu = load_config("tiny-moe", "local", framework="deepspeed", processes=2)
    gpu, _table, _k = _moe_setup()
    for cfg, expected in ((cpu, [1.9, 1.45, 1.225]), (gpu, [1.9, 1.9, 1.9])):
        k = constants_for(cfg.cluster.gpu).model_copy(update={"moe_load_imbalance": 1.9})
        table = LayoutTable.from_layouts([
            Layout.derived(cfg.world_size, 64, tp=1, pp=1, mbs=b) for b in (1, 4, 16)])
        routed = [g for g in layer_gemms(cfg, table, k, moe=True) if g.routed]
        assert routed and all(np.allclose(g.slow, expected) for g in routed)
