"""The CLI contract: exit 2 with one line naming the option and the fix for bad input, exit 1
when the work fails, tracebacks only with --debug; one regression test per hostile input found.

Every test goes through `autotune.cli.app._run`, the function the console script calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers_cli import assert_usage_error
from helpers_cli import cli

H100_NODE = {
    "nodes": 1, "gpus_per_node": 8, "intra_node_gb_s": 450, "inter_node_gb_s": 50,
    "host_memory_gb": 2048, "pcie_gb_s": 64,
    "gpu": {"memory_gb": 80, "peak_tflops": {"bf16": 989.4}, "hbm_tb_s": 3.35},
}
"""DGX H100 figures (presets/clusters.yaml), written out as a cluster YAML."""
ESTIMATE = ("estimate", "-m", "llama3-8b", "-c", "dgx-h100:1")


def _yaml(tmp_path: Path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _cluster(tmp_path: Path, **changes: object) -> str:
    data = json.loads(json.dumps(H100_NODE))
    for key, value in changes.items():
        if key.startswith("gpu."):
            data["gpu"][key[4:]] = value
        else:
            data[key] = value
    return _yaml(tmp_path, "cluster.yaml", data)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (ESTIMATE, ("Missing option '--layout'", "autotune estimate --help")),
        (("tune", "-m", "llama3-8b", "-c", "dgx-h100:1", "--trials", "0"), ("--trials 0",)),
        (("tune", "-m", "llama3-8b", "-c", "dgx-h100:1", "--seq", "abc"), ("'--seq'",)),
        (("space", "-m", "llama3-8b", "-c", "dgx-h100:1", "--bogus"), ("--bogus",)),
        (("space", "-m", "llama3-8b", "-c", "dgx-h100:1", "--seq", str(10**20)),
         ("--seq 100000000000000000000", "at most 16,777,216")),
        (("tune", "-m", "llama3-8b", "-c", "dgx-h100:1", "--timeout", "nan"), ("--timeout nan",)),
        (("tune", "-m", "llama3-8b", "-c", "dgx-h100:1", "--noise", "-1"), ("--noise -1.0",)),
        (("scale", "-m", "llama3-8b", "-c", "dgx-h100:1", "-l", "tp=8", "--gpus", "8,x"),
         ("--gpus", "'x' is not a GPU count")),
        (("tune", "-m", "llama3-8b", "-c", "dgx-h100:1", "--scale", "--scale-mode", "wide"),
         ("--scale-mode 'wide'",)),
        (("space", "-m", "llama3-8b", "-c", "dgx-h100:1", "--framework", "jax"),
         ("--framework 'jax'", "megatron", "deepspeed")),
        (("tune", "-m", "llama3-8b", "-c", "dgx-h100:1", "--runner", "ssh"),
         ("--runner 'ssh'", "simulate, command, local, slurm")),
        (("space", "-m", "mixtral-8x7b", "-c", "dgx-h100:1", "--moe-dispatcher", "deepep"),
         ("--moe-dispatcher 'deepep'", "alltoall", "flex")),
        (("space", "-m", "mixtral-8x7b", "-c", "dgx-h100:1", "--framework", "deepspeed",
          "--moe-dispatcher", "flex"), ("moe_token_dispatcher 'flex' is Megatron's",
                                        "use 'alltoall' with deepspeed")),
    ],
)
def test_usage_errors_exit_2_in_one_line(args: tuple[str, ...], fragments: tuple[str, ...]):
    """Oracle: the contract (exit 2, one `error:` line naming the option). Before the fix every
    one of these ended in a traceback (typer's own exceptions, OverflowError past int64)."""
    assert_usage_error(cli(*args), *fragments)


def test_no_arguments_prints_help_and_exits_2() -> None:
    """Oracle: click's convention for a group run without a command (help, exit 2)."""
    result = cli()
    assert result.code == 2 and "Commands" in result.out and result.err == ""


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"gpu.peak_tflops": {"bf16": -989}}, ("peak_tflops.bf16 = -989", "greater than 0")),
        ({"gpu.peak_tflops": {"bf16": 0}}, ("peak_tflops.bf16 = 0",)),
        ({"gpu.peak_tflops": {"bf16": float("nan")}}, ("finite",)),
        ({"gpu.hbm_tb_s": float("inf")}, ("hbm_tb_s = inf", "finite")),
        ({"gpu.memory_gb": 10**30}, ("memory_gb", "at most")),
        ({"intra_node_gb_s": -1}, ("intra_node_gb_s = -1",)),
        ({"nodes": True}, ("nodes = True", "not true/false")),
        ({"gpus_per_node": 2.5}, ("gpus_per_node = 2.5", "valid integer")),
        ({"nodes": 10**30}, ("nodes", "at most 65,536")),
        ({"gpu": [1, 2]}, ("gpu: [1, 2] is neither a preset nor a mapping",)),
        ({"gpu.peak_tflops": {}}, ("peak_tflops", "at least 1 item")),
    ],
)
def test_cluster_yaml_figures_are_finite_positive_and_bounded(
    tmp_path: Path, changes: dict[str, object], fragments: tuple[str, ...]
) -> None:
    """Oracle: a peak of -989 TFLOP/s printed −579,299 tokens/s, 0 printed inf/NaN, `gpu: [1, 2]`
    raised TypeError, `nodes: true` was read as 1 node; each is now refused with its field."""
    cluster = _cluster(tmp_path, **changes)
    assert_usage_error(cli("estimate", "-m", "llama3-8b", "-c", cluster, "-l", "tp=8"),
                       "cluster.yaml", *fragments)


