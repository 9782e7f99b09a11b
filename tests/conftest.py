"""Shared test setup: a fixed DeepSpeed op cache so JIT builds happen once per machine, the
shellcheck command, megatron-core's parallel state on gloo, and a stand-in Megatron-LM
checkout."""

from __future__ import annotations

import os
import shutil
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "autotune" / "torch_extensions")
)


@pytest.fixture(scope="module")
def model_parallel() -> Iterator[None]:
    """megatron-core's parallel state on gloo, world size 1 (what CPU trials use)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


FAKE_PRETRAIN = """
import os, sys, time
from datetime import datetime

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
args = sys.argv[1:]

def last(flag, default):
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    return values[-1] if values else default

iters, gbs = int(last("--train-iters", "10")), int(last("--global-batch-size", "8"))
for iteration in range(1, iters + 1):
    time.sleep(0.05)
    if os.environ.get("FAKE_NAN") and iteration == 3:
        raise RuntimeError(
            f"Rank {rank}: found NaN in local grad norm for bucket #0 in backward pass before "
            "data-parallel communication collective. Device: 0, node: localhost")
    if rank == world - 1:
        log_string = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
        log_string += ' iteration {:8d}/{:8d} |'.format(iteration, iters)
        log_string += ' consumed samples: {:12d} |'.format(iteration * gbs)
        log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(100.0 + iteration)
        log_string += f' throughput per GPU (TFLOP/s/GPU): {0.5:.1f} |'
        log_string += f' learning rate: {1e-4:.6E} |'
        log_string += f' global batch size: {gbs:5d} |'
        log_string += ' {}: {:.6E} |'.format('lm loss', 9.2)
        log_string += f' loss scale: {1.0:.1f} |'
        log_string += ' number of skipped iterations: {:3d} |'.format(0)
        log_string += ' number of nan iterations: {:3d} |'.format(0)
        print(log_string, flush=True)
    if iteration == 1:
        string = '(after 1 iterations)' + ' memory (MB)'
        string += f" | allocated: {100.0 * (rank + 1):.2f}"
        string += f" | max allocated: {200.0 * (rank + 1):.2f}"
        string += f" | reserved: {300.0:.2f}"
        string += f" | max reserved: {300.0:.2f}"
        print("[Rank {}] {}".format(rank, string), flush=True)
"""


@pytest.fixture
def fake_megatron_lm(tmp_path: Path) -> Path:
    """A stand-in Megatron-LM checkout for CPU machines (the real pretrain_gpt.py needs CUDA):
    its pretrain_gpt.py prints log lines in the exact format of Megatron-LM's training_log and
    report_memory, one iteration per 50 ms (FAKE_NAN=1: the NaN error of iteration 3)."""
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text(textwrap.dedent(FAKE_PRETRAIN))
    return checkout
@pytest.fixture
def shellcheck() -> str:
    """The shellcheck command. CI installs it (.ci/run), so there a missing one fails the test;
    elsewhere (the CI variable unset) the test is skipped, saying so."""
    path = shutil.which("shellcheck")
    if path is None and os.environ.get("CI"):
        pytest.fail("shellcheck is not installed; CI lints the rendered scripts with it "
                    "(.ci/run installs the Debian package shellcheck)")
    if path is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); outside CI the "
                    "lint is skipped, in CI (CI set) it fails")
    return path
