"""The built-in DeepSpeed workload: real torchrun processes on gloo, one per parallel dimension.

The reference is one process with gradient accumulation 2: it sees the same two sequences per
step as dp=2, tp=2 + gas 2, cp=2 + gas 2 and pp=2 + gas 2, and every run starts from the same
weights, so all of them must report the same losses (to a few fp32 rounding steps: the
optimizer's elementwise kernels round the last bit differently on flat ZeRO buffers than on
separate tensors, so bitwise equality holds only for some seeds).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.specs.inputs import load_model
from autotune.workloads import WORKLOADS
from autotune.workloads import common
from autotune.workloads import deepspeed_gpt
from autotune.workloads import workload_spec
from autotune.workloads.common import refusal

REPO = Path(__file__).resolve().parents[2]
MODULE = "autotune.workloads.deepspeed_gpt"
SEQ = 64
STEPS = 4
WARMUP = 1
TIMEOUT_S = 300
SAME = {"rel": 1e-6, "abs": 0.0}
"""Loss agreement between layouts: a few fp32 ulps at loss ~9."""
CLOSE = {"rel": 1e-5, "abs": 0.0}
"""Loss agreement when the optimizer implementation differs (DeepSpeedCPUAdam vs torch AdamW)."""


# --- helpers ---------------------------------------------------------------------------------


def write_trial(directory: Path, world: int, **fields: Any) -> Path:
    """Write ds_config.json and layout.json for a layout on `world` processes; return the dir.

    Non-offload runs use torch's AdamW (``torch_adam``), offload runs DeepSpeedCPUAdam.
    """
    precision = fields.pop("precision", "fp32")
    base = {"tp": 1, "pp": 1, "cp": 1, "zero": 0, "offload": "none", "mbs": 1, "gas": 1}
    values = {**base, **fields}
    dp = world // (values["tp"] * values["pp"] * values["cp"])
    layout = Layout(dp=dp, **values)
    zero: dict[str, Any] = {"stage": layout.zero}
    if layout.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu"}
    if layout.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu"}
    adam: dict[str, Any] = {"lr": 1e-3}
    if layout.offload == "none":
        adam["torch_adam"] = True
    config: dict[str, Any] = {
        "train_batch_size": layout.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.mbs,
        "gradient_accumulation_steps": layout.gas,
        "optimizer": {"type": "AdamW", "params": adam},
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 1000,
    }
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.cp > 1:
        config["sequence_parallel_size"] = layout.cp
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ds_config.json").write_text(json.dumps(config, indent=2))
    (directory / "layout.json").write_text(json.dumps({**layout.to_dict(), "id": layout.id}))
    return directory


@dataclasses.dataclass
class Trial:
    """One finished workload process tree."""

    returncode: int
    records: list[dict[str, Any]]
    stdout: str
    stderr: str

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["event"] == "step"]

    @property
    def summary(self) -> dict[str, Any]:
        summaries = [r for r in self.records if r["event"] == "summary"]
        assert summaries, f"no summary line\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        return summaries[-1]

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.steps]

    def ok(self) -> Trial:
        """Assert the run succeeded, with its log tail as the message otherwise."""
        assert self.returncode == 0 and self.summary["status"] == "ok", (
            f"rc={self.returncode}\n{self.stdout[-3000:]}\n{self.stderr[-5000:]}"
        )
        return self


def run_trial(
    directory: Path, nproc: int, *, launcher: bool = True, inject: str | None = None,
    model: str = "tiny-gpt",
) -> Trial:
    """Run the workload on the trial in `directory` under torchrun (or plain python)."""
    _build_ops()
    command = [sys.executable, "-m"]
    if launcher:
        command += ["torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                    "-m"]
    metrics = directory / "metrics.jsonl"
    command += [
        MODULE, "--model", model, "--ds-config", str(directory / "ds_config.json"),
        "--layout", str(directory / "layout.json"), "--seq", str(SEQ), "--steps", str(STEPS),
        "--warmup", str(WARMUP), "--metrics", str(metrics),
    ]
    if inject:
        command += ["--inject", inject]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    printed = [json.loads(line) for line in done.stdout.splitlines()
               if line.startswith('{"event"')]
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if (
        metrics.exists()) else []
    assert printed == records, "stdout and --metrics must carry the same records"
    return Trial(done.returncode, records, done.stdout, done.stderr)


@functools.cache
def _build_ops() -> None:
    """Build (or load from TORCH_EXTENSIONS_DIR) the JIT ops once, before any trial is timed."""
    code = (
        "from deepspeed.ops.op_builder import CPUAdamBuilder\n"
        "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder\n"
        "CPUAdamBuilder().load(); ShareMemCommBuilder().load()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    """One process, micro-batch 1, gradient accumulation 2."""
    directory = write_trial(tmp_path_factory.mktemp("reference"), 1, gas=2)
    return run_trial(directory, 1).ok()


@pytest.fixture(scope="module")
def zero_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Trial]:
    """dp=2 with ZeRO stages 0-3, fp32."""
    runs = {}
    for stage in range(4):
        directory = write_trial(tmp_path_factory.mktemp(f"zero{stage}"), 2, zero=stage)
        runs[stage] = run_trial(directory, 2).ok()
    return runs


# --- real processes --------------------------------------------------------------------------


@pytest.mark.slow
def test_single_process_records(reference: Trial) -> None:
    """One process: step records, then a summary whose numbers follow from them."""
    steps, summary = reference.steps, reference.summary
    assert [r["step"] for r in steps] == list(range(STEPS))
    assert [r["warmup"] for r in steps] == [i < WARMUP for i in range(STEPS)]
    for record in steps:
        assert record["tokens"] == 2 * SEQ  # train batch 2 = mbs 1 · gas 2
        assert record["tokens_per_s"] == pytest.approx(record["tokens"] / record["step_time_s"])
        assert record["peak_memory_bytes"] > 0
        assert 8.0 < record["loss"] < 10.0  # ln(8192) = 9.01 for random tokens
    measured = [r["step_time_s"] for r in steps[WARMUP:]]
    assert summary["median_step_time_s"] == pytest.approx(statistics.median(measured))
    assert summary["tokens_per_s"] == pytest.approx(2 * SEQ / summary["median_step_time_s"])
    assert summary["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in steps)
    assert summary["step_time_spread"] >= 0
    assert (summary["world_size"], summary["steps"], summary["zero_stage"]) == (1, STEPS, 0)
    assert summary["optimizer"] == "AdamW"


@pytest.mark.slow
def test_zero_stages_give_the_same_losses(zero_runs: dict[int, Trial], reference: Trial) -> None:
    """ZeRO 0-3 at dp=2 train the same model; dp=2 equals 1 process with gas=2."""
    for stage, trial in zero_runs.items():
        assert trial.summary["zero_stage"] == stage
        assert trial.summary["world_size"] == 2
        assert trial.losses == pytest.approx(zero_runs[0].losses, **SAME), f"zero={stage}"
    assert zero_runs[0].losses == pytest.approx(reference.losses, **SAME)
    # ZeRO-3 partitions the weights: the engine's module holds the same logical parameters
    assert zero_runs[3].summary["params_local"] == reference.summary["params_local"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("zero", "offload", "recompute"),
    [(2, "optimizer", "none"), (3, "optimizer+params", "full")],
    ids=["zero2-offload-optimizer", "zero3-offload-params-recompute-full"],
)
def test_offload_uses_cpu_adam(
    tmp_path: Path, reference: Trial, zero: int, offload: str, recompute: str
) -> None:
    """Optimizer (and parameter) offload train with DeepSpeedCPUAdam to the same losses.

    The ZeRO-3 case also checkpoints every decoder layer (torch.utils.checkpoint under ZeRO-3
    parameter gathering): recompute changes memory and time, not the losses.
    """
    directory = write_trial(tmp_path, 2, zero=zero, offload=offload, recompute=recompute)
    trial = run_trial(directory, 2).ok()
    assert trial.summary["optimizer"] == "DeepSpeedCPUAdam"
    assert trial.losses == pytest.approx(reference.losses, **CLOSE)


@pytest.mark.slow
def test_pipeline_parallel(tmp_path: Path, reference: Trial) -> None:
    """pp=2 through PipelineModule + train_batch (with layer checkpointing): half the weights."""
    directory = write_trial(tmp_path, 2, pp=2, zero=1, gas=2, recompute="full")
    trial = run_trial(directory, 2).ok()
    assert trial.losses == pytest.approx(reference.losses, **SAME)
    assert trial.summary["params_local"] < 0.75 * reference.summary["params_local"]


@pytest.mark.slow
def test_tensor_parallel_autotp(tmp_path: Path, reference: Trial) -> None:
    """tp=2 through AutoTP: projections really shard, losses equal the 1-process run."""
    directory = write_trial(tmp_path, 2, tp=2, zero=1, gas=2, recompute="selective")
    trial = run_trial(directory, 2).ok()
    assert trial.losses == pytest.approx(reference.losses, **SAME)
    assert trial.summary["breakdown"]["parts"].get("tp_comm", 0) > 0
    spec = load_model("tiny-gpt")
    halved = spec.num_layers * (spec.layer_params() - 2 * spec.hidden_size) // 2
    assert trial.summary["params_local"] == reference.summary["params_local"] - halved


@pytest.mark.slow
def test_context_parallel_ulysses(tmp_path: Path, reference: Trial) -> None:
    """cp=2 through Ulysses DistributedAttention: each rank holds half of every sequence."""
    trial = run_trial(write_trial(tmp_path, 2, cp=2, zero=2, gas=2), 2).ok()
    assert trial.losses == pytest.approx(reference.losses, **SAME)
    # the all-to-alls run on the sequence-parallel group, ZeRO's reductions on DeepSpeed's
    # sequence-data-parallel group: the same two ranks, a process group of its own
    parts = trial.summary["breakdown"]["parts"]
    assert parts.get("cp_comm", 0) > 0 and parts.get("dp_comm", 0) > 0


@pytest.mark.slow
def test_nan_injection_exits_3(tmp_path: Path) -> None:
    """A NaN loss ends the run at the step it appears, with status nan and exit code 3.

    Runs without a launcher (the workload makes itself rank 0 of 1): torchrun reports any
    failing worker as exit code 1.
    """
    trial = run_trial(write_trial(tmp_path, 1), 1, launcher=False, inject="nan")
    assert trial.returncode == 3, trial.stderr[-3000:]
    assert trial.summary["status"] == "nan"
    assert [r["loss"] is None for r in trial.steps] == [False, False, True]
    assert trial.summary["steps"] == common.INJECT_STEP + 1


@pytest.mark.slow
def test_pipeline_with_zero2_is_rejected(tmp_path: Path) -> None:
    """A combination DeepSpeed cannot train ends with status rejected and the reason."""
    trial = run_trial(write_trial(tmp_path, 2, pp=2, zero=2), 2)
    assert trial.returncode != 0
    assert trial.summary["status"] == "rejected"
    assert "incompatible with pipeline parallelism" in trial.summary["reason"]


# --- in-process checks -----------------------------------------------------------------------


def test_every_framework_program_accepts_the_arguments_runners_build(tmp_path: Path) -> None:
    """Oracle: each program's own argument parser, given what `WorkloadSpec.arguments` builds."""
    import importlib

    from autotune.frameworks import FRAMEWORKS
    from autotune.frameworks import get_framework

    for name in FRAMEWORKS:
        spec = workload_spec(get_framework(name).workload)
        assert spec.name in WORKLOADS
        program = importlib.import_module(spec.module)
        args = program.parse_args(spec.arguments(tmp_path, steps=5, warmup=1))
        assert (args.problem, args.steps, args.warmup) == (tmp_path / "problem.json", 5, 1)
    with pytest.raises(AutotuneError, match="deepspeed_gpt"):
        workload_spec("nope")


