"""DeepSpeed trial program: train a Llama-style GPT for a few steps and report step times.

Run under ``torchrun --nproc_per_node N`` or the ``deepspeed`` launcher::

    python -m autotune.workloads.deepspeed_gpt --model tiny-gpt \\
        --ds-config DIR/ds_config.json --layout DIR/layout.json --seq 256 --steps 6 --warmup 2

Everything about the run comes from the rendered ``ds_config.json`` (batch sizes, ZeRO stage
and offload, precision, ``tensor_parallel.autotp_size``) and ``layout.json`` (tp, pp, cp, dp,
recompute); the model shape comes from ``--model``. The dimensions map onto DeepSpeed as:

- dp: the engine's data parallelism with ZeRO 0-3, optimizer and parameter offload;
- pp: ``deepspeed.pipe.PipelineModule`` trained with ``engine.train_batch`` (ZeRO <= 1);
- tp: AutoTP training (``tensor_parallel.autotp_size``; Llama module names, ``preset_model``);
- cp: Ulysses ``deepspeed.sequence.layer.DistributedAttention`` with ``parallel_state_sp``;
- ep: the MoE layers of a Mixture-of-Experts model are ``deepspeed.moe.layer.MoE`` with
  ``ep_size=ep`` (top-k softmax gating, dropless, no random token selection; the router's
  auxiliary loss reaches the gradients as Megatron's ``MoEAuxLossAutoScaler`` does, so the
  reported loss is the language-model loss); shared experts are a dense MLP beside them;
- recompute: ``full`` checkpoints every decoder layer, ``selective`` the core attention.

Rank 0 prints one JSON line per step and a final summary line to stdout (and appends them to
``--metrics``); a rank that fails alone (oom, or a refusal inside ``deepspeed.initialize``)
prints its own summary with a ``rank`` field. Worker exit codes: 0 ok, 2 bad input, 3 nan,
4 oom, 5 rejected (a combination DeepSpeed cannot train; the summary's ``reason`` says why).
Launchers turn any failing worker into their own exit code 1, so read the summary's status.
Without a launcher the program runs as rank 0 of 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.frameworks.base import Rule
from autotune.frameworks.base import RuleGroup
from autotune.frameworks.base import rule
from autotune.layout import BoolArray
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.measurement import cpu_wait_s
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs.inputs import load_model
from autotune.workloads import PROBLEM_FILE
from autotune.workloads.common import SEED
from autotune.workloads.common import Reporter
from autotune.workloads.common import check_arguments
from autotune.workloads.common import exit_now
from autotune.workloads.common import inject_failure
from autotune.workloads.common import is_oom
from autotune.workloads.common import read_json
from autotune.workloads.common import read_layout
from autotune.workloads.common import read_problem
from autotune.workloads.common import refusal
from autotune.workloads.common import teardown
from autotune.workloads.common import train_loop
from autotune.workloads.common import trial_config
from autotune.workloads.common import workload_parser
from autotune.workloads.instruments import SLOW_S
from autotune.workloads.instruments import PartClock
from autotune.workloads.instruments import collective_kind
from autotune.workloads.instruments import faults
from autotune.workloads.instruments import time_collectives
from autotune.workloads.tokens import open_tokens
from autotune.workloads.tokens import window

# --- inputs ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One trial, resolved from ds_config.json, layout.json and the command line."""

    layout: Layout
    """Parallel degrees and recompute (dp, zero, offload, mbs and gas agree with ds_config)."""
    micro_batch: int
    """Sequences per micro-step per data-parallel rank."""
    gas: int
    """Micro-steps per optimizer step."""
    train_batch: int
    """Sequences per optimizer step over all data-parallel ranks."""
    precision: str
    """bf16, fp16 or fp32 (from the bf16/fp16 sections of ds_config)."""
    seq: int
    """Tokens per sequence."""
    steps: int
    """Optimizer steps to run, warm-up included."""
    warmup: int
    """Leading steps left out of the summary."""
    data: Path | None = None
    """The .npy token file trained on (`--train`: DATA_PATH); None: seeded random tokens."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.train_batch * self.seq


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line; launcher arguments such as ``--local_rank`` are ignored."""
    parser = workload_parser("python -m autotune.workloads.deepspeed_gpt")
    parser.add_argument("--ds-config", required=True, type=Path, help="rendered ds_config.json")
    parser.add_argument("--train", action="store_true",
                        help="a training run (launch_deepspeed.sh of --train-script builtin): "
                             "train on DATA_PATH's tokens for TRAIN_ITERS steps, every step "
                             "reported; the problem is problem.json beside --ds-config")
    args, _unknown = parser.parse_known_args(argv)
    if args.train:
        training_run(parser, args)
    check_arguments(parser, args)
    return args


