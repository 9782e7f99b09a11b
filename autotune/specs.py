"""The inputs: a model, a cluster and a training setup (validated pydantic values).

Every number a user can type is one of the bounded types below: integers are strict (a YAML
`true` or `4.5` is not a count), floats are finite, and each has an upper bound whose reason the
error message gives. Besides catching typos, the bounds keep the models' numpy int64 arithmetic
exact.
"""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field
from pydantic import Strict
from pydantic import StrictBool
from pydantic import model_validator
from pydantic_core import PydanticCustomError

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
Framework = Literal["megatron", "deepspeed"]

_FROZEN = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# --- bounded numbers --------------------------------------------------------------------------


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "must be a number, not true/false")
    return value


def at_most(high: float, why: str) -> AfterValidator:
    """Annotated metadata: the value must be at most `high`; `why` goes into the message."""

    def check(value: Any) -> Any:
        if value > high:
            raise PydanticCustomError(
                "too_large", "must be at most {high} ({why})", {"high": f"{high:,}", "why": why}
            )
        return value

    return AfterValidator(check)


Integer = Annotated[int, BeforeValidator(_not_bool), Strict()]
"""An integer as written: no bool, no float, no numeric string."""
FiniteFloat = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
"""A finite number (no bool, NaN or infinity)."""

SeqLength = Annotated[
    Integer, Field(ge=1), at_most(2**24, "beyond any trained context, 10M tokens of Llama 4 Scout")
]
"""Tokens per sequence."""
BatchSize = Annotated[
    Integer, Field(ge=1), at_most(2**20, "16x the largest published batch, 65,536 sequences")
]
"""Sequences per optimizer step (and per micro-batch)."""
NodeCount = Annotated[
    Integer, Field(ge=1), at_most(2**16, "more than the largest clusters, about 25,000 nodes")
]
"""Nodes of a cluster."""
DevicesPerNode = Annotated[
    Integer, Field(ge=1), at_most(2**10, "far above the 72 GPUs of an NVL72 rack")
]
"""Accelerators (or CPU worker processes) per node."""
MAX_LAYERS = 2**14
"""The most transformer layers (and virtual pipeline stages) a model may have."""
LayerCount = Annotated[
    Integer, Field(ge=1), at_most(MAX_LAYERS, "100x the deepest published transformer, 126 layers")
]
"""Transformer layers (also bounds virtual pipeline stages: each holds one layer at least)."""
Width = Annotated[
    Integer, Field(ge=1), at_most(2**20, "20x the widest published MLP, 53,248 of Llama 3 405B")
]
"""Channels: hidden size, MLP width, head dimension."""
HeadCount = Annotated[
    Integer, Field(ge=1), at_most(2**14, "100x the most attention heads published, 128")
]
"""Attention heads or key/value groups."""
VocabSize = Annotated[
    Integer, Field(ge=1), at_most(2**24, "60x the largest published vocabulary, 262,144")
]
"""Tokenizer entries."""
Seed = Annotated[Integer, Field(ge=0), at_most(2**32 - 1, "NumPy's RandomState seed range")]
"""Seed of a random generator."""

GpuMemoryGiB = Annotated[FiniteFloat, Field(gt=0), at_most(2**16, "400x the 141 GB of an H200")]
"""Device memory, GiB."""
TFlops = Annotated[
    FiniteFloat, Field(gt=0), at_most(1e5, "20x the highest dense peak, 4,500 of a B200 in FP8")
]
"""Peak throughput, TFLOP/s."""
MemoryTBs = Annotated[FiniteFloat, Field(gt=0), at_most(1e3, "100x the 8 TB/s of a B200")]
"""Memory bandwidth, TB/s."""
LinkGBs = Annotated[
    FiniteFloat, Field(gt=0), at_most(1e5, "100x NVLink 5, 900 GB/s per direction")
]
"""Link bandwidth per direction, GB/s."""
HostMemoryGB = Annotated[
    FiniteFloat, Field(gt=0), at_most(2**24, "16 PB per node, 500x the largest servers")
]
"""Host memory, GB."""


