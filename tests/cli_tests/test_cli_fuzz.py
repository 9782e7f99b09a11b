"""Fuzz the CLI with hostile inputs through its real entry point: never a traceback, and the
exit code is exactly 0 (the input made sense) or 2 (one line naming what is wrong).

Inputs: model, cluster and search-space YAML files, Hugging Face config.json files, --layout
strings and the training flags of `space`, `estimate` and `tune --runner simulate`. Each example
runs `autotune.cli.app._run`, the function the console script calls; a few run as real processes.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from helpers_cli import Result
from helpers_cli import cli
from helpers_cli import cli_process
from hypothesis import HealthCheck
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=60, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_names = itertools.count()

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
HUGE = st.sampled_from([0, -1, 2**31, 2**63, 10**30, -(10**30)])
"""Integers at and past the edges of int32/int64."""
SMALL_INT = st.integers(-(2**16), 2**16)
FLOAT = st.floats(allow_nan=True, allow_infinity=True)
SCALAR_SMALL = st.none() | st.booleans() | SMALL_INT | FLOAT | TEXT
SCALAR = SCALAR_SMALL | HUGE | st.integers()
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)
VALUE_SMALL = st.recursive(SCALAR_SMALL, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)
PLAUSIBLE = st.sampled_from([1, 2, 4, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096])
"""Values that make sense for most fields, so that many examples get past validation."""

CLUSTER = {"nodes": 1, "gpus_per_node": 8, "intra_node_gb_s": 450, "inter_node_gb_s": 50,
           "host_memory_gb": 2048, "pcie_gb_s": 64,
           "gpu": {"memory_gb": 80, "peak_tflops": {"bf16": 989.4, "fp32": 494.7},
                   "hbm_tb_s": 3.35}}
MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1000,
         "max_position_embeddings": 1024}
HF = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
      "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 512,
      "vocab_size": 1000, "max_position_embeddings": 1024, "hidden_act": "silu"}
LAYOUT_KEYS = ["tp", "pp", "cp", "vpp", "zero", "offload", "mbs", "recompute", "sp", "dp", "gas"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def check(result: Result) -> None:
    """The contract for input that is not a failure of the work."""
    assert "Traceback" not in result.err + result.out, result.err[-3000:]
    assert result.code in (0, 2), (result.code, result.err[-3000:])
    event(f"exit {result.code}")
    if result.code == 2:
        assert len(result.error_lines) == 1, result.err
        assert result.error_lines[0].startswith("error: ")
        assert len(result.error_lines[0]) < 1100


def rarely(strategy: st.SearchStrategy, otherwise: object) -> st.SearchStrategy:
    """`strategy` one time in four, else `otherwise`."""
    return st.one_of(st.just(otherwise), st.just(otherwise), st.just(otherwise), strategy)


def mutated(base: dict, values: st.SearchStrategy) -> st.SearchStrategy:
    """`base` with some fields replaced by `values`, some dropped, some unknown ones added, or
    the whole document replaced."""

    def apply(changes: dict, dropped: list, extra: dict) -> dict:
        doc = {k: v for k, v in base.items() if k not in dropped}
        doc.update(changes)
        doc.update(extra)
        return doc

    keys = sorted(base)
    nested = [k for k in keys if isinstance(base[k], dict)]
    document = st.builds(
        apply,
        st.dictionaries(st.sampled_from(keys), st.one_of(PLAUSIBLE, PLAUSIBLE, values),
                        max_size=3),
        rarely(st.lists(st.sampled_from(keys), min_size=1, max_size=2), []),
        rarely(st.dictionaries(TEXT, values, min_size=1, max_size=1), {}),
    )
    if nested:
        inner = st.sampled_from(nested).flatmap(
            lambda k: mutated(base[k], values).map(lambda v: {**base, k: v}))
        document = document | inner
    return st.one_of(document, document, document, values)  # a whole document one time in 4


def write(folder: Path, suffix: str, document: object, raw: bytes | None = None) -> Path:
    path = folder / f"input{next(_names)}{suffix}"
    if raw is not None:
        path.write_bytes(raw)
    elif suffix == ".json":
        path.write_text(json.dumps(document))
    else:
        path.write_text(yaml.safe_dump(document, allow_unicode=True))
    return path


@FUZZ
@given(document=mutated(CLUSTER, VALUE), raw=rarely(st.binary(max_size=64), None))
def test_cluster_yaml(workdir: Path, document: object, raw: bytes | None) -> None:
    """Oracle: the contract (0 or one-line 2, never a traceback) for any cluster file."""
    path = write(workdir, ".yaml", document, raw)
    check(cli("estimate", "-m", "tiny-gpt", "-c", path, "-l", "tp=1", "--seq", "128"))


@FUZZ
@given(document=mutated(MODEL, VALUE), raw=rarely(st.binary(max_size=64), None))
def test_model_yaml(workdir: Path, document: object, raw: bytes | None) -> None:
    """Oracle: the contract, for any model file (ModelSpec's bounded numbers included)."""
    path = write(workdir, ".yaml", document, raw)
    check(cli("space", "-m", path, "-c", "dgx-h100:1", "--top", "1", "--json"))


@FUZZ
@given(document=mutated(HF, VALUE))
def test_huggingface_config(workdir: Path, document: object) -> None:
    """Oracle: the contract, for Hugging Face config.json files."""
    path = write(workdir, ".json", document)
    check(cli("estimate", "-m", path, "-c", "dgx-h100:1", "-l", "tp=1", "--json"))


SPACE = {"tp": [1, 2], "pp": [1, 2], "cp": [1], "vpp": [1], "zero": [0, 1], "mbs": [1, 2],
         "offload": ["none"], "recompute": ["none", "full"], "sp": [True, False]}


@settings(max_examples=40, deadline=None, print_blob=True)
@given(document=mutated(SPACE, st.one_of(VALUE, st.lists(SCALAR, max_size=3))))
def test_search_space_yaml(workdir: Path, document: object) -> None:
    """Oracle: the contract, for --space files (a tp of 10**21 used to overflow int64)."""
    path = write(workdir, ".yaml", document)
    check(cli("space", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--space", path, "--top", "1"))


NUMBER_TEXT = st.one_of(PLAUSIBLE.map(str), PLAUSIBLE.map(str), SMALL_INT.map(str),
                        HUGE.map(str), st.integers().map(str), TEXT)
WORDS = st.sampled_from(["on", "off", "none", "selective", "full", "optimizer"])
PAIR = st.builds(lambda k, v: f"{k}={v}", st.one_of(*[st.sampled_from(LAYOUT_KEYS)] * 4, TEXT),
                 st.one_of(st.sampled_from(["1", "2", "4", "8"]), WORDS, NUMBER_TEXT))


@settings(max_examples=100, deadline=None, print_blob=True)
@given(text=st.one_of(*[st.lists(PAIR, max_size=5).map(",".join)] * 4, TEXT))
def test_layout_strings(text: str) -> None:
    """Oracle: the contract, for --layout of estimate on 16 GPUs (llama3-8b)."""
    check(cli("estimate", "-m", "llama3-8b", "-c", "dgx-h100:2", "-l", text, "--json"))


FLAG_VALUES = {
    "--seq": NUMBER_TEXT, "--gbs": NUMBER_TEXT, "--processes": NUMBER_TEXT,
    "--precision": st.sampled_from(["bf16", "fp16", "fp8", "fp32"]) | TEXT,
    "--framework": st.sampled_from(["megatron", "deepspeed"]) | TEXT,
    "--space": st.sampled_from(["megatron", "deepspeed"]) | TEXT,
}
TUNE_VALUES = {
    "--trials": st.integers(-2, 2).map(str) | HUGE.map(str) | TEXT,
    "--top-k": NUMBER_TEXT, "--jobs": NUMBER_TEXT, "--seed": NUMBER_TEXT,
    "--noise": FLOAT.map(str) | TEXT, "--timeout": FLOAT.map(str) | TEXT,
    "--runner": st.just("simulate") | TEXT, "--scale-gpus": NUMBER_TEXT,
}


def _flags(values: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """Some of the flags, each with a value."""
    return st.fixed_dictionaries({}, optional=values)


@settings(max_examples=80, deadline=None, print_blob=True)
@given(command=st.sampled_from(["space", "estimate"]), flags=_flags(FLAG_VALUES),
       cluster=st.sampled_from(["dgx-h100:1", "local", "dgx-a100:2"]))
def test_training_flags(command: str, flags: dict[str, str], cluster: str) -> None:
    """Oracle: the contract, for the training flags of space and estimate."""
    args = [command, "-m", "tiny-gpt", "-c", cluster, "--json"]
    if command == "estimate":
        flags.pop("--space", None)
        args += ["-l", "tp=1"]
    check(cli(*args, *itertools.chain.from_iterable(flags.items())))


@settings(max_examples=25, deadline=None, print_blob=True)
@given(flags=_flags({**FLAG_VALUES, **TUNE_VALUES}))
def test_tune_flags(workdir: Path, flags: dict[str, str]) -> None:
    """Oracle: the contract, for tune with the simulate runner (at most 2 trials)."""
    trials = flags.get("--trials", "1")
    if trials.lstrip("-").isdigit() and 0 < int(trials) <= 2**16:
        flags["--trials"] = str(min(int(trials), 2))
    out = workdir / f"tune{next(_names)}"
    check(cli("tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--runner", "simulate", "--out", out,
              "--json", *itertools.chain.from_iterable(flags.items())))


@pytest.mark.parametrize(
    "args",
    [
        ("estimate", "-m", "tiny-gpt", "-c", "dgx-h100:1", "-l", "tp=1," * 20_000),
        ("space", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--seq", str(10**40)),
        ("tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--noise", "inf"),
        ("estimate", "-m", "/dev/null/x", "-c", "dgx-h100:1", "-l", "tp=1"),
    ],
)
def test_real_process(args: tuple[str, ...]) -> None:
    """Oracle: the contract, as a user's shell sees it (python -m autotune.cli, exit status)."""
    result = cli_process(*args)
    assert result.code == 2 and "Traceback" not in result.err, result.err[-2000:]
    assert len(result.error_lines) == 1 and result.error_lines[0].startswith("error: ")

