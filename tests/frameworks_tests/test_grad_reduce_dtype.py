"""Bytes per gradient element of the data-parallel reduction, per stack; oracle: the dtype each
stack reduces in (Composer's `get_mixed_precision` for `mixed_precision: DEFAULT` from v0.16,
and torchtitan's `mixed_precision_reduce` default: torch.float32; `mixed_precision: PURE`: the
precision's dtype; DeepSpeed's `communication_data_type`: the gradients' own dtype), sized by
torch."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from autotune.costmodel.terms import terms_for
from autotune.specs import AutotuneConfig
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_model

FP32 = torch.tensor([], dtype=torch.float32).element_size()
BF16 = torch.tensor([], dtype=torch.bfloat16).element_size()


def config(**train: object) -> AutotuneConfig:
    """Llama 3 8B on one DGX H100 under the DeepSpeed framework's rules (ZeRO / FSDP)."""
    spec = TrainSpec(seq_length=4096, global_batch_size=64, framework="deepspeed",
                     **train)  # type: ignore[arg-type]
    return AutotuneConfig(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:1"),
                          train=spec)


def test_pytorch_fsdp_reduces_bf16_gradients_in_fp32() -> None:
    """PyTorch FSDP (LLM Foundry, torchtitan) with bf16 compute reduces in float32."""
    cfg = config(stack="pytorch", precision="bf16")
    assert terms_for(cfg).grad_reduce_bytes(cfg) == FP32


def test_deepspeed_reduces_in_the_gradients_dtype() -> None:
    """DeepSpeed's own stack reduces bf16 gradients in bf16."""
    cfg = config(precision="bf16")
    assert terms_for(cfg).grad_reduce_bytes(cfg) == BF16


def test_fp32_training_reduces_in_fp32_on_both() -> None:
    """fp32 training has fp32 gradients on either stack."""
    for stack in ("pytorch", "deepspeed"):
        cfg = config(stack=stack, precision="fp32")
        assert terms_for(cfg).grad_reduce_bytes(cfg) == FP32


def test_pytorch_fsdp_pure_mixed_precision_reduces_in_bf16() -> None:
    """Composer's `mixed_precision: PURE` sets FSDP's `reduce_dtype` to the precision's own
    dtype (`get_mixed_precision` @ v0.14.1 and v0.16.4): `grad_reduce_in_fp32` off reduces
    bf16 gradients in bf16 on the PyTorch stack."""
    cfg = config(stack="pytorch", precision="bf16", grad_reduce_in_fp32=False)
    assert terms_for(cfg).grad_reduce_bytes(cfg) == BF16


def test_only_the_pytorch_stack_sets_the_reduce_dtype_under_deepspeed_rules() -> None:
    """DeepSpeed's own stack has no such switch (it reduces in the gradients' dtype): the
    Megatron flag stays rejected there."""
    with pytest.raises(ValidationError, match="grad_reduce_in_fp32"):
        config(precision="bf16", grad_reduce_in_fp32=False)