def training_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--train`: the data, length and problem of a rendered folder's training run, from the
    environment launch_deepspeed.sh exports (DATA_PATH, TRAIN_ITERS) and the folder."""
    data, iters = os.environ.get("DATA_PATH", ""), os.environ.get("TRAIN_ITERS", "")
    if not data:
        parser.error("--train: DATA_PATH is not set; point it at a .npy file of token ids "
                     "(np.save('tokens.npy', np.asarray(ids, dtype=np.uint32)))")
    if not (iters.isascii() and iters.isdigit() and int(iters) > 0):
        parser.error(f"--train: TRAIN_ITERS={iters!r} must be a positive whole number of steps")
    args.data, args.steps, args.warmup = Path(data), int(iters), 0
    if args.problem is None and args.model is None:
        args.problem = args.ds_config.parent / PROBLEM_FILE


def _offload_of(zero: dict[str, Any]) -> str:
    """The Layout offload value that a zero_optimization section describes."""

    def on(section: str) -> bool:
        value = zero.get(section) or {}
        return str(value.get("device", "none")) not in ("none", "None")

    if on("offload_param"):
        return "optimizer+params"
    return "optimizer" if on("offload_optimizer") else "none"


def _batch_sizes(ds: dict[str, Any], dp: int) -> tuple[int, int, int]:
    """(train_batch, micro_batch, gas) completed the way DeepSpeed completes them."""
    train = ds.get("train_batch_size")
    micro = ds.get("train_micro_batch_size_per_gpu")
    gas = ds.get("gradient_accumulation_steps")
    if micro is not None and gas is not None:
        train = train if train is not None else micro * gas * dp
    elif train is not None and micro is not None:
        gas = train // (micro * dp)
    elif train is not None and gas is not None:
        micro = train // (gas * dp)
    elif train is not None:
        micro, gas = train // dp, 1
    else:
        raise AutotuneError(
            "ds_config: set train_batch_size or train_micro_batch_size_per_gpu with "
            "gradient_accumulation_steps"
        )
    if train != micro * gas * dp:
        raise AutotuneError(
            f"ds_config: train_batch_size ({train}) != micro ({micro}) · gas ({gas}) · dp ({dp})"
        )
    return int(train), int(micro), int(gas)


def _precision(ds: dict[str, Any]) -> str:
    if (ds.get("bf16") or {}).get("enabled"):
        return "bf16"
    return "fp16" if (ds.get("fp16") or {}).get("enabled") else "fp32"


def make_plan(
    args: argparse.Namespace, ds: dict[str, Any], world_size: int, seq: int | None = None
) -> Plan:
    """Check that ds_config.json, layout.json and the world agree, and resolve the trial.

    Raises:
        AutotuneError: the files contradict each other or the world size.
    """
    layout = read_layout(args.layout)
    if "fit_world" in faults() and layout.world_size != world_size:
        # test-only: shrink dp to the processes started (what a launcher that ignores the
        # layout does), so the gate must catch it from what the engine reports
        layout = dataclasses.replace(layout, dp=world_size // (layout.tp * layout.pp * layout.cp))
        ds = {**ds, "train_batch_size": layout.global_batch_size}
    layout.validate(world_size)
    train, micro, gas = _batch_sizes(ds, layout.dp)
    zero = ds.get("zero_optimization") or {}
    autotp = int((ds.get("tensor_parallel") or {}).get("autotp_size", 0) or 1)
    checks = {
        "zero_optimization.stage": (int(zero.get("stage", 0)), layout.zero),
        "offload (zero_optimization.offload_*)": (_offload_of(zero), layout.offload),
        "tensor_parallel.autotp_size": (autotp, layout.tp),
        "sequence_parallel_size": (int(ds.get("sequence_parallel_size", layout.cp)), layout.cp),
        "train_micro_batch_size_per_gpu": (micro, layout.mbs),
        "gradient_accumulation_steps": (gas, layout.gas),
    }
    wrong = [f"{key}: ds_config {a} vs layout {b}" for key, (a, b) in checks.items() if a != b]
    if wrong:
        raise AutotuneError(
            f"{args.ds_config} and {args.layout} disagree ({'; '.join(wrong)}); render both "
            "from the same layout"
        )
    return Plan(layout=layout, micro_batch=micro, gas=gas, train_batch=train,
                precision=_precision(ds), seq=seq or args.seq, steps=args.steps,
                warmup=args.warmup, data=getattr(args, "data", None))


LIMITS: list[Rule] = []
"""What this program cannot train although DeepSpeed's rules allow it."""


@rule(LIMITS, "deepspeed_gpt_no_fp16_on_cpu",
      "DeepSpeed's CPU accelerator has no fp16 ('Type fp16 is not supported on your device')",
      RuleGroup.WORKLOAD)
def _fp16_on_cpu(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return np.full(len(t), cfg.train.precision == "fp16" and not torch.cuda.is_available())


@rule(LIMITS, "deepspeed_gpt_moe_tp_needs_nccl",
      "DeepSpeed's MoE layer gathers expert outputs over AutoTP ranks into a flat buffer "
      "(deepspeed/moe/mappings.py:40), which gloo's all_gather_into_tensor refuses: a MoE model "
      "with tp={l.tp} trains on GPUs (NCCL) only",
      RuleGroup.WORKLOAD)
def _moe_tp_on_cpu(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return cfg.model.moe & (t.tp > 1) & (not torch.cuda.is_available())


# --- the model -------------------------------------------------------------------------------


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.normalization == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


def rotary(x: torch.Tensor, offset: int, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding of x [batch, seq, heads, head_dim] at positions offset, offset+1, ..."""
    dim = x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    positions = torch.arange(offset, offset + x.shape[1], device=x.device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq).repeat(1, 2)[None, :, None, :]
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * angles.cos().to(x.dtype) + rotated * angles.sin().to(x.dtype)).to(x.dtype)


class CoreAttention(nn.Module):
    """Causal softmax attention over [batch, seq, heads, head_dim]; GQA by head groups."""

    def __init__(self, recompute: bool) -> None:
        super().__init__()
        self.recompute = recompute

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._attend, q, k, v, use_reentrant=False)
        return self._attend(q, k, v)

    @staticmethod
    def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=True, enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2)


class Attention(nn.Module):
    """Llama-style self-attention; head counts come from the (possibly sharded) weights."""

    def __init__(self, spec: ModelSpec, recompute: bool, sp_group: Any, sp_rank: int) -> None:
        super().__init__()
        h, d, bias = spec.hidden_size, spec.head_dim, spec.add_bias_linear
        self.head_dim = d
        self.rope = spec.position_embedding == "rope"
        self.sp_rank = sp_rank
        self.q_proj = nn.Linear(h, spec.num_attention_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, spec.query_groups * d, bias=bias)
        self.v_proj = nn.Linear(h, spec.query_groups * d, bias=bias)
        self.o_proj = nn.Linear(spec.num_attention_heads * d, h, bias=bias)
        core: nn.Module = CoreAttention(recompute)
        if sp_group is not None:
            from deepspeed.sequence.layer import DistributedAttention

            core = DistributedAttention(core, sp_group, scatter_idx=2, gather_idx=1)
        self.core = core
        self.ulysses = sp_group is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, -1, self.head_dim)
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim)
        if self.rope:
            offset = self.sp_rank * seq
            q, k = rotary(q, offset), rotary(k, offset)
        out = self.core(q, k, v, 0) if self.ulysses else self.core(q, k, v)
        return self.o_proj(out.reshape(batch, seq, -1))


class MLP(nn.Module):
    """SwiGLU (gate_proj, up_proj, down_proj) or GELU (up_proj, down_proj) of width `width`
    (the model's ffn by default)."""

    def __init__(self, spec: ModelSpec, width: int | None = None) -> None:
        super().__init__()
        h, f, bias = spec.hidden_size, width or spec.ffn, spec.add_bias_linear
        self.gate_proj = nn.Linear(h, f, bias=bias) if spec.gated else None
        self.up_proj = nn.Linear(h, f, bias=bias)
        self.down_proj = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is None:
            return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _AuxLossGradient(torch.autograd.Function):
    """Identity on the activations whose backward also sends `scale` into the router's
    auxiliary loss (Megatron's MoEAuxLossAutoScaler): the loss trains the router without being
    part of the reported loss, and it crosses pipeline stages inside the activations."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


class MoEMLP(nn.Module):
    """A Mixture-of-Experts MLP: DeepSpeed's MoE over the routed experts (``ep_size`` ranks share
    them) plus the shared experts every token uses (a dense MLP, optionally sigmoid-gated).

    Expert e starts from seed SEED + 1000·(layer + 1) + e whatever the rank holding it, so every
    ep trains the same model. `aux_scale` is d(loss)/d(aux loss): the coefficient over the
    micro-batches and Ulysses ranks the language-model loss is averaged over.
    """

    def __init__(self, spec: ModelSpec, ep: int, layer: int, aux_scale: float) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE

        experts = spec.num_experts or 1
        self.moe = MoE(spec.hidden_size, MLP(spec, spec.moe_ffn), num_experts=experts,
                       ep_size=ep, k=spec.moe_router_topk, drop_tokens=False, use_rts=False,
                       top2_2nd_expert_sampling=False)
        # DeepSpeed copies one expert num_experts // ep times; give each its own weights. An
        # expert group is ep consecutive ranks (utils/groups.py _create_expert_and_data_parallel)
        local = self.moe.deepspeed_moe.experts.deepspeed_experts
        first = (dist.get_rank() % ep if dist.is_initialized() else 0) * len(local)
        for index, expert in enumerate(local):
            torch.manual_seed(SEED + 1000 * (layer + 1) + first + index)
            for module in expert.modules():
                if isinstance(module, nn.Linear):
                    module.reset_parameters()
        shared = spec.moe_shared_expert_intermediate_size
        self.shared = MLP(spec, shared) if shared else None
        self.shared_gate = (nn.Linear(spec.hidden_size, 1, bias=False)
                            if spec.moe_shared_expert_gate else None)
        self.aux_scale = aux_scale
        self.loads: list[float] = []
        """Per forward: the rows every local expert ran over the mean copies per expert
        (`expert_load`)."""
        self._tokens = 0
        self.moe.deepspeed_moe.experts.register_forward_pre_hook(self._padded)

    def _padded(self, _experts: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        # DeepSpeed's experts run [ep, local experts, capacity, h]: dropless, the capacity is
        # the busiest expert's copies, the max over the ep group (sharded_moe.top2gating)
        spec_experts, topk = self.moe.num_experts, self.moe.deepspeed_moe.gate.k
        self.loads.append(inputs[0].shape[2] * spec_experts / (self._tokens * topk))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._tokens = x.numel() // x.shape[-1]
        out, aux, _counts = self.moe(x)
        if torch.is_grad_enabled() and self.aux_scale:
            # torch.autograd.Function.apply carries no annotations
            out = _AuxLossGradient.apply(out, aux, self.aux_scale)  # type: ignore[no-untyped-call]
        if self.shared is None:
            return out
        shared = self.shared(x)
        if self.shared_gate is not None:
            shared = torch.sigmoid(self.shared_gate(x)) * shared
        return out + shared


def expert_load(model: nn.Module) -> float | None:
    """The padded expert rows of the forwards since the last call over their balanced count,
    averaged over this rank's MoE layers and forwards (None without MoE layers), then reset.

    DeepSpeed's dropless MoE pads every expert to the capacity, the busiest expert's copies
    over the ep group, so the experts' GEMMs and all-to-alls move experts · capacity rows
    where balanced routing would move tokens · k: the ratio is the trial's own
    `moe_load_imbalance` (a property of the router at its initialisation and of the tokens,
    not of the hardware)."""
    loads = [load for module in model.modules() if isinstance(module, MoEMLP)
             for load in module.loads]
    for module in model.modules():
        if isinstance(module, MoEMLP):
            module.loads.clear()
    return sum(loads) / len(loads) if loads else None


@dataclasses.dataclass(frozen=True, slots=True)
class MoEPlan:
    """How a decoder layer builds a MoE MLP: expert-parallel ranks and the aux-loss gradient."""

    ep: int = 1
    """Ranks the routed experts are spread over."""
    aux_scale: float = 0.0
    """d(loss)/d(aux loss) (see MoEMLP)."""


def _mlp(spec: ModelSpec, moe: MoEPlan, layer: int) -> nn.Module:
    if spec.moe_layer_pattern[layer]:
        return MoEMLP(spec, moe.ep, layer, moe.aux_scale)
    return MLP(spec)


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer (Llama naming, so AutoTP's llama preset matches it); layer
    `layer` of a MoE model has a MoE MLP where the model's pattern says so."""

    def __init__(self, spec: ModelSpec, recompute: str, sp_group: Any, sp_rank: int,
                 moe: MoEPlan = MoEPlan(), layer: int = 0) -> None:
        super().__init__()
        self.input_layernorm = _norm(spec)
        self.self_attn = Attention(spec, recompute == "selective", sp_group, sp_rank)
        self.post_attention_layernorm = _norm(spec)
        self.mlp = _mlp(spec, moe, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Embedding(nn.Embedding):
    """An embedding initialised with std 0.02 inside its constructor (so zero.Init sees it)."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)


def _embeddings(spec: ModelSpec) -> tuple[nn.Embedding, nn.Embedding | None]:
    """Token embedding and, for learned positions, the position embedding."""
    tokens = _Embedding(spec.vocab_size, spec.hidden_size)
    if spec.position_embedding != "learned_absolute":
        return tokens, None
    return tokens, _Embedding(spec.max_position_embeddings, spec.hidden_size)


def _embed(
    tokens: torch.Tensor, table: nn.Embedding, positions: nn.Embedding | None, sp_rank: int
) -> torch.Tensor:
    """Embed this rank's chunk of tokens (chunk sp_rank of the sequence under Ulysses)."""
    x = table(tokens)
    if positions is None:
        return x
    start = sp_rank * tokens.shape[1]
    index = torch.arange(start, start + tokens.shape[1], device=tokens.device)
    return x + positions(index)[None]


class Embedding(nn.Module):
    """Token (and learned position) embedding; the first pipeline stage."""

    def __init__(self, spec: ModelSpec, sp_rank: int) -> None:
        super().__init__()
        self.embed_tokens, self.embed_positions = _embeddings(spec)
        self.sp_rank = sp_rank

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return _embed(tokens, self.embed_tokens, self.embed_positions, self.sp_rank)


class Head(nn.Module):
    """Final norm and output layer; the last pipeline stage (untied embeddings)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = _norm(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


class FinalNorm(nn.Module):
    """Final norm alone, for a pipeline whose output layer is the tied embedding."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = _norm(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class Body(nn.Module):
    """``model.embed_tokens``, ``model.layers.N``, ``model.norm`` (Hugging Face Llama names)."""

    def __init__(self, spec: ModelSpec, recompute: str, sp_group: Any, sp_rank: int,
                 moe: MoEPlan) -> None:
        super().__init__()
        # one seed per part, as PipelineModule(seed_layers=True) seeds its layers: the pipelined
        # model starts from the same weights
        torch.manual_seed(SEED)
        self.embed_tokens, self.embed_positions = _embeddings(spec)
        self.sp_rank = sp_rank
        layers = []
        for index in range(spec.num_layers):
            torch.manual_seed(SEED + 1 + index)
            layers.append(DecoderLayer(spec, recompute, sp_group, sp_rank, moe, index))
        self.layers = nn.ModuleList(layers)
        self.norm = _norm(spec)
        self.full_recompute = recompute == "full"

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = _embed(tokens, self.embed_tokens, self.embed_positions, self.sp_rank)
        for layer in self.layers:
            if self.full_recompute and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return self.norm(x)


class GPT(nn.Module):
    """The whole model for the plain engine: ``model`` (the body) and ``lm_head``."""

    def __init__(self, spec: ModelSpec, recompute: str, sp_group: Any, sp_rank: int,
                 moe: MoEPlan) -> None:
        super().__init__()
        self.model = Body(spec, recompute, sp_group, sp_rank, moe)
        torch.manual_seed(SEED + 1 + spec.num_layers)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(tokens))


class _ScaledGradient(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by `scale` (the grad_bug fault)."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class LossFn:
    """Mean next-token cross entropy in fp32, times ``scale`` (1/cp under Ulysses); its
    gradient times ``grad_scale`` (1 unless the test-only grad_bug fault sets it)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.grad_scale = 1.0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()) * self.scale
        if self.grad_scale == 1.0:
            return loss
        # torch.autograd.Function.apply carries no annotations
        return _ScaledGradient.apply(loss, self.grad_scale)  # type: ignore[no-untyped-call]


def _tied_head(module: Embedding, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.embed_tokens.weight)


def build_pipeline(spec: ModelSpec, plan: Plan, loss_fn: LossFn, moe: MoEPlan) -> nn.Module:
    """A ``PipelineModule`` of embedding, decoder layers and head, split evenly by layers."""
    from deepspeed.pipe import LayerSpec
    from deepspeed.pipe import PipelineModule
    from deepspeed.pipe import TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    blocks = [LayerSpec(DecoderLayer, spec, "none", None, 0, moe, index)
              for index in range(spec.num_layers)]
    if spec.tied_embeddings:
        attr = "embed_tokens.weight"
        layers: list[Any] = [
            TiedLayerSpec("embed", Embedding, spec, 0, tied_weight_attr=attr),
            *blocks,
            LayerSpec(FinalNorm, spec),
            TiedLayerSpec(
                "embed", Embedding, spec, 0, forward_fn=_tied_head, tied_weight_attr=attr
            ),
        ]
    else:
        layers = [LayerSpec(Embedding, spec, 0), *blocks, LayerSpec(Head, spec)]
    lay = plan.layout
    return PipelineModule(
        layers=layers,
        topology=PipeDataParallelTopology(num_pp=lay.pp, num_dp=lay.dp),
        loss_fn=loss_fn,
        partition_method="type:DecoderLayer",
        seed_layers=True,
        base_seed=SEED,
        seed_fn=torch.manual_seed,
        activation_checkpoint_interval=1 if lay.recompute == "full" else 0,
        checkpointable_layers=["DecoderLayer"],
    )


# --- data and measurement --------------------------------------------------------------------


class SyntheticTokens:
    """Seeded random tokens; every rank of one data-parallel slot (tp, cp) sees the same batch."""

    def __init__(self, vocab: int, plan: Plan, dp_rank: int, cp_rank: int, device: Any,
                 clock: PartClock | None = None) -> None:
        self.vocab, self.plan, self.device = vocab, plan, device
        self.dp_rank, self.cp_rank = dp_rank, cp_rank
        self.clock = clock or PartClock(lambda: None)
        self.fingerprint = 0
        """A hash of the tokens drawn since the last `take_fingerprint`."""
        injected = faults()
        self.same_seed, self.sleep_s = "same_seed" in injected, SLOW_S * ("slow_data" in injected)

    def sequences(self, index: int) -> torch.Tensor:
        """The micro-batch `index` of the run: [micro_batch, seq + 1] seeded random tokens."""
        generator = torch.Generator().manual_seed(SEED + 7919 * index)
        return torch.randint(self.vocab, (self.plan.micro_batch, self.plan.seq + 1),
                             generator=generator)

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) of this rank's sequence chunk, each [micro_batch, seq / cp]."""
        with self.clock.timing("data"):
            plan = self.plan
            dp_rank = 0 if self.same_seed else self.dp_rank
            index = (step * plan.gas + micro) * plan.layout.dp + dp_rank
            tokens = self.sequences(index)
            chunk = plan.seq // plan.layout.cp
            start = self.cp_rank * chunk
            inputs = tokens[:, start:start + chunk]
            labels = tokens[:, start + 1:start + chunk + 1]
            weights = torch.arange(1, inputs.numel() + 1, dtype=torch.int64)
            self.fingerprint = hash((self.fingerprint, int((inputs.flatten() * weights).sum())))
            if self.sleep_s:
                time.sleep(self.sleep_s)
            return inputs.to(self.device), labels.to(self.device)

    def take_fingerprint(self) -> int:
        """The hash of the tokens drawn since the last call, reset."""
        value, self.fingerprint = self.fingerprint, 0
        return value

    def micro_batches(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The gas micro-batches of one step, for ``engine.train_batch``."""
        return (self.batch(step, micro) for micro in range(self.plan.gas))


class FileTokens(SyntheticTokens):
    """The user's tokens (`autotune.workloads.tokens`: a .npy file of token ids), in order:
    micro-batch i holds samples i·micro_batch to (i + 1)·micro_batch − 1 of the file."""

    def __init__(self, path: Path, vocab: int, plan: Plan, dp_rank: int, cp_rank: int,
                 device: Any, clock: PartClock | None = None) -> None:
        super().__init__(vocab, plan, dp_rank, cp_rank, device, clock)
        self.tokens = open_tokens(path, vocab, plan.seq)

    def sequences(self, index: int) -> torch.Tensor:
        """The file's windows of micro-batch `index`: [micro_batch, seq + 1]."""
        first = index * self.plan.micro_batch
        rows = [window(self.tokens, first + row, self.plan.seq)
                for row in range(self.plan.micro_batch)]
        return torch.from_numpy(np.stack(rows))


# --- the run ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Trial:
    """A set-up DeepSpeed engine with everything the training loop needs."""

    engine: Any
    plan: Plan
    data: SyntheticTokens
    loss_fn: LossFn
    pipeline: bool
    device: torch.device
    clock: PartClock
    place: dict[str, int]
    """This rank's coordinates: rank, dp, tp, cp, stage."""
    series: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    """Per step on this rank: compute_s, data_s, losses (this rank's), data (token hash),
    expert_load (MoE models, `expert_load`)."""


def _engine_config(ds: dict[str, Any]) -> dict[str, Any]:
    """ds_config as given, plus the AutoTP preset and an optimizer when the file has none."""
    config: dict[str, Any] = json.loads(json.dumps(ds))
    config.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-4}})
    if "zero_ignored" in faults():  # test-only: the config loses its ZeRO section
        config["zero_optimization"] = {"stage": 0}
    if "fit_world" in faults():  # test-only: DeepSpeed derives the batch from the world
        config.pop("train_batch_size", None)
    tensor_parallel = config.get("tensor_parallel") or {}
    if int(tensor_parallel.get("autotp_size", 0) or 0) > 1 and not (
        tensor_parallel.get("preset_model") or tensor_parallel.get("partition_config")
    ):
        tensor_parallel["preset_model"] = "llama"
    return config


def _parallel_groups(lay: Layout) -> tuple[Any, int, Any]:
    """(Ulysses group, this rank's chunk index, mpu for deepspeed.initialize) of the layout."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.utils import groups

    if lay.cp > 1:
        parallel_state_sp.initialize_sequence_parallel(lay.cp)
        group = parallel_state_sp.get_sequence_parallel_group()
        return group, parallel_state_sp.get_sequence_parallel_rank(), parallel_state_sp
    if lay.tp > 1:
        # AutoTP's own groups, made early and passed as mpu so that DeepSpeed checks the batch
        # against dp = world / tp (without an mpu it counts every tp rank as data parallel)
        groups._init_tp_mesh_device(tensor_model_parallel_size=lay.tp)
        return None, 0, groups
    return None, 0, None


def setup(spec: ModelSpec, plan: Plan, ds: dict[str, Any]) -> Trial:
    """Initialise groups, build the model for the layout and wrap it in a DeepSpeed engine."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    lay = plan.layout
    sp_group, cp_rank, mpu = _parallel_groups(lay)
    config = _engine_config(ds)
    loss_fn = LossFn(1.0 / lay.cp)
    moe = MoEPlan(lay.ep, spec.moe_aux_loss_coeff / (plan.gas * lay.cp))
    if lay.pp > 1:
        model = build_pipeline(spec, plan, loss_fn, moe)
    elif lay.zero == 3:
        with deepspeed.zero.Init(config_dict_or_path=config, mpu=mpu):
            model = GPT(spec, lay.recompute, sp_group, cp_rank, moe)
    else:
        model = GPT(spec, lay.recompute, sp_group, cp_rank, moe)
    clock = PartClock(get_accelerator().synchronize)
    kinds: dict[str, str] = {}  # tp, cp and ep process groups by name

    def kind_of(name: str, group: Any) -> str:
        weights = lay.zero == 3 and clock.phase in ("forward", "backward")
        return collective_kind(name, kinds.get(_group_name(group)), weights)

    time_collectives(deepspeed.comm, clock, kind_of)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, mpu=mpu
    )
    kinds.update(_group_kinds(lay, sp_group))
    # tp and cp groups are consecutive ranks; the pipeline grid knows its own data rank
    dp_rank = (engine.grid.get_data_parallel_id() if lay.pp > 1
               else dist.get_rank() // (lay.tp * lay.cp))
    device = torch.device(get_accelerator().current_device_name())
    data = (SyntheticTokens(spec.vocab_size, plan, dp_rank, cp_rank, device, clock)
            if plan.data is None else
            FileTokens(plan.data, spec.vocab_size, plan, dp_rank, cp_rank, device, clock))
    place = {"rank": dist.get_rank(), "dp": dp_rank, "cp": cp_rank,
             "tp": dist.get_rank() % lay.tp if lay.cp == 1 else 0,
             "stage": engine.grid.get_stage_id() if lay.pp > 1 else 0}
    trial = Trial(engine, plan, data, loss_fn, lay.pp > 1, device, clock, place)
    _instrument(trial)
    return trial


def _group_name(group: Any) -> str:
    """The name torch gave a process group (unique per group; the default group for None)."""
    named = group if group is not None else dist.group.WORLD
    if named is None:
        raise RuntimeError("a collective ran before torch.distributed.init_process_group")
    return str(named.group_name)


def _group_kinds(lay: Layout, sp_group: Any) -> dict[str, str]:
    """This rank's tp, cp and ep process groups by name, by kind (what `collective_kind` reads):
    the groups themselves, since a cp or ep group may hold the same ranks as the
    data-parallel group ZeRO reduces over."""
    from deepspeed.utils import groups

    kinds: dict[str, str] = {}
    if lay.tp > 1:
        kinds[_group_name(groups.get_tensor_model_parallel_group())] = "tp"
    if sp_group is not None:
        kinds[_group_name(sp_group)] = "cp"
    for group in groups._get_expert_parallel_group_dict().values():
        kinds.setdefault(_group_name(group), "ep")
    return kinds


_PIPE_PHASES = {"ForwardPass": "forward", "BackwardPass": "backward", "ReduceGrads": "reduce",
                "ReduceTiedGrads": "reduce", "OptimizerStep": "optimizer",
                "LoadMicroBatch": "data", "SendActivation": "pipe", "RecvActivation": "pipe",
                "SendGrad": "pipe", "RecvGrad": "pipe"}
"""Phase of each instruction of DeepSpeed's pipeline schedule."""


def _instrument(trial: Trial) -> None:
    """Time the phases the engine runs by itself, and inject the per-rank faults."""
    engine, clock = trial.engine, trial.clock
    if trial.pipeline:  # the engine's own instruction map, each entry timed as its phase
        timed = {}
        for instruction, method in type(engine)._INSTRUCTION_MAP.items():
            phase = _PIPE_PHASES.get(instruction.__name__, "pipe")

            def run(self: Any, *args: Any, _method: Any = method, _phase: str = phase,
                    **kwargs: Any) -> Any:
                with clock.timing(_phase):
                    return _method(self, *args, **kwargs)

            timed[instruction] = run
        engine._INSTRUCTION_MAP = timed
    injected = faults()
    if "slow_rank" in injected and dist.get_rank() == 1:
        engine.module.register_forward_pre_hook(lambda module, args: time.sleep(SLOW_S))
    if "grad_bug" in injected and trial.place["tp"] == 1:
        trial.loss_fn.grad_scale = 4.0


def train_step(trial: Trial, step: int) -> torch.Tensor:
    """One optimizer step; returns this rank's share of the global loss (a 0-d tensor)."""
    engine, clock = trial.engine, trial.clock
    if trial.pipeline:
        return engine.train_batch(data_iter=trial.data.micro_batches(step)).detach().float()
    total = torch.zeros((), device=trial.device)
    for micro in range(trial.plan.gas):
        inputs, labels = trial.data.batch(step, micro)
        with clock.timing("forward"):
            loss = trial.loss_fn(engine(inputs), labels)
        with clock.timing("backward"):
            engine.backward(loss)
        with clock.timing("optimizer"):
            engine.step()
        total += loss.detach().float()
    return total / trial.plan.gas


def _global_loss(trial: Trial, local: torch.Tensor) -> float:
    """The loss of the global batch, the same on every rank."""
    if trial.pipeline:
        return float(local)
    lay = trial.plan.layout
    dist.all_reduce(local)
    # every rank of a tp group holds the same loss; cp ranks hold 1/cp of theirs
    return float(local) / (lay.tp * lay.dp)


def train(trial: Trial, reporter: Reporter, inject: str | None) -> dict[str, Any]:
    """Run the steps, emit one record per step, and return the summary record."""
    from deepspeed.accelerator import get_accelerator

    def timed_step(step: int) -> tuple[float, float]:
        if inject_failure(inject, step, trial.device):
            trial.loss_fn.scale = math.nan  # the injected NaN goes into the loss scale
        start, waited = time.perf_counter(), cpu_wait_s()
        local = train_step(trial, step)
        get_accelerator().synchronize()
        step_time_s = time.perf_counter() - start
        waited = cpu_wait_s() - waited
        own = float(local)
        loss = _global_loss(trial, local)
        parts = trial.clock.take()
        _record(trial.series, compute_s=parts.get("compute", 0.0), data_s=parts.get("data", 0.0),
                losses=None if trial.pipeline else own, data=trial.data.take_fingerprint(),
                parts=parts, step_s=step_time_s, cpu_wait_s=waited,
                expert_load=expert_load(trial.engine.module))
        return step_time_s, loss

    summary = train_loop(trial.plan, reporter, trial.device, timed_step,
                         step_extra=lambda step: {"parts": trial.series["parts"][step]})
    summary.update(measured_parts(trial, summary))
    return summary


def _record(series: dict[str, list[Any]], **values: Any) -> None:
    for key, value in values.items():
        series.setdefault(key, []).append(value)


def measured_parts(trial: Trial, summary: dict[str, Any]) -> dict[str, Any]:
    """`breakdown`: rank 0's parts averaged over the measured steps, beside the mean measured
    step time, the time no part covers (`unattributed_s`) and, for a MoE model, every rank's
    `expert_load` averaged (`moe_load_imbalance`); `ranks`: every rank's place and
    per-step series (compute_s, data_s, its own loss, a hash of its tokens) for the gate."""
    warmup = trial.plan.warmup
    steps = trial.series.get("parts", [])[warmup:]
    every: list[Any] = [None] * dist.get_world_size()
    mine = {**trial.place, **{k: v[warmup:] for k, v in trial.series.items()
                              if k not in ("parts", "step_s") and v[warmup:]
                              and v[warmup] is not None}}
    dist.all_gather_object(every, mine)
    if not steps or summary.get("status") != "ok":
        return {"ranks": every}
    names = sorted({name for parts in steps for name in parts})
    breakdown = {name: sum(p.get(name, 0.0) for p in steps) / len(steps) for name in names}
    step_s = sum(trial.series["step_s"][warmup:]) / len(steps)
    # the rank that waited longest for a CPU (contention from other processes, not a part)
    waits = [sum(r.get("cpu_wait_s", [])) / len(steps) for r in every if r]
    measured = {"parts": breakdown, "step_time_s": step_s,
                "unattributed_s": step_s - sum(breakdown.values()),
                "cpu_wait_s": max(waits, default=0.0)}
    # every stage's MoE layers (ranks of one ep group ran the same capacity)
    loads = [load for r in every if r for load in r.get("expert_load", [])]
    if loads:
        measured["moe_load_imbalance"] = sum(loads) / len(loads)
    return {"breakdown": measured, "ranks": every}


def describe_engine(engine: Any, spec: ModelSpec) -> dict[str, Any]:
    """What DeepSpeed built: optimizer class, ZeRO stage, the weights this rank's module holds,
    and `ran`: the layout read back from the engine and the model (what the validity gate
    compares with the layout asked for).

    ``params_local`` counts this rank's tensor-parallel shards and pipeline stage (before ZeRO
    partitioning), so it shows that tp and pp really split the model.
    """
    optimizer = getattr(engine, "basic_optimizer", None) or engine.optimizer
    params = sum(int(getattr(p, "ds_numel", p.numel())) for p in engine.module.parameters())
    return {"optimizer": type(optimizer).__name__,
            "zero_stage": int(engine.zero_optimization_stage()), "params_local": params,
            "ran": read_back(engine, spec)}


def _offload_ran(engine: Any) -> str:
    def on(section: Any) -> bool:
        return section is not None and str(getattr(section, "device", "none")) not in (
            "none", "OffloadDeviceEnum.none")

    if on(engine.zero_offload_param()):
        return "optimizer+params"
    return "optimizer" if on(engine.zero_offload_optimizer()) else "none"


def read_back(engine: Any, spec: ModelSpec) -> dict[str, Any]:
    """The layout the engine runs: world size from the process group; tp from this rank's
    slice of the first q_proj; pp, cp (Ulysses) and ep from the engine and its MoE layers;
    dp from DeepSpeed's own batch arithmetic (train batch / (micro-batch · accumulation));
    ZeRO stage, offload, micro-batch, accumulation and precision from the engine's config."""
    rows = spec.num_attention_heads * spec.head_dim
    tp = 1
    ep = 1
    for name, module in engine.module.named_modules():
        if name.endswith("q_proj") and tp == 1:
            weight = module.weight
            local = int(getattr(weight, "ds_shape", weight.shape)[0])
            tp = rows // local if local else 1
        ep = max(ep, int(getattr(module, "ep_size", 1) or 1))
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    precision = ("bf16" if engine.bfloat16_enabled()
                 else "fp16" if engine.fp16_enabled() else "fp32")
    return {"world_size": dist.get_world_size(), "tp": tp,
            "pp": int(getattr(engine, "num_stages", 1)),
            "dp": engine.train_batch_size() // (micro * gas),
            "cp": int(engine.sequence_parallel_size or 1), "ep": ep,
            "zero": int(engine.zero_optimization_stage()), "offload": _offload_ran(engine),
            "mbs": micro, "gas": gas, "precision": precision}


def _single_process_env() -> None:
    """Without a launcher, be rank 0 of 1 on a free local port (so plain ``python -m`` works)."""
    if "RANK" in os.environ:
        return
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def _init_distributed() -> None:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cuda":
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())


def run(args: argparse.Namespace) -> int:
    """Check the inputs, set up, train and tear down; returns the exit code."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    _single_process_env()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    reporter = Reporter(rank, args.metrics)
    try:
        given = read_problem(args.problem) if args.problem is not None else None
        spec = given.model if given is not None else load_model(args.model)
        ds = read_json(args.ds_config)
        plan = make_plan(args, ds, world, seq=given.train.seq_length if given else None)
        cfg = given or trial_config(spec, world_size=world, seq_length=plan.seq,
                                    global_batch_size=plan.train_batch,
                                    precision=plan.precision, framework="deepspeed")
    except AutotuneError as error:
        print(f"error: {error}", file=sys.stderr)
        return reporter.fail("bad_input", str(error), world)
    reason = refusal(cfg, plan.layout, tuple(LIMITS))
    if reason is not None:
        return reporter.fail("rejected", reason, world)
    _init_distributed()
    try:
        trial = setup(spec, plan, ds)
    except (AssertionError, ValueError, NotImplementedError) as error:
        # what deepspeed.initialize refuses (batch sizes, ZeRO with pipeline, group checks)
        return reporter.rank_failed("rejected", error, world)
    except Exception as error:
        if not is_oom(error):
            raise
        return reporter.rank_failed("oom", error, world)
    try:
        summary = train(trial, reporter, args.inject)
    except Exception as error:
        if not is_oom(error):
            raise
        return reporter.rank_failed("oom", error, world)
    summary.update(describe_engine(trial.engine, spec))
    return reporter.finish(summary, teardown)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m autotune.workloads.deepspeed_gpt``."""
    return run(parse_args(argv))


if __name__ == "__main__":
    exit_now(main())  # os._exit: no interpreter teardown after destroy_process_group
