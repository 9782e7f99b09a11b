"""megatron-core itself, on CPU, as the judge of a (MoE) parallel layout.

`megatron_core_refusal` runs the checks megatron-core makes while it sets up training, in the
order Megatron-LM runs them, on torch's fake process group (`backend="fake"`: any world size in
one process, collectives do nothing):

1. `parallel_state.initialize_model_parallel` with tp, pp, cp, ep and etp: the dense grid
   world % (tp·pp·cp) and the expert grid world % (etp·ep·pp) (parallel_state.py);
2. `TransformerConfig` with the degrees, sequence parallelism, experts and biases
   (model_parallel_config.py: sp needs tp; transformer_config.py: ep needs experts, biased
   experts need etp = 1);
3. a `MoELayer` built from the local (no Transformer Engine) spec: experts % ep
   (moe/moe_layer.py); its `allgather` dispatcher, since the alltoall dispatcher allocates CUDA
   streams at construction;
4. one training forward of that layer: MoE with tensor parallelism needs sequence parallelism
   (moe/moe_layer.py). The layer then reaches its first CUDA kernel, which is as far as a CPU
   goes: that error means megatron-core accepted the layout.

The model is toy-sized (hidden 16) with the real expert count; shapes never matter here.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

CUDA_ONLY = ("CUDA", "cuda")
"""Markers of the errors that mean the layer got past every check to a GPU kernel."""


def megatron_core_refusal(
    world: int,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    sp: bool = False,
    experts: int | None = None,
    bias: bool = False,
) -> str | None:
    """Why megatron-core refuses the layout (its exception, one line), or None."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state
        from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
        from megatron.core.transformer.moe.moe_layer import MoELayer
        from megatron.core.transformer.transformer_config import TransformerConfig

    assert not dist.is_initialized(), "the oracle needs its own (fake) process group"
    dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=world)
    stage = "initialize_model_parallel"
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            context_parallel_size=cp, expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp, create_gloo_process_groups=False)
        stage = "TransformerConfig"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = TransformerConfig(
                num_layers=pp, hidden_size=16, num_attention_heads=8, ffn_hidden_size=32,
                num_moe_experts=experts, moe_router_topk=min(2, experts or 2),
                moe_token_dispatcher_type="allgather", add_bias_linear=bias,
                gated_linear_unit=True, tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp, context_parallel_size=cp,
                expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                sequence_parallel=sp, use_cpu_initialization=True,
                pipeline_dtype=torch.float32 if pp > 1 else None)
        if experts is None:
            return None
        stage = "MoELayer"
        spec = get_moe_module_spec(use_te=False, num_experts=experts, moe_grouped_gemm=False)
        with warnings.catch_warnings():  # sp with expert tp 1 ("Disabling sequence parallel")
            warnings.simplefilter("ignore")
            layer = MoELayer(config, spec.submodules)
        layer.train()
        stage = "MoELayer.forward"
        try:
            layer(torch.zeros(4, 2, 16))
        except (AssertionError, RuntimeError) as error:
            if not any(marker in str(error) for marker in CUDA_ONLY):
                raise
        return None
    except (AssertionError, RuntimeError, ValueError) as error:
        return f"{stage}: {type(error).__name__}: {error}".splitlines()[0]
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
