"""The bounded value types of every input: strict integers, finite floats, each with an upper
bound whose reason the error message gives (the bounds also keep numpy int64 arithmetic exact).
"""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal

from pydantic import AfterValidator
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field
from pydantic import Strict
from pydantic_core import PydanticCustomError

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
Framework = Literal["megatron", "deepspeed"]

FROZEN = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


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
GpuHourPrice = Annotated[
    FiniteFloat, Field(gt=0), at_most(1e4, "1,000x the list price of an H100 GPU-hour")
]
"""What one GPU-hour costs (any currency; plans multiply GPU-hours by it)."""


ExpertCount = Annotated[
    Integer, Field(ge=1), at_most(2**14, "64x the most routed experts published, 256")
]
"""Experts, routed experts per token, expert groups."""
LayerCountOrZero = Annotated[
    Integer, Field(ge=0), at_most(MAX_LAYERS, "100x the deepest published transformer")
]
"""A count of layers (or positions) that may be zero."""
_Flag = Annotated[bool, Field(strict=True)]
_Positive = Annotated[FiniteFloat, Field(gt=0)]
_Probability = Annotated[FiniteFloat, Field(ge=0, lt=1)]

Activation = Literal["gelu", "gelu_tanh", "relu", "swiglu", "geglu"]
LayerBlock = Literal["pre_norm", "parallel", "parallel_shared_norm", "sandwich"]
PositionEmbedding = Literal["learned_absolute", "rope", "alibi"]
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]