def test_binary_model_file(tmp_path: Path) -> None:
    """Oracle: bytes 0-255 are not UTF-8 (0x80 is a continuation byte), so the file is no YAML."""
    path = tmp_path / "model.yaml"
    path.write_bytes(bytes(range(256)))
    assert_usage_error(cli("estimate", "-m", path, "-c", "dgx-h100:1", "-l", "tp=8"),
                       "model.yaml: not a text file")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("tp=8,tp=4", ("tp is given twice", "give each key once")),
        ("tp=8,gas=5", ("gas=5 contradicts", "derived: 512")),
        ("vpp=" + "9" * 25, ("vpp=", "(25 characters)", "an integer from 1 to 16,384")),
        ("tp=2,dp=3", ("dp=3 contradicts", "derived: 4")),
        ("zero=4", ("zero=4 exceeds 3",)),
        ("mbs=1024", ("mbs=1,024 exceeds 512", "the global batch")),
        ("tp=٣", ("tp='٣'",)),
    ],
)
def test_layout_text_is_read_strictly(text: str, fragments: tuple[str, ...]) -> None:
    """Oracle: worked by hand for llama3-8b on 8 GPUs, global batch 512: with tp=8 (dp=1, mbs=1)
    gas is 512/(1·1) = 512; with tp=2 dp is 8/2 = 4. Duplicates and contradictions used to be
    ignored silently, vpp=10**25 overflowed int64, an Arabic-Indic digit passed isdigit()."""
    assert_usage_error(cli(*ESTIMATE, "-l", text), "--layout", *fragments)


def test_error_is_one_line_and_quotes_a_shortened_value() -> None:
    """Oracle: a 100,000-character layout used to be echoed whole over 1,253 wrapped lines."""
    text = "x" * 100_000
    result = cli(*ESTIMATE, "-l", text)
    assert_usage_error(result, "--layout: cannot read", "(100,000 characters)")
    assert len(result.err) < 400


def test_structurally_impossible_layout_is_refused_naming_the_rule() -> None:
    """Oracle: llama3-8b has 32 layers; pp=16 × vpp=3 = 48 chunks would leave chunks without a
    layer, which no Megatron split (even split, accounted embedding/loss, first/last stage
    flags, --pipeline-model-parallel-layout) builds (the estimate used to print an MFU of
    617 % and negative memory for such layouts)."""
    result = cli("estimate", "-m", "llama3-8b", "-c", "dgx-h100:16", "-l", "tp=2,pp=16,vpp=3",
                 "--json")
    assert_usage_error(result, "layers_divisible_by_pp_vpp", "num_layers (32)", "16·3")
    assert result.out == ""


