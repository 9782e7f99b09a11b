"""The token file the built-in DeepSpeed program trains on (`--train-script builtin`).

One documented format: a NumPy `.npy` file holding a 1-D array of unsigned integer token ids
(uint16 or uint32), the tokenized corpus concatenated (documents separated by the tokenizer's
end-of-text id), as `np.save("tokens.npy", np.asarray(ids, dtype=np.uint32))` writes it. It is
opened memory-mapped (`np.load(..., mmap_mode="r")`), so it may be larger than memory; sample i
of a run is the window of seq + 1 tokens starting at (i mod windows)·seq.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from autotune.exceptions import AutotuneError

DTYPES = (np.uint16, np.uint32)
"""Token id types the file may hold."""


def open_tokens(path: Path, vocab: int, seq: int) -> npt.NDArray[np.unsignedinteger]:
    """The memory-mapped token ids of `path`, checked.

    Raises:
        AutotuneError: the file is missing, not a 1-D uint16/uint32 `.npy` array, shorter than
            one sequence, or holds an id the model's vocabulary does not (naming the fix).
    """
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise AutotuneError(
            f"DATA_PATH: cannot read {path} as a .npy token file ({error}); write it with "
            "np.save('tokens.npy', np.asarray(ids, dtype=np.uint32))"
        ) from None
    if tokens.ndim != 1 or tokens.dtype not in DTYPES:
        raise AutotuneError(
            f"DATA_PATH: {path} holds a {tokens.ndim}-D {tokens.dtype} array; the built-in "
            "program reads a 1-D uint16 or uint32 array of token ids"
        )
    if len(tokens) < seq + 1:
        raise AutotuneError(
            f"DATA_PATH: {path} holds {len(tokens):,} tokens, fewer than one sequence of "
            f"{seq:,} + 1; tokenize more text"
        )
    top = int(tokens.max())
    if top >= vocab:
        raise AutotuneError(
            f"DATA_PATH: {path} holds token id {top:,}, beyond the model's vocabulary of "
            f"{vocab:,}; tokenize with the model's tokenizer"
        )
    return tokens


def window(tokens: npt.NDArray[np.unsignedinteger], sample: int, seq: int) -> np.ndarray:
    """Sample `sample`'s seq + 1 tokens (inputs and the labels shifted by one), as int64."""
    windows = (len(tokens) - 1) // seq
    start = (sample % windows) * seq
    return np.asarray(tokens[start:start + seq + 1], dtype=np.int64)
