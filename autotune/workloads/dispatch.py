"""What eager PyTorch runs for a piece of a model: its elementwise ops and the bytes it saves.

`ElementwiseCount` is a `TorchDispatchMode` that sees every ATen op the code dispatches and
counts the ones that are neither GEMMs (mm, addmm, bmm, attention kernels) nor views, with
the bytes of the tensors each reads and writes: the unfused elementwise traffic that
`autotune.costmodel.eager` charges CPU workers for, and what the calibration's eager
microbenchmark reports beside its time. `saved_bytes` sums what autograd keeps for the
backward (`torch.autograd.graph.saved_tensors_hooks`), each storage once, parameters left out.

Example:
    >>> import torch
    >>> with ElementwiseCount() as count:
    ...     _ = torch.ones(4) + torch.ones(4)
    >>> count.ops, count.bytes
    (1, 48)
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GEMM_PREFIXES = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product", "_flash_attention",
                 "_efficient_attention")
"""ATen ops that are GEMMs or attention kernels (timed by their own microbenchmarks)."""
NO_TRAFFIC = ("_unsafe_view", "ones", "ones_like", "zeros", "zeros_like", "empty",
              "empty_like", "full", "randn", "rand")
"""Ops that move no data although ATen does not mark them views (`_unsafe_view` aliases its
input), and those that make a tensor from nothing (a test's seeds)."""


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class ElementwiseCount(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the elementwise ops dispatched inside it and the bytes they read and write."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops = 0
        self.bytes = 0
        self.names: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in NO_TRAFFIC or name.startswith(GEMM_PREFIXES):
            return out
        moved = _tensors((args, kwargs)) + _tensors(out)
        self.ops += 1
        self.bytes += sum(x.numel() * x.element_size() for x in moved)
        self.names[name] = self.names.get(name, 0) + 1
        return out


def saved_bytes(run: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes autograd saves for the backward of what `run` computes: every saved tensor's
    storage counted once, the storages of `exclude` (the parameters) left out."""
    storages: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        storage = x.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        run()
    for x in exclude:
        storages.pop(x.untyped_storage().data_ptr(), None)
    return sum(storages.values())
