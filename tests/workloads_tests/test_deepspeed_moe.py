"""The built-in DeepSpeed workload on a Mixture-of-Experts model (tiny-moe: 4 experts, top-2),
with real torchrun processes on gloo.

The reference is one process holding every expert, with gradient accumulation 2: it sees the
same two sequences per step as two processes at dp=2, whether each holds all experts (ep=1)
or half of them (ep=2, tokens exchanged by all-to-all). Routing is deterministic (no random
token selection, dropless, no second-expert sampling) and every expert starts from the same
weights whatever rank holds it, so DeepSpeed must train the same model: the losses agree to a
few fp32 rounding steps (`SAME`). `deepspeed_unchecked.py` runs the workload's model without
autotune's rules to show what DeepSpeed itself refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_deepspeed_gpt import REPO
from test_deepspeed_gpt import SAME
from test_deepspeed_gpt import TIMEOUT_S
from test_deepspeed_gpt import Trial
from test_deepspeed_gpt import run_trial
from test_deepspeed_gpt import write_trial

from autotune.specs.inputs import load_model
from autotune.workloads import deepspeed_gpt

MODEL = "tiny-moe"
UNCHECKED = Path(__file__).parent / "deepspeed_unchecked.py"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    """One process, every expert local, micro-batch 1, gradient accumulation 2."""
    directory = write_trial(tmp_path_factory.mktemp("moe-reference"), 1, gas=2)
    return run_trial(directory, 1, model=MODEL).ok()


def expert_params(model: str) -> int:
    """Weights of one routed expert, worked out from the spec: gated MLP, no biases."""
    spec = load_model(model)
    assert spec.gated and not spec.add_bias_linear
    return 3 * spec.hidden_size * spec.moe_ffn


@pytest.mark.slow
@pytest.mark.parametrize(("ep", "zero"), [(1, 0), (2, 0), (2, 1), (2, 2)],
                         ids=["ep1-zero0", "ep2-zero0", "ep2-zero1", "ep2-zero2"])
def test_expert_parallel_trains_like_one_process(
    tmp_path: Path, reference: Trial, ep: int, zero: int
) -> None:
    """Oracle: the one-process run. ep=2 spreads the 4 experts of each layer over the two
    ranks (2 each) and trains the same model with ZeRO 0-2; each rank then holds
    layers · (4 - 2) experts fewer than the reference."""
    trial = run_trial(write_trial(tmp_path, 2, ep=ep, zero=zero), 2, model=MODEL).ok()
    assert trial.losses == pytest.approx(reference.losses, **SAME)
    spec = load_model(MODEL)
    moved = sum(spec.moe_layer_pattern) * (spec.num_experts - spec.num_experts // ep)
    assert trial.summary["params_local"] == (
        reference.summary["params_local"] - moved * expert_params(MODEL))
    # an ep group's ranks pad their experts to one all-reduced capacity: the same load
    loads = [rank["expert_load"] for rank in trial.summary["ranks"]]
    assert (loads[0] == pytest.approx(loads[1])) == (ep == 2)
    assert trial.summary["breakdown"]["moe_load_imbalance"] >= 1
    # DeepSpeed's own groups: the dispatch runs on the ep group, the gradients reduce on the
    # data-parallel group, a process group of its own even where its ranks are the ep group's
    parts = trial.summary["breakdown"]["parts"]
    assert parts.get("dp_comm", 0) > 0 and ("ep_comm" in parts) == (ep == 2)


@pytest.mark.slow
def test_moe_pipeline_trains_like_one_process(tmp_path: Path, reference: Trial) -> None:
    """Oracle: the one-process run; PipelineModule stages carry the MoE layers (and the
    router's auxiliary-loss gradient, which rides on the activations)."""
    trial = run_trial(write_trial(tmp_path, 2, pp=2, zero=1, gas=2), 2, model=MODEL).ok()
    assert trial.losses == pytest.approx(reference.losses, **SAME)


EXPERT_LOAD = """
import os, sys, torch, deepspeed
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
deepspeed.init_distributed("gloo")
from autotune.specs.inputs import load_model
from autotune.workloads import deepspeed_gpt
spec = load_model("tiny-moe")
mlp = deepspeed_gpt.MoEMLP(spec, 1, 0, 0.0)
mlp.moe.set_deepspeed_parallelism()
for batch in (1, 2, 4):
    torch.manual_seed(batch)
    mlp(torch.randn(batch, 64, spec.hidden_size) * batch)
    counts = mlp.moe.deepspeed_moe.exp_counts
    print("RESULT", deepspeed_gpt.expert_load(mlp), int(counts.max()), int(counts.sum()))
"""


def test_expert_load_is_the_busiest_experts_share() -> None:
    """Oracle: DeepSpeed's own routing counts (`MOELayer.exp_counts`, copies per expert of one
    forward): dropless at ep 1 the capacity every expert is padded to is the largest count, so
    the load the workload records is that count over the mean, max · E / (S · k), S · k being
    the counts' sum."""
    done = subprocess.run([sys.executable, "-c", EXPERT_LOAD, str(29500 + os.getpid() % 400)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    rows = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(rows) == 3, done.stderr[-3000:]
    experts = load_model(MODEL).num_experts
    for load, busiest, copies in rows:
        assert float(load) == pytest.approx(int(busiest) * experts / int(copies))
        assert float(load) > 1


def run_unchecked(directory: Path, nproc: int) -> str:
    """The RESULT line of deepspeed_unchecked.py on the trial in `directory`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(nproc), str(UNCHECKED), "--model", MODEL,
               "--ds-config", str(directory / "ds_config.json"),
               "--layout", str(directory / "layout.json"), "--seq", "64"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return lines[-1].removeprefix("RESULT ")


@pytest.mark.slow
def test_deepspeed_refuses_moe_with_zero3(tmp_path: Path) -> None:
    """Oracle: DeepSpeed itself (engine.py, _validate_zero3_moe_compatibility) refuses MoE
    layers under ZeRO-3, what rule deepspeed_moe_without_zero3 stands for."""
    result = run_unchecked(write_trial(tmp_path, 1, zero=3), 1)
    assert result.startswith("AssertionError: Native DeepSpeed MoE is not supported with ZeRO")


@pytest.mark.slow
def test_moe_with_autotp_fails_on_gloo(tmp_path: Path) -> None:
    """Oracle: DeepSpeed on gloo. Its MoE layer gathers the expert outputs of AutoTP ranks into
    a flat buffer (moe/mappings.py), which gloo refuses: the workload's limit
    deepspeed_gpt_moe_tp_needs_nccl."""
    result = run_unchecked(write_trial(tmp_path, 2, tp=2, zero=1, gas=2), 2)
    assert "ProcessGroupGloo::allgather: invalid tensor size" in result


def test_aux_loss_gradient_reaches_the_router() -> None:
    """Worked by hand: out = x·w with aux = sum(w²) injected at scale s has the gradient of
    sum(out) + s·aux, that is x + 2·s·w, while the forward value stays out."""
    x, w = torch.randn(5), torch.randn(5, requires_grad=True)
    out = x * w
    injected = deepspeed_gpt._AuxLossGradient.apply(out, (w**2).sum(), 0.25)
    assert torch.equal(injected, out)
    injected.sum().backward()
    assert torch.allclose(w.grad, x + 0.5 * w.detach())
