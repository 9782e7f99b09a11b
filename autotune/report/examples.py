"""Regenerate the example reports in `reports/`: `python -m autotune.report.examples`.

Each simulate example runs a seeded study (`autotune.search.study.tune` with the simulate runner in
noise mode), sweeps the winner over 1 to 128 nodes (`autotune.scaling.sweep`), and writes the
report; `comparison/` then compares every example folder present, including the local CPU study
that `--with-local` runs (real timings, so not deterministic). The simulate examples are
deterministic but for the study journal and the rendered configs' library versions;
`tests/report_tests` checks every example against its own study.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import sys
import warnings
from pathlib import Path

from autotune.layout import Layout
from autotune.report.compare import compare
from autotune.report.data import write_run_json
from autotune.report.render import write_report
from autotune.runners.base import Runner
from autotune.scaling import sweep
from autotune.search.settings import TuneSettings
from autotune.search.study import default_study_name
from autotune.search.study import tune
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

REPORTS = Path(__file__).resolve().parents[2] / "reports"
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
"""Sweep sizes of the simulate examples, in nodes."""
LOCAL = "local-cpu-tiny-gpt"
COMPARISON = "comparison"
STUDY_LOG = "study.journal"
"""The examples keep their study in an Optuna journal file (text, no SQLite heartbeat wait)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One example study and sweep."""

    name: str
    model: str
    cluster: str
    framework: str = "megatron"
    trials: int = 30
    seed: int = 0
    noise: float = 0.1
    runner_seed: int = 7
    mode: str = "strong"
    nodes: tuple[int, ...] = NODES


EXAMPLES = {
    e.name: e
    for e in (
        Example("simulate-llama3-70b-dgx-h100-16", "llama3-70b", "dgx-h100:16"),
        Example("simulate-llama3-70b-dgx-a100-16", "llama3-70b", "dgx-a100:16"),
    )
}
"""The simulate examples, by folder name."""


def strip_machine_paths(folder: Path) -> None:
    """Rewrite the folder's text files without this machine's paths (the folder itself becomes
    `.`, the repository `.`, the interpreter `python`, the home folder `~`), so committed examples
    carry nothing of the machine that made them."""
    home = str(Path.home())
    replacements = [(str(folder.resolve()), "."), (str(REPORTS.parent.resolve()), "."),
                    (sys.executable, "python"), (str(Path(sys.executable).resolve()), "python"),
                    (home, "~")]
    replacements.sort(key=lambda pair: -len(pair[0]))
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        changed = text
        for old, new in replacements:
            changed = changed.replace(old, new)
        if changed != text:
            path.write_text(changed)


def _runner(example: Example) -> Runner:
    from autotune.runners.simulate import SimulateRunner

    return SimulateRunner(noise=example.noise, seed=example.runner_seed)


def generate(example: Example, out: Path) -> Path:
    """Run the example's study and sweep into out/<name> (replaced) and write its report."""
    folder = out / example.name
    if folder.exists():
        shutil.rmtree(folder)
    cfg = load_config(example.model, example.cluster, framework=example.framework)
    space = load_space(None, example.framework)
    runner = _runner(example)
    storage = f"journal:{folder / STUDY_LOG}"
    write_run_json(
        folder, study_name=default_study_name(cfg), storage=storage,
        runner=runner.name, runner_options={"noise": example.noise, "seed": example.runner_seed},
        options={"trials": example.trials, "seed": example.seed, "top_k": 5},
        command=f"python -m autotune.report.examples --only {example.name}",
    )
    options = TuneSettings(trials=example.trials, seed=example.seed, storage=storage)
    result = tune(cfg, space, runner, options, folder)
    if result.ranked:
        best = Layout(**result.ranked[0]["layout_fields"])
        gpus = [n * cfg.cluster.gpus_per_node for n in example.nodes]
        sweep(cfg, best, gpus, example.mode, runner, folder)  # type: ignore[arg-type]
    write_report(folder)
    strip_machine_paths(folder)
    return folder


LOCAL_SPACE = SearchSpace(
    name="local-cpu", tp=[1, 2], pp=[1, 2], cp=[1], zero=[0, 1, 2], offload=["none"],
    mbs=[1, 2, 4], recompute=["none"], sp=[False],
)
"""A small DeepSpeed space that CPU processes on gloo run in seconds per trial."""


def generate_local(out: Path, processes: int = 4, trials: int = 6) -> Path:
    """The real local CPU study (b): tiny-gpt on `local` CPU processes (DeepSpeed on gloo),
    then a weak sweep of the winner over 1, 2 and 4 processes."""
    from autotune.runners.local import LocalRunner

    folder = out / LOCAL
    if folder.exists():
        shutil.rmtree(folder)
    cfg = load_config("tiny-gpt", "local", processes=processes, framework="deepspeed",
                      seq_length=128, global_batch_size=16)
    runner = LocalRunner(steps=8, warmup=3, threads=1, hang_timeout_s=300,
                         startup_timeout_s=900)
    storage = f"journal:{folder / STUDY_LOG}"
    write_run_json(
        folder, study_name=default_study_name(cfg), storage=storage, runner=runner.name,
        runner_options={"steps": 8, "warmup": 3, "threads": 1, "launcher": "torchrun"},
        options={"trials": trials, "seed": 0, "top_k": 3},
        command="python -m autotune.report.examples --with-local --only local",
    )
    # measure every trial to the end
    options = TuneSettings(trials=trials, seed=0, storage=storage, top_k=3, pruner_tolerance=1.0)
    result = tune(cfg, LOCAL_SPACE, runner, options, folder)
    if result.ranked:
        best = Layout(**result.ranked[0]["layout_fields"])
        sizes = [n for n in (1, 2, 4) if n <= processes]
        sweep(cfg, best, sizes, "weak", runner, folder)
    write_report(folder)
    strip_machine_paths(folder)
    return folder


def comparison(out: Path) -> Path:
    """Compare every example folder present under out into out/comparison."""
    folders = [out / name for name in [*EXAMPLES, LOCAL] if (out / name / "summary.json").exists()]
    target = out / COMPARISON
    compare(folders, target)
    return target


def main(argv: list[str] | None = None) -> None:
    """Command line: regenerate all (or --only NAME) examples and the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPORTS, help="reports folder")
    parser.add_argument("--only", action="append", default=[],
                        help=f"example name ({', '.join(EXAMPLES)}, local or comparison)")
    parser.add_argument("--with-local", action="store_true",
                        help="also run the real local CPU study (needs the local runner)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = args.only or [*EXAMPLES, *(["local"] if args.with_local else []), COMPARISON]
    for name in chosen:
        if name in EXAMPLES:
            print(f"wrote {generate(EXAMPLES[name], args.out)}")
        elif name == "local":
            print(f"wrote {generate_local(args.out)}")
        elif name != COMPARISON:
            parser.error(f"--only {name!r}: choose from {', '.join(EXAMPLES)}, local, comparison")
    if COMPARISON in chosen:
        print(f"wrote {comparison(args.out)}")


if __name__ == "__main__":
    main()