class ModelSpec(BaseModel):
    """A dense decoder-only transformer, in Megatron-LM's argument names."""

    model_config = _FROZEN

    name: str = "custom"
    """Display name (a preset name, or the file it came from)."""
    num_layers: int = Field(gt=0)
    """Transformer layers."""
    hidden_size: int = Field(gt=0)
    """Model width h."""
    num_attention_heads: int = Field(gt=0)
    """Query heads a."""
    num_query_groups: int | None = Field(default=None, gt=0)
    """Key/value heads g for grouped-query attention; None means g = a (multi-head)."""
    ffn_hidden_size: int | None = Field(default=None, gt=0)
    """MLP width f; None means 4h."""
    vocab_size: int = Field(gt=0)
    """Tokenizer vocabulary V (before any padding)."""
    activation: Literal["gelu", "swiglu"] = "gelu"
    """MLP activation; swiglu has three weight matrices instead of two."""
    tied_embeddings: bool = True
    """Input embedding and output layer share one weight."""
    max_position_embeddings: int = Field(default=2048, gt=0)
    """Longest sequence the model supports, in tokens."""
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    """Norm layers (RMSNorm has no bias)."""
    position_embedding: Literal["learned_absolute", "rope"] = "learned_absolute"
    """Position embedding type."""
    add_bias_linear: bool = True
    """Linear layers carry biases (GPT) or not (Llama)."""

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.query_groups:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_query_groups ({self.query_groups})"
            )
        return self

    @property
    def query_groups(self) -> int:
        """Key/value heads g (a when not grouped)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        """MLP width f."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """Channels per head d = h / a."""
        return self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        """True for SwiGLU (three MLP matrices)."""
        return self.activation == "swiglu"

    def layer_params(self) -> int:
        """Weights of one transformer layer (Megatron's count: matrices and norms, no biases)."""
        h, d, a, g = self.hidden_size, self.head_dim, self.num_attention_heads, self.query_groups
        attention = 2 * h * d * (a + g)
        mlp = (3 if self.gated else 2) * h * self.ffn
        norms = 2 * h * self.norm_factor
        return attention + mlp + norms

    @property
    def norm_factor(self) -> int:
        """Weights per channel of a norm: 1 for RMSNorm, 2 for LayerNorm (weight and bias)."""
        return 1 if self.normalization == "rmsnorm" else 2

    def num_params(self, vocab: int | None = None) -> int:
        """All weights, embedding and (untied) output layer included."""
        v = vocab or self.vocab_size
        embeddings = self.hidden_size * v * (1 if self.tied_embeddings else 2)
        final_norm = self.hidden_size * self.norm_factor
        return self.num_layers * self.layer_params() + embeddings + final_norm


class GPUSpec(BaseModel):
    """One accelerator: memory, dense peak throughput per precision, memory bandwidth."""

    model_config = _FROZEN

    name: str = "custom-gpu"
    """Preset name or free text."""
    memory_gb: GpuMemoryGiB
    """Device memory as the datasheet states it ("80GB"); vendors' figures match what CUDA
    reports in GiB (A100 80GB: 81,920 MiB; H200 141GB: 143,771 MiB), so it is read as GiB."""
    peak_tflops: dict[Precision, TFlops] = Field(min_length=1)
    """Dense (no sparsity) peak in TFLOP/s per precision; a missing key means unsupported."""
    hbm_tb_s: MemoryTBs
    """Device memory bandwidth in TB/s."""

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (memory_gb read as GiB, as CUDA reports it)."""
        return self.memory_gb * 2**30


class ClusterSpec(BaseModel):
    """Nodes of identical GPUs, their links and their hosts."""

    model_config = _FROZEN

    name: str = "custom"
    """Display name (preset:nodes, a file name, or local)."""
    nodes: NodeCount
    """Number of nodes."""
    gpus_per_node: DevicesPerNode
    """Accelerators (or CPU worker processes, for `local` without GPUs) per node."""
    gpu: GPUSpec
    """The accelerator."""
    intra_node_gb_s: LinkGBs
    """Per-GPU, per-direction bandwidth inside a node (NVLink), GB/s."""
    inter_node_gb_s: LinkGBs
    """Per-GPU, per-direction network bandwidth between nodes (InfiniBand), GB/s."""
    host_memory_gb: HostMemoryGB
    """CPU memory per node, GB."""
    pcie_gb_s: LinkGBs
    """Per-GPU host link bandwidth per direction, GB/s."""
    cpu_processes: StrictBool = False
    """True when the 'GPUs' are CPU processes on gloo (the `local` cluster without CUDA)."""

    @property
    def world_size(self) -> int:
        """All accelerators in the cluster."""
        return self.nodes * self.gpus_per_node


class TrainSpec(BaseModel):
    """The training setup a layout must serve."""

    model_config = _FROZEN

    seq_length: SeqLength
    """Tokens per sequence."""
    global_batch_size: BatchSize
    """Sequences per optimizer step, over all data-parallel replicas."""
    precision: Precision = "bf16"
    """Compute precision of the matrix multiplies (fp8 = fp8 GEMMs with bf16 elsewhere)."""
    framework: Framework = "megatron"
    """Framework whose rules and configs apply."""
    flash_attention: StrictBool = True
    """Fused attention that never stores the s×s score matrix (FlashAttention / cuDNN)."""
    overlap_grad_reduce: StrictBool = True
    """Data-parallel gradient reduction overlaps the last backward pass."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.seq_length * self.global_batch_size


class AutotuneConfig(BaseModel):
    """Everything that defines a tuning problem: model, cluster and training setup."""

    model_config = _FROZEN

    model: ModelSpec
    """The model to train."""
    cluster: ClusterSpec
    """Where it trains."""
    train: TrainSpec
    """How it trains."""

    @property
    def world_size(self) -> int:
        """Accelerators used by every layout."""
        return self.cluster.world_size

    def identity(self) -> dict[str, Any]:
        """What makes two problems the same: model, training, and the cluster's shape and GPU
        (not throughput figures measured on the spot, as for the local CPU cluster)."""
        cluster = self.cluster.model_dump(mode="json", exclude={"gpu"})
        cluster["gpu"] = {"name": self.cluster.gpu.name}
        if not self.cluster.cpu_processes:
            cluster["gpu"] = self.cluster.gpu.model_dump(mode="json")
        else:
            cluster.pop("host_memory_gb")
        return {"model": self.model.model_dump(mode="json"), "cluster": cluster,
                "train": self.train.model_dump(mode="json")}

    def padded_vocab(self, tp: Any) -> Any:
        """Vocab as the framework pads it (Megatron: a multiple of 128·tp; tp may be an array)."""
        if self.train.framework != "megatron":
            return self.model.vocab_size + 0 * tp
        multiple = 128 * tp
        return -(-self.model.vocab_size // multiple) * multiple
