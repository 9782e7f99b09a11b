"""FLOPs against Megatron-Core's num_floating_point_operations."""

from __future__ import annotations

import pytest

from autotune.costmodel.flops import hardware_flops
from autotune.costmodel.flops import model_flops
from autotune.specs.inputs import load_model


def test_gpt3_175b_reference_value() -> None:
    """Megatron-LM megatron/training/training.py num_floating_point_operations (NVIDIA/
    Megatron-LM d98e8a64): B=1536, s=2048, V=50257 padded → 3.3406e18 per iteration."""
    model = load_model("gpt3-175b")
    padded = 51200  # 50257 padded to a multiple of 128·tp (tp = 8)
    assert model_flops(model, 2048, 1536, padded) == pytest.approx(3.3406e18, rel=1e-4)


def test_closed_form_for_gpt_shapes() -> None:
    """72·B·s·L·h²·(1 + s/(12h) + V/(12hL)) for plain GPT (causal attention halved)."""
    model = load_model("gpt3-13b")
    b, s, v = 512, 2048, 50304
    h, layers = model.hidden_size, model.num_layers
    expected = 72 * b * s * layers * h * h * (1 + s / (12 * h) + v / (12 * h * layers))
    assert model_flops(model, s, b, v) == pytest.approx(expected, rel=1e-9)


def test_gqa_and_swiglu_terms() -> None:
    """Llama 3 8B: 6·N·T dominates; GQA shrinks K/V projections, SwiGLU adds a third matrix."""
    model = load_model("llama3-8b")
    tokens = 8192
    flops = model_flops(model, 8192, 1, model.vocab_size)
    # 6 FLOPs per parameter per token (embedding lookup excluded) plus causal attention
    dense_params = model.num_params() - model.hidden_size * model.vocab_size
    attention = 6 * model.hidden_size * model.num_layers * 8192 * tokens
    assert flops == pytest.approx(6 * dense_params * tokens + attention, rel=0.01)


def test_recompute_adds_hardware_flops() -> None:
    model = load_model("gpt3-6.7b")
    base = model_flops(model, 2048, 8, 50304)
    assert hardware_flops(model, 2048, 8, 50304, 0) == base
    selective = hardware_flops(model, 2048, 8, 50304, 1)
    full = hardware_flops(model, 2048, 8, 50304, 2)
    assert base < selective < full < base * 4 / 3