def test_layout_that_only_runs_out_of_memory_is_estimated_and_marked() -> None:
    """Oracle: llama3-70b (70.6 B parameters) without ZeRO on 8 A100-80GB keeps 2 + 4 + 12 =
    18 bytes of states per parameter sharded only by tp=8: 70.6e9 · 18 / 8 / 2**30 = 148 GiB,
    far above 80 GiB, while the layout itself is well formed."""
    args = ("estimate", "-m", "llama3-70b", "-c", "dgx-a100:1", "-l", "tp=8,zero=0")
    as_json = cli(*args, "--json")
    assert as_json.code == 0, as_json.err
    data = json.loads(as_json.out)
    assert data["feasible"] is False
    assert [v["rule"] for v in data["violations"]] == ["memory_fits"]
    assert data["peak_memory_bytes"] / 2**30 > 148
    table = cli(*args)
    assert table.code == 0 and "INFEASIBLE (memory_fits)" in table.out
    assert table.out.rstrip().endswith("infeasible")


@pytest.mark.parametrize(
    ("flag", "make", "fragments"),
    [
        ("--out", lambda p: p / "file", ("is a file; give a folder",)),
        ("--out", lambda p: p / "file" / "sub", ("cannot create", "Not a directory")),
        ("--storage", lambda p: "journal:/proc/autotune/j.log", ("cannot open the journal",)),
        ("--storage", lambda p: f"journal:{p}", ("Is a directory",)),
        ("--storage", lambda p: "nonsense", ("is not a storage URL",)),
    ],
)
def test_unusable_output_places(tmp_path: Path, flag: str, make, fragments) -> None:
    """Oracle: the operating system (a file is no folder, /proc takes no new files, a folder is
    no journal file); each used to end in FileExistsError/FileNotFoundError tracebacks."""
    (tmp_path / "file").write_text("")
    target = make(tmp_path)
    args = ["tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--trials", "1", "--out",
            tmp_path / "run"]
    args = [*args, flag, target] if flag == "--storage" else [*args[:-2], flag, target]
    assert_usage_error(cli(*args), flag, *fragments)


def test_work_failure_exits_1(tmp_path: Path) -> None:
    """Oracle: a command that exits 3 measures nothing, so no trial (no sweep size) ran ok: the
    work failed (1), the input was fine (not 2)."""
    result = cli("tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--runner", "command",
                 "--command", "exit 3 # {trial_dir}", "--trials", "2", "--out", tmp_path)
    assert result.code == 1, result.err
    assert result.error_lines[-1].startswith("error: no trial measured a throughput")
    assert "Traceback" not in result.err
    sweep = cli("scale", "-m", "tiny-gpt", "-c", "dgx-h100:1", "-l", "tp=1", "--gpus", "8",
                "--runner", "command", "--command", "exit 3 # {trial_dir}", "--out",
                tmp_path / "sweep")
    assert sweep.code == 1, sweep.err
    assert sweep.error_lines[-1].startswith("error: no size of the sweep measured a throughput")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    """Oracle: the contract (--debug re-raises what would be one line)."""
    with pytest.raises(Exception, match="tp is given twice"):
        cli("--debug", *ESTIMATE, "-l", "tp=8,tp=4")


@pytest.mark.parametrize(
    "changes",
    [{"num_layers": True}, *({field: 10**30} for field in (
        "num_layers", "hidden_size", "ffn_hidden_size", "vocab_size",
        "max_position_embeddings"))],
)
def test_model_yaml_numbers_are_strict_and_bounded(tmp_path: Path, changes: dict) -> None:
    """Oracle: `num_layers: true` was read as 1 layer and 10**30 in any integer field
    overflowed int64 (OverflowError)."""
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
             **changes}
    path = _yaml(tmp_path, "m.yaml", model)
    assert_usage_error(cli("estimate", "-m", path, "-c", "dgx-h100:1", "-l", "tp=1"),
                       next(iter(changes)))


def test_report_and_compare_refuse_damaged_folders(tmp_path: Path) -> None:
    """Oracle: the JSON grammar (`{not json` is none) and the file types; both commands used to
    end in JSONDecodeError or TypeError tracebacks."""
    for name, file, text in (("a", "run.json", "{not json"), ("b", "scaling.json", "[1, 2]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / file).write_text(text)
    assert_usage_error(cli("report", tmp_path / "a"), "a/run.json is not valid JSON")
    assert_usage_error(cli("report", tmp_path / "b"), "b/scaling.json holds a JSON list")
    assert_usage_error(cli("compare", tmp_path / "b", tmp_path / "a", "--out", tmp_path / "c"),
                       "b/scaling.json holds a JSON list")
    assert_usage_error(cli("report", tmp_path / "missing"), "is not a folder")
