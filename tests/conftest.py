"""Shared test setup: a fixed DeepSpeed op cache so JIT builds happen once per machine."""

from __future__ import annotations

import os
import socket
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
