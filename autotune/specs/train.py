"""How it trains: `TrainSpec` (sequence, batch, precision, framework and its options)."""

from __future__ import annotations

import dataclasses
from typing import Annotated
from typing import Any
from typing import Literal
from typing import Optional

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import StrictBool
from pydantic import create_model
from pydantic import model_validator

from autotune.specs.types import DEFAULT_STACKS
from autotune.specs.types import FROZEN
from autotune.specs.types import BatchSize
from autotune.specs.types import Framework
from autotune.specs.types import Precision
from autotune.specs.types import SeqLength
from autotune.specs.types import Stack


@dataclasses.dataclass(frozen=True)
class OnlyFor:
    """Field metadata: the setting exists in one framework only (by its upstream flag); any
    other framework must leave the field at its default, unless it runs one of `stacks`."""

    framework: Framework
    flag: str
    owner: str = "Megatron"
    stacks: tuple[Stack, ...] = ()
    """Software stacks that have the same setting under another framework's rules."""


class TrainSpec(BaseModel):
    """The training setup a layout must serve."""

    model_config = FROZEN

    seq_length: SeqLength
    """Tokens per sequence."""
    global_batch_size: BatchSize
    """Sequences per optimizer step, over all data-parallel replicas."""
    precision: Precision = "bf16"
    """Compute precision of the matrix multiplies (fp8 = fp8 GEMMs with bf16 elsewhere)."""
    framework: Framework = "megatron"
    """Framework whose rules and configs apply."""
    stack: Stack | None = None
    """Software stack that runs the kernels (`autotune.specs.types.Stack`); its calibrated
    constants apply. None: the framework's own (megatron: megatron-core, deepspeed: deepspeed)."""
    flash_attention: StrictBool = True
    """Fused attention that never stores the s×s score matrix (FlashAttention / cuDNN)."""
    attention_backend: Annotated[Literal["auto", "fused", "flash"],
                                 OnlyFor("megatron", "--attention-backend")] = "auto"
    """Transformer Engine's attention kernel (Megatron's `--attention-backend`; before
    Megatron-Core 0.10 the environment's `NVTE_FUSED_ATTN` / `NVTE_FLASH_ATTN`): auto or fused
    runs the stack's fitted `attention_efficiency` (on H100, cuDNN's fused attention, which
    Transformer Engine picks on sm90 where both can run); flash runs FlashAttention-2 (the
    flash-attn package) at `Constants.flash_attention_efficiency`, as where `NVTE_FUSED_ATTN=0`
    is set (NeMo-Framework-Launcher 24.01-24.07's `conf/config.yaml`). Only with
    `flash_attention`."""
    overlap_grad_reduce: StrictBool = True
    """Data-parallel gradient reduction overlaps the last backward pass."""
    overlap_param_gather: Annotated[StrictBool,
                                    OnlyFor("megatron", "--overlap-param-gather")] = True
    """The distributed optimizer's parameter all-gather runs bucket by bucket under the next
    step's forward (Megatron's `--overlap-param-gather`, which NeMo's and Megatron-Bridge's
    performance recipes set); False gathers after the optimizer step, exposed. It takes effect
    only with `overlap_grad_reduce` (Megatron-LM's `validate_args` asserts
    `--overlap-grad-reduce` with it) and a sharded optimizer (zero ≥ 1)."""
    grad_reduce_in_fp32: Annotated[StrictBool, OnlyFor("megatron", "--grad-reduce-in-bf16",
                                                       stacks=("pytorch",))] = True
    """Megatron keeps its gradient buffer, and reduces it over data parallelism, in fp32: the
    default of Megatron-LM's `arguments.py` for bf16; False is `--grad-reduce-in-bf16`, the
    setting of NeMo's and Megatron-Bridge's performance recipes (`scripts/performance`): a
    2-byte buffer and reduction. PyTorch FSDP (stack pytorch) reduces in fp32 by default
    (`MixedPrecision(reduce_dtype=torch.float32)`, Composer's `mixed_precision: DEFAULT`);
    False is FSDP's `reduce_dtype` equal to the 16-bit `param_dtype`, as Composer's
    `mixed_precision: PURE` sets it."""
    adam_moments_dtype: Annotated[Literal["fp32", "bf16"],
                                  OnlyFor("megatron", "--exp-avg-dtype")] = "fp32"
    """Dtype of Adam's two moments: fp32 (Megatron-LM's default: 4 + 4 + 4 B of fp32 master
    and moments per parameter), or bf16 (Megatron's `--use-precision-aware-optimizer
    --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`: 4 + 2 + 2 B; NeMo 1.0's Apex distributed
    Adam with `optim.dtype: bf16` keeps its master copy in bf16 as well, which this counts
    as fp32)."""
    fp8_recipe: Annotated[Literal["delayed", "tensorwise", "blockwise", "mxfp8"],
                          OnlyFor("megatron", "--fp8-recipe")] = "delayed"
    """How fp8 training scales its tensors (Megatron's `--fp8-recipe`, default delayed):
    delayed, one scale per tensor from the amax history; tensorwise, per-tensor current scaling
    (an amax pass before each cast); blockwise, 1×128 and 128×128 blocks (Hopper and later);
    mxfp8, 32-element blocks with E8M0 scales, which only Blackwell tensor cores run. Each
    recipe's cast kernels are charged (`autotune.costmodel.kernels.FP8_CAST_BYTES`); the GEMM
    rate is the fitted fp8 one for all of them. Only with precision fp8."""
    tp_comm_overlap: bool = False
    """Tensor-parallel collectives run in chunks under the GEMMs (Transformer Engine userbuffers:
    Megatron's `--tp-comm-overlap`, with sequence parallelism only). Off by default, as in
    Megatron-LM: NeMo's and Megatron-Bridge's H100 recipes turn it on for their tp ≥ 2 layouts,
    but it needs Transformer Engine built with userbuffers and GPUs (CPU trials cannot run it);
    turn it on where your stack runs it (docs/cost-model.md)."""
    moe_token_dispatcher: Annotated[
        Literal["alltoall", "flex"], OnlyFor("megatron", "--moe-token-dispatcher-type")
    ] = "alltoall"
    """How MoE layers with ep > 1 move tokens to their experts (Megatron's
    `--moe-token-dispatcher-type`): alltoall, NCCL all-to-all of every top-k copy (Megatron's
    guide's choice for ep > 1); flex, DeepEP (`--moe-flex-dispatcher-backend deepep`), one copy
    per destination node over the network, forwarded over NVLink, which needs DeepEP installed
    on GPUs. ep = 1 always gathers (allgather)."""
    moe_a2a_overlap: Annotated[StrictBool,
                               OnlyFor("megatron", "--overlap-moe-expert-parallel-comm")] = False
    """Megatron's EP all-to-all overlap (`--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute`, off by default): a micro-batch's dispatch and combine run under
    another's forward and backward, on the layouts that allow it
    (`autotune.costmodel.expert_dispatch.a2a_overlap_runs`)."""
    moe_force_balance: Annotated[StrictBool,
                                 OnlyFor("megatron", "--moe-router-force-load-balancing")] = False
    """Benchmark routing (Megatron's `--moe-router-force-load-balancing`): tokens go to experts
    evenly, so every expert-parallel rank carries the mean load and `moe_load_imbalance` is not
    charged. For throughput benchmarks only (NVIDIA's MoE performance tables run it): the
    model does not learn its routing."""
    zero3_list_collectives: Annotated[
        StrictBool, OnlyFor("deepspeed", "DeepSpeed v0.3-v0.5.5's ZeRO-3", owner="DeepSpeed")
    ] = False
    """ZeRO-3 as DeepSpeed v0.3.x to v0.5.5 ran it: every parameter all-gather and gradient
    reduce-scatter went through `torch.distributed`'s list collectives, one tensor per rank
    (`partition_parameters.py` `_allgather_param`, `_reduce_scatter_gradient`), and PyTorch's
    `ProcessGroupNCCL` copies each rank's slice out of (all-gather) or into (reduce-scatter)
    its flat buffer, one copy per rank; v0.5.6 gathers into one tensor (`_all_gather_base`).
    Each rank of each such collective is charged one eager op (`Constants.eager_op_s`). Off:
    today's DeepSpeed. For predicting runs of those releases (SC21's ZeRO-3 rows); the
    rendered config cannot make a newer DeepSpeed do it."""

    @model_validator(mode="after")
    def _check_framework_options(self) -> TrainSpec:
        """A field marked `OnlyFor` another framework keeps its default."""
        for name, field in type(self).model_fields.items():
            only = next((m for m in field.metadata if isinstance(m, OnlyFor)), None)
            value = getattr(self, name)
            if (only and only.framework != self.framework and value != field.default
                    and self.software_stack not in only.stacks):
                raise ValueError(f"{name} {value!r} is {only.owner}'s ({only.flag}); use "
                                 f"{field.default!r} with {self.framework}")
        if self.fp8_recipe != "delayed" and self.precision != "fp8":
            raise ValueError(f"fp8_recipe {self.fp8_recipe!r} needs precision fp8 (it is "
                             f"{self.precision!r}); drop --fp8-recipe or set --precision fp8")
        if self.attention_backend != "auto" and not self.flash_attention:
            raise ValueError(f"attention_backend {self.attention_backend!r} needs "
                             "flash_attention (it is off); drop --attention-backend or set "
                             "--flash-attention")
        return self

    @property
    def param_gather_overlapped(self) -> bool:
        """Whether the sharded optimizer's parameter gather runs under the next forward:
        `overlap_param_gather`, which Megatron allows only with `overlap_grad_reduce`."""
        return self.overlap_param_gather and self.overlap_grad_reduce

    @property
    def software_stack(self) -> Stack:
        """The stack that runs this setup: `stack`, else the framework's default."""
        return self.stack or DEFAULT_STACKS[self.framework]

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.seq_length * self.global_batch_size


def _optional(name: str) -> tuple[Any, Any]:
    """The field's type with its bounds (pydantic keeps them in `metadata`), or None."""
    field = TrainSpec.model_fields[name]
    bounded: Any = Annotated[(field.annotation, *field.metadata)] if field.metadata else (
        field.annotation)
    return Optional[bounded], Field(default=None, description=field.description)  # noqa: UP045


TrainOverrides: type[BaseModel] = create_model(
    "TrainOverrides",
    __config__=ConfigDict(extra="forbid", frozen=True),
    __doc__="Training settings a run changes from the model's preset: every `TrainSpec` field, "
    "optional (None keeps the preset's or the default).",
    **{name: _optional(name) for name in TrainSpec.model_fields},  # type: ignore[call-overload]
)
"""`TrainSpec`'s fields, each optional: what a run (a `Problem`, a CLI flag) may override. It is
generated, so a new training setting is one field in `TrainSpec` and nothing else."""
