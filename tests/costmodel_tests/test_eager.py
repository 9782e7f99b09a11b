"""The eager stack's terms against what PyTorch does for the workload's layer.

Oracle: one `DecoderLayer` of `autotune.workloads.deepspeed_gpt` (the layer CPU trials train)
in fp32 on CPU: forward and backward under `ElementwiseCount` (a `TorchDispatchMode`: every
non-GEMM, non-view ATen op and the bytes of the tensors it reads and writes), and its forward
under `saved_bytes` (`torch.autograd.graph.saved_tensors_hooks`: every storage autograd keeps
for the backward, the parameters left out). The optimizer step: a real DeepSpeed engine's
`step` (one gloo process, `optimizer_count.py`) under the same counter; gradient
accumulation: autograd's second backward into existing `.grad`.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.costmodel.constants import Constants
from autotune.costmodel.eager import eager_elementwise
from autotune.costmodel.eager import eager_grad_accumulation_s
from autotune.costmodel.eager import eager_optimizer_s
from autotune.costmodel.eager import saved_activation_bytes
from autotune.costmodel.kernels import head_times
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs.inputs import load_config
from autotune.specs.inputs import load_model
from autotune.workloads.common import trial_config
from autotune.workloads.deepspeed_gpt import DecoderLayer
from autotune.workloads.deepspeed_gpt import LossFn
from autotune.workloads.dispatch import ElementwiseCount
from autotune.workloads.dispatch import saved_bytes

LLAMA_GQA = {"num_layers": 2, "hidden_size": 192, "num_attention_heads": 6,
             "num_query_groups": 2, "ffn_hidden_size": 512, "vocab_size": 1000,
             "activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rope",
             "add_bias_linear": False, "tied_embeddings": False}
GPT = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000,
       "ffn_hidden_size": 384}
"""Shapes besides tiny-gpt: GQA with other widths; GPT-style LayerNorm, GELU and biases."""


def _problem(spec: ModelSpec, seq: int, mbs: int,
             recompute: str = "none") -> tuple[AutotuneConfig, LayoutTable]:
    cfg = trial_config(spec, world_size=1, seq_length=seq, global_batch_size=mbs,
                       precision="fp32", framework="deepspeed")
    layout = Layout.parse(f"tp=1,pp=1,cp=1,zero=0,mbs={mbs},recompute={recompute}", 1, mbs,
                          framework_of(cfg))
    return cfg, LayoutTable.from_layouts([layout])


@pytest.mark.parametrize(("spec", "seq", "mbs"), [
    (load_model("tiny-gpt"), 256, 1), (ModelSpec(**LLAMA_GQA), 128, 2), (ModelSpec(**GPT), 64, 3)
], ids=["tiny-gpt", "llama-gqa", "gpt"])
def test_eager_count_matches_the_dispatched_ops(spec: ModelSpec, seq: int, mbs: int) -> None:
    """The model's bytes are within 3 % of the dispatched ops' bytes (it leaves out the rotary
    tables and the norms' per-token statistics) and its op count is exact."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layer = DecoderLayer(spec, "none", None, 0)
    x = torch.randn(mbs, seq, spec.hidden_size, requires_grad=True)
    grad = torch.randn_like(x)
    with ElementwiseCount() as count:
        layer(x).backward(grad)
    cfg, table = _problem(spec, seq, mbs)
    moved, ops = eager_elementwise(cfg, table)
    assert int(ops[0]) == count.ops, count.names
    assert float(moved[0]) == pytest.approx(count.bytes, rel=0.03)


@pytest.mark.parametrize(("spec", "seq", "mbs", "recompute"), [
    (load_model("tiny-gpt"), 256, 1, "none"), (load_model("tiny-gpt"), 128, 4, "selective"),
    (ModelSpec(**LLAMA_GQA), 128, 2, "none"), (ModelSpec(**GPT), 64, 3, "none"),
], ids=["tiny-gpt", "tiny-gpt-selective", "llama-gqa", "gpt"])
def test_eager_activations_match_what_autograd_saves(spec: ModelSpec, seq: int, mbs: int,
                                                     recompute: str) -> None:
    """The model's activation bytes per layer are within 2 % of the storages autograd keeps
    (the layer's input included: the model charges each layer its input)."""
    torch.manual_seed(0)
    layer = DecoderLayer(spec, recompute, None, 0)
    x = torch.randn(mbs, seq, spec.hidden_size, requires_grad=True)
    kept = saved_bytes(lambda: layer(x), layer.parameters())
    cfg, table = _problem(spec, seq, mbs, recompute)
    assert float(saved_activation_bytes(cfg, table)[0]) == pytest.approx(kept, rel=0.02)


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_eager_optimizer_bytes_match_a_deepspeed_step(zero: int) -> None:
    """The bytes the model charges a CPU worker's optimizer step per parameter are within 1 %
    of what a real DeepSpeed engine's `step` dispatches (96 B with ZeRO-0, 132 B with ZeRO 1
    and 2, as counted with DeepSpeed's installed release)."""
    script = Path(__file__).with_name("optimizer_count.py")
    done = subprocess.run([sys.executable, str(script), str(zero), _free_port()],
                          capture_output=True, text=True, timeout=120, check=True)
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    spec = load_model("tiny-gpt")
    cfg = trial_config(spec, world_size=1, seq_length=64, global_batch_size=1,
                       precision="fp32", framework="deepspeed")
    layout = Layout.parse(f"tp=1,pp=1,cp=1,zero={zero},mbs=1", 1, 1, framework_of(cfg))
    k = Constants()
    charged = eager_optimizer_s(LayoutTable.from_layouts([layout]), k, 1.0,
                                1.0 / k.eager_efficiency)  # bytes per parameter
    assert float(charged[0]) == pytest.approx(counted["bytes"] / counted["params"], rel=0.01)


def test_eager_grad_accumulation_matches_autograd() -> None:
    """A second backward into existing `.grad` dispatches one `add_` per weight, 12 B per
    parameter (counted); the model charges that for each micro-batch after the first (4
    micro-batches: three)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 256, bias=False)
    x = torch.randn(2, 256)
    layer(x).sum().backward()
    with ElementwiseCount() as count:
        layer(x).sum().backward()
    assert count.names.get("add_") == 1
    cfg = trial_config(load_model("tiny-gpt"), world_size=1, seq_length=64, global_batch_size=4,
                       precision="fp32", framework="deepspeed")
    layout = Layout.parse("tp=1,pp=1,cp=1,zero=0,mbs=1", 1, 4, framework_of(cfg))
    k = Constants()
    charged = eager_grad_accumulation_s(LayoutTable.from_layouts([layout]), k, 1.0,
                                        1.0 / k.eager_efficiency)  # bytes per parameter
    per_add = count.bytes / layer.weight.numel()  # with the loss's small sum: 12.03 B
    assert float(charged[0]) == pytest.approx(3 * per_add, rel=0.01)


def test_output_layer_first_touch_matches_the_page_faults() -> None:
    """Oracle: the minor page faults `getrusage` counts (4 KiB each) over the workload's output
    layer and loss (`LossFn`), forward and backward, one thread, tiny-gpt at mbs 8: its
    64 MiB logit-sized tensors are mapped afresh at every step. At `first_touch_s_per_gb` = 1
    the model's extra seconds of the output layer are those bytes in GB (within 5 %)."""
    spec = load_model("tiny-gpt")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    head = torch.nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
    x = torch.randn(8, 256, spec.hidden_size, requires_grad=True)
    labels = torch.randint(0, spec.vocab_size, (8, 256))

    def step() -> None:
        head.weight.grad = x.grad = None
        LossFn(1.0)(head(x), labels).backward()  # type: ignore[no-untyped-call]

    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        step()
    faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3 * 4096
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    layout = Layout.parse("tp=1,pp=1,cp=1,zero=0,mbs=8", cfg.world_size,
                          cfg.train.global_batch_size, framework_of(cfg))
    table = LayoutTable.from_layouts([layout])
    vocab = framework_of(cfg).padded_vocab(spec.vocab_size, table.tp)
    touched, untouched = (head_times(cfg, table, vocab, Constants(first_touch_s_per_gb=rate))[0]
                          for rate in (1.0, 0.0))
    assert float(touched[0] - untouched[0]) * 1e9 == pytest.approx(faulted, rel=0.05)