def _plan(tmp_path: Path, world: int, **fields: Any) -> deepspeed_gpt.Plan:
    return _read_plan(write_trial(tmp_path, world, **fields), world)


def _read_plan(directory: Path, world: int) -> deepspeed_gpt.Plan:
    args = deepspeed_gpt.parse_args([
        "--model", "tiny-gpt", "--ds-config", str(directory / "ds_config.json"),
        "--layout", str(directory / "layout.json"), "--seq", "64", "--local_rank=0",
    ])
    config = json.loads((directory / "ds_config.json").read_text())
    return deepspeed_gpt.make_plan(args, config, world)


def test_plan_reads_both_files(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 8, tp=2, zero=1, mbs=2, gas=3)
    assert (plan.layout.dp, plan.micro_batch, plan.gas, plan.train_batch) == (4, 2, 3, 24)
    assert plan.tokens_per_step == 24 * 64


def test_plan_rejects_files_that_disagree(tmp_path: Path) -> None:
    directory = write_trial(tmp_path, 2, zero=1)
    config_path = directory / "ds_config.json"
    config = json.loads(config_path.read_text())
    config["zero_optimization"]["stage"] = 3
    config_path.write_text(json.dumps(config))
    with pytest.raises(AutotuneError, match="zero_optimization.stage: ds_config 3 vs layout 1"):
        _read_plan(directory, 2)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"pp": 2, "zero": 2}, "ZeRO-2 and ZeRO-3 are incompatible"),
        ({"pp": 2, "tp": 2}, "deepspeed_pipeline_alone"),
        ({"pp": 2, "cp": 2}, "deepspeed_pipeline_alone"),
        ({"tp": 2, "cp": 2}, "deepspeed_autotp_without_ulysses"),
        ({"vpp": 2, "pp": 2}, "interleaved"),
    ],
)
def test_rejected_combinations(tmp_path: Path, fields: dict[str, Any], match: str) -> None:
    """Oracle: DeepSpeed 0.19 refused each combination when trained for real (the rules'
    reasons quote its errors); the trial program refuses them through the same named rules."""
    plan = _plan(tmp_path, 4, **fields)
    cfg = deepspeed_gpt.trial_config(load_model("tiny-gpt"), world_size=4, seq_length=plan.seq,
                                     global_batch_size=plan.train_batch,
                                     precision=plan.precision, framework="deepspeed")
    reason = refusal(cfg, plan.layout, tuple(deepspeed_gpt.LIMITS))
    assert reason is not None
    assert re.search(match, reason)


def test_supported_combination_is_not_rejected(tmp_path: Path) -> None:
    """Oracle: this combination trains for real (test_real_layouts_train_alike)."""
    plan = _plan(tmp_path, 8, tp=2, zero=3, offload="optimizer+params", recompute="full")
    cfg = deepspeed_gpt.trial_config(load_model("tiny-gpt"), world_size=8, seq_length=plan.seq,
                                     global_batch_size=plan.train_batch,
                                     precision=plan.precision, framework="deepspeed")
    assert refusal(cfg, plan.layout, tuple(deepspeed_gpt.LIMITS)) is None
