"""Kubeflow PyTorchJob and SkyPilot manifests: read by each project's own parser, and their
node scripts run by bash against a recording torchrun."""

from __future__ import annotations

import os
import stat
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml

from autotune import Layout
from autotune import load_config
from autotune.frameworks.deepspeed import BUILTIN_PROGRAM
from autotune.render import TrainProgram
from autotune.render import write_artifacts
from autotune.specs import JobSpec

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kubeflow.training import ApiClient
    from kubeflow.training import KubeflowOrgV1PyTorchJob

IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
RECORD = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$RECORD_DIR/$(basename "$0")"
"""


def _render(tmp_path: Path, framework: str, nodes: int = 2) -> dict[str, Path]:
    model = "llama3-70b" if framework == "megatron" else "llama2-7b"
    cfg = load_config(model, f"dgx-h100:{nodes}", framework=framework)
    cfg = cfg.model_copy(update={"job": JobSpec(container_image=IMAGE)})
    if framework == "megatron":
        layout = Layout(tp=8, pp=2, dp=nodes // 2, zero=1, gas=512 // (nodes // 2), sp=True)
    else:
        layout = Layout(dp=8 * nodes, zero=2, gas=1024 // (8 * nodes))
    program = TrainProgram(script="train.py", args=("--data", "/d"))
    return write_artifacts(cfg, layout, tmp_path / framework, program=program)


def _pytorchjob(path: Path) -> KubeflowOrgV1PyTorchJob:
    """The manifest as the Kubeflow training SDK deserializes it (its models check types and
    required fields: a missing container image or replica spec raises)."""
    data = yaml.safe_load(path.read_text())
    job: KubeflowOrgV1PyTorchJob = ApiClient()._ApiClient__deserialize(
        data, "KubeflowOrgV1PyTorchJob")
    return job


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_pytorchjob_reads_as_the_kubeflow_sdk_model(framework: str, tmp_path: Path) -> None:
    """Oracle: kubeflow-training's own models (KubeflowOrgV1PyTorchJob and the Kubernetes pod
    models it embeds): 2 nodes are one Master and one Worker pod with 8 GPUs each, the operator's
    container name `pytorch`, the configured image and sbatch.sh's environment."""
    job = _pytorchjob(_render(tmp_path, framework)["pytorchjob.yaml"])
    assert (job.api_version, job.kind) == ("kubeflow.org/v1", "PyTorchJob")
    specs = job.spec.pytorch_replica_specs
    assert (specs["Master"].replicas, specs["Worker"].replicas) == (1, 1)
    container = specs["Worker"].template.spec.containers[0]
    assert container.name == "pytorch" and container.image == IMAGE
    assert container.resources.limits == {"nvidia.com/gpu": "8"}  # a Kubernetes quantity
    env = {item.name: item.value for item in container.env}
    assert env["GPUS_PER_NODE"] == "8" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_skypilot_task_reads_as_a_sky_task(framework: str, tmp_path: Path) -> None:
    """Oracle: SkyPilot's own task parser (sky.Task.from_yaml): 2 nodes of 8 H100s in the
    configured docker image, the rendered port and environment."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sky = pytest.importorskip("sky", reason="SkyPilot is installed by .ci/run (--no-deps)")
    task = sky.Task.from_yaml(str(_render(tmp_path, framework)["skypilot.yaml"]))
    assert task.num_nodes == 2
    (resources,) = task.resources
    assert resources.accelerators == {"H100": 8}
    assert resources.image_id == {None: f"docker:{IMAGE}"}  # every region
    assert task.envs["MASTER_PORT"] == "6000" and task.envs["GPUS_PER_NODE"] == "8"


def _node_script(paths: dict[str, Path], kind: str) -> str:
    if kind == "pytorchjob":
        data = yaml.safe_load(paths["pytorchjob.yaml"].read_text())
        container = data["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
            "containers"][0]
        script: str = container["command"][2]
        return script
    run: str = yaml.safe_load(paths["skypilot.yaml"].read_text())["run"]
    return run


@pytest.mark.parametrize("kind", ["pytorchjob", "skypilot"])
def test_node_scripts_pass_bash_n_and_shellcheck(kind: str, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    """Oracle: bash's parser and shellcheck on the script each node runs."""
    for framework in ("megatron", "deepspeed"):
        script = tmp_path / f"{framework}-{kind}.sh"
        script.write_text("#!/usr/bin/env bash\n" + _node_script(
            _render(tmp_path, framework), kind))
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = request.getfixturevalue("shellcheck")  # skips outside CI, fails in CI
    lint = subprocess.run([shellcheck, "-f", "gcc", *sorted(map(str, tmp_path.glob("*.sh")))],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("kind", ["pytorchjob", "skypilot"])
def test_deepspeed_node_script_starts_the_rendered_torchrun(kind: str, tmp_path: Path) -> None:
    """Oracle: the argv a recording torchrun receives when bash runs the node script under the
    variables each platform sets (the Kubeflow operator's PET_NNODES/PET_NODE_RANK/MASTER_ADDR/
    MASTER_PORT; SkyPilot's SKYPILOT_NUM_NODES/SKYPILOT_NODE_RANK/SKYPILOT_NODE_IPS), worked
    out by hand: node 1 of 2, 8 processes, node 0 as master on port 6000, the program with its
    arguments and ds_config.json."""
    paths = _render(tmp_path, "deepspeed")
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text(RECORD)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    workdir = paths["ds_config.json"].parent
    manifest = yaml.safe_load(paths[f"{kind}.yaml"].read_text())
    if kind == "pytorchjob":
        container = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
            "containers"][0]
        env = {item["name"]: item["value"] for item in container["env"]}
        env.update(ARTIFACTS_DIR=str(workdir), PET_NNODES="2", PET_NODE_RANK="1",
                   MASTER_ADDR="job-master-0", MASTER_PORT="6000", WORLD_SIZE="2", RANK="1")
        master = "job-master-0"
    else:
        env = dict(manifest["envs"])
        env.update(SKYPILOT_NUM_NODES="2", SKYPILOT_NODE_RANK="1",
                   SKYPILOT_NODE_IPS="10.0.0.1\n10.0.0.2")
        master = "10.0.0.1"
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", RECORD_DIR=str(records))
    result = subprocess.run(["bash", "-c", _node_script(paths, kind)], env=env, cwd=workdir,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    argv = (records / "torchrun").read_bytes().decode().split("\0")[:-1]
    assert argv == [
        "--nproc_per_node", "8", "--nnodes", "2", "--node_rank", "1", "--master_addr", master,
        "--master_port", "6000", "train.py", "--data", "/d", "--deepspeed_config",
        f"{workdir}/ds_config.json",
    ]


def test_builtin_deepspeed_manifests_carry_sbatch_training_length(tmp_path: Path) -> None:
    """Oracle: bash running sbatch.sh's own TRAIN_TOKENS/TRAIN_ITERS lines. The manifests of a
    folder rendered with the built-in program train as long as sbatch.sh would (the program
    refuses to start without TRAIN_ITERS) on tokens.npy in the folder each platform mounts."""
    cfg = load_config("llama2-7b", "dgx-h100:2", framework="deepspeed")
    layout = Layout(dp=16, zero=2, gas=1024 // 16)
    paths = write_artifacts(cfg, layout, tmp_path / "builtin", program=BUILTIN_PROGRAM)
    lines = [line for line in paths["sbatch.sh"].read_text().splitlines()
             if line.startswith(("export TRAIN_TOKENS=", "export TRAIN_ITERS="))]
    iters = subprocess.run(["bash", "-c", "\n".join([*lines, 'echo "$TRAIN_ITERS"'])],
                           capture_output=True, text=True, check=True, env={}).stdout.strip()
    pod = yaml.safe_load(paths["pytorchjob.yaml"].read_text())["spec"]["pytorchReplicaSpecs"][
        "Master"]["template"]["spec"]["containers"][0]
    pod_env = {item["name"]: item["value"] for item in pod["env"]}
    sky_env = yaml.safe_load(paths["skypilot.yaml"].read_text())["envs"]
    assert int(iters) > 0
    assert pod_env["TRAIN_ITERS"] == sky_env["TRAIN_ITERS"] == iters
    assert pod_env["DATA_PATH"] == "/artifacts/tokens.npy"  # the volume holding this folder
    assert sky_env["DATA_PATH"] == "./tokens.npy"  # SkyPilot runs in the synced workdir
