"""Fit the cost model's kernel and link constants to microbenchmark points; screen the nodes.

Each constant is fitted to the points of the formula it appears in, through the model's own
functions, so a residual is the model's error on that kernel:

- GEMMs (training dtype): `gemm_efficiency`, `gemm_half_size` in
  `autotune.costmodel.kernels.gemm_efficiency` (least squares on log time);
- causal attention forward+backward: `attention_efficiency` (3 × forward causal FLOPs at that
  fraction of the peak, as `kernels.layer_times` charges it);
- elementwise add: `hbm_efficiency` (bytes over the device's memory bandwidth);
- the first touch of fresh tensors (CPU workers): `first_touch_s_per_gb`
  (`autotune.costmodel.eager.first_touch_s`); a CPU GEMM whose output is mapped afresh pays it
  beside its FLOPs;
- the eager layer ops (CPU workers): `eager_efficiency`, `eager_op_s` in
  `autotune.costmodel.eager` (bytes at that fraction of the fitted bandwidth plus a cost per
  dispatched op);
- collectives and sends within a node: `nvlink_efficiency`, `latency_base_s`, `latency_intra_s`
  in `autotune.costmodel.collectives` (`collective_s`, `all_to_all_s`, `send_s`); across nodes
  also `comm_efficiency`, `latency_inter_s`; for CPU workers also each op's bus bandwidth
  relative to the all-reduce's (`all_gather_bandwidth`, `reduce_scatter_bandwidth`,
  `all_to_all_bandwidth`: gloo's ops differ, NCCL's do not).

On GPUs the datasheet figures (peak, HBM, NVLink, NIC) stay and the efficiencies are fitted
against them. CPU workers have no datasheet: their figures become the measured ones (fastest
GEMM, fastest elementwise bandwidth, fastest collective bus bandwidth) and the efficiencies
what the other points reach of them.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from autotune.calibration.file import FittedConstant
from autotune.calibration.file import Point
from autotune.calibration.file import Screening
from autotune.calibration.file import WorkerRate
from autotune.calibration.file import screening_rate
from autotune.costmodel.collectives import all_to_all_s
from autotune.costmodel.collectives import collective_s
from autotune.costmodel.collectives import send_s
from autotune.costmodel.constants import Constants
from autotune.costmodel.eager import eager_time
from autotune.costmodel.eager import first_touch_s
from autotune.costmodel.kernels import gemm_efficiency
from autotune.specs import AutotuneConfig

SCREEN_MARGIN = 0.2
"""A worker or link this far below the median of its peers is named slow."""
KERNEL_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (1e-3, 1.0),
    "gemm_half_size": (1.0, 1e5),
    "attention_efficiency": (1e-3, 1.0),
    "hbm_efficiency": (1e-3, 1.0),
    "eager_efficiency": (1e-3, 1.0),
    "eager_op_s": (0.0, 1e-3),
    "first_touch_s_per_gb": (0.0, 100.0),
    "nvlink_efficiency": (1e-3, 1.0),
    "comm_efficiency": (1e-3, 1.0),
    "latency_base_s": (0.0, 0.1),
    "latency_intra_s": (0.0, 0.1),
    "latency_inter_s": (0.0, 0.1),
    "all_gather_bandwidth": (0.05, 4.0),
    "reduce_scatter_bandwidth": (0.05, 4.0),
    "all_to_all_bandwidth": (0.05, 4.0),
}
"""Ranges the microbenchmark fits may move a constant in: the fields' physical ranges (an
efficiency in (0, 1]), wider than the GPU-plausible `FIT_BOUNDS` of the step-time fit."""
OP_BANDWIDTH = {"all_gather_bandwidth": ("all_gather",),
                "reduce_scatter_bandwidth": ("reduce_scatter",),
                "all_to_all_bandwidth": ("all_to_all", "send_recv")}
"""The per-op bus bandwidth constants (relative to the all-reduce's) and the ops that identify
them, fitted for CPU workers (gloo) only."""


def point_key(p: Point) -> tuple[Any, ...]:
    """What makes two points the same measurement on different workers."""
    return (p.kind, p.op, p.dtype, tuple(sorted(p.shape.items())),
            tuple(p.ranks) if p.kind in ("collective", "send") else ())


def merged(points: Sequence[Point]) -> list[Point]:
    """One point per kernel and shape: the median over workers (per-worker points stay in the
    file for screening)."""
    groups: dict[tuple[Any, ...], list[Point]] = defaultdict(list)
    for p in points:
        groups[point_key(p)].append(p)
    out = []
    for group in groups.values():
        seconds = statistics.median(p.seconds for p in group)
        ranks = sorted({r for p in group for r in p.ranks})
        out.append(group[0].model_copy(update={
            "seconds": seconds, "rate": group[0].rate * group[0].seconds / seconds,
            "ranks": ranks}))
    return out


def _residual_stats(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    errors = np.abs(predicted / measured - 1)
    return float(np.median(errors)), float(np.max(errors))


def _fit(names: Sequence[str], base: Constants, predict: Callable[[Constants], np.ndarray],
         measured: np.ndarray, weights: np.ndarray | None = None
         ) -> tuple[Constants, dict[str, FittedConstant], np.ndarray]:
    """Least squares on log(predicted / measured) over `names`, within KERNEL_BOUNDS; each
    point's log residual times its weight (default 1)."""
    scale = np.ones(len(measured)) if weights is None else weights
    low = np.array([KERNEL_BOUNDS[n][0] for n in names])
    high = np.array([KERNEL_BOUNDS[n][1] for n in names])
    start = np.clip([float(getattr(base, n)) for n in names], low, high)

    def constants(x: np.ndarray) -> Constants:
        return base.model_copy(update=dict(zip(names, map(float, x), strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        ratio: np.ndarray = np.log(np.maximum(predict(constants(x)), 1e-30) / measured) * scale
        return ratio

    result = least_squares(residuals, start, bounds=(low, high), x_scale="jac")
    fitted = constants(result.x)
    predicted = predict(fitted)
    median, worst = _residual_stats(predicted, measured)
    out = {}
    for name, value, lo, hi in zip(names, result.x, low, high, strict=True):
        side = ("lower" if value - lo <= 1e-9 + 1e-3 * abs(lo) else
                "upper" if hi - value <= 1e-9 + 1e-3 * abs(hi) else None)
        out[name] = FittedConstant(value=float(value), before=float(getattr(base, name)),
                                   points=len(measured), median_residual=median,
                                   max_residual=worst, at_bound=side)
    return fitted, out, predicted


def _with_prediction(points: list[Point], predicted: np.ndarray) -> list[Point]:
    return [p.model_copy(update={"predicted_s": float(s)})
            for p, s in zip(points, predicted, strict=True)]


def measured_figures(cfg: AutotuneConfig, points: Sequence[Point]) -> AutotuneConfig:
    """For CPU workers: the cluster with the measured figures (peak of the training dtype =
    the workers' median fastest screening round, the n³ GEMM into a kept output that
    `autotune.specs.inputs.cpu_matmul_tflops` times without a calibration, else the fastest
    GEMM; HBM = fastest elementwise; link = fastest collective bus bandwidth); GPUs keep
    their datasheet. The GEMM and attention efficiencies are fitted against that peak: a
    linear layer's forward and backward into fresh outputs reach a fraction of it."""
    if not cfg.cluster.cpu_processes:
        return cfg
    precision = cfg.train.precision
    gemm = [p.rate for p in points if p.kind == "gemm" and p.dtype == precision]
    screens = [max(p.repeats or [p.rate]) for p in points
               if p.kind == "screen" and p.dtype == precision]
    memory = [p.rate for p in points if p.kind == "elementwise"]
    gpu = cfg.cluster.gpu
    update: dict[str, Any] = {}
    if screens or gemm:
        peak = statistics.median(screens) if screens else max(gemm)
        update["peak_tflops"] = {**gpu.peak_tflops, precision: peak / 1e12}
    if memory:
        update["hbm_tb_s"] = max(memory) / 1e12
    cluster: dict[str, Any] = {"gpu": gpu.model_copy(update=update)}
    for name, across in (("intra_node_gb_s", False), ("inter_node_gb_s", True)):
        rate = link_gb_s(cfg, points, across=across)
        if rate is not None:
            cluster[name] = rate
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update=cluster)})


def link_gb_s(cfg: AutotuneConfig, points: Sequence[Point], *, across: bool) -> float | None:
    """The fastest collective bus bandwidth or send rate measured within a node (or, `across`,
    over ranks of several nodes), GB/s; None when no such point was measured."""
    rates = [p.rate for p in points if p.kind in ("collective", "send")
             and spans_nodes(cfg, p.ranks) == across]
    return max(rates) / 1e9 if rates else None


def spans_nodes(cfg: AutotuneConfig, ranks: Sequence[int]) -> bool:
    """Whether the ranks sit on more than one node (ranks numbered node by node, as the
    workers are started)."""
    return len({r // cfg.cluster.gpus_per_node for r in ranks}) > 1


def fit_kernels(cfg: AutotuneConfig, points: Sequence[Point], base: Constants
                ) -> tuple[dict[str, FittedConstant], list[Point]]:
    """Fit the constants each kind of point identifies (module docstring); returns them and
    every point with the fitted model's time (`predicted_s`)."""
    gpu = cfg.cluster.gpu
    precision = cfg.train.precision if cfg.train.precision != "fp8" else "bf16"
    peak = gpu.peak_tflops[precision] * 1e12
    fitted: dict[str, FittedConstant] = {}
    k = base
    out: list[Point] = []
    pts = merged(points)

    touch = [p for p in pts if p.kind == "touch"]
    if touch:
        nbytes = np.array([p.shape["bytes"] for p in touch], dtype=float)
        measured = np.array([p.seconds for p in touch])
        k, found, predicted = _fit(("first_touch_s_per_gb",), k,
                                   lambda c: first_touch_s(nbytes, c), measured)
        fitted.update(found)
        out += _with_prediction(touch, predicted)

    gemms = [p for p in pts if p.kind == "gemm" and p.dtype == precision]
    if len(gemms) >= 2:
        m, n, kk = (np.array([p.shape[d] for p in gemms], dtype=float) for d in "mnk")
        measured = np.array([p.seconds for p in gemms])
        passes = np.array([3.0 if p.op == "linear" else 1.0 for p in gemms])
        # a CPU worker's fresh outputs of 32 MiB or more are mapped anew at every call: the
        # forward's (m × n) and, for a linear layer's backward, its two gradients' (as
        # `kernels.layer_times` charges them)
        cpu = 4.0 if cfg.cluster.cpu_processes else 0.0
        fresh = [cpu * m * n, cpu * m * kk * (passes > 1), cpu * n * kk * (passes > 1)]
        k, found, predicted = _fit(
            ("gemm_efficiency", "gemm_half_size"), k,
            lambda c: (passes * 2 * m * n * kk / (peak * gemm_efficiency(m, n, kk, c))
                       + sum(first_touch_s(f, c) for f in fresh)), measured,
            gemm_weights(measured) if cfg.cluster.cpu_processes else None)
        fitted.update(found)
        out += _with_prediction(gemms, predicted)

    attention = [p for p in pts if p.kind == "attention"]
    if attention:
        flops = np.array([p.rate * p.seconds for p in attention])
        measured = np.array([p.seconds for p in attention])
        dtype = attention[0].dtype if attention[0].dtype in gpu.peak_tflops else precision
        attention_peak = gpu.peak_tflops[dtype] * 1e12
        k, found, predicted = _fit(("attention_efficiency",), k,
                                   lambda c: flops / (attention_peak * c.attention_efficiency),
                                   measured)
        fitted.update(found)
        out += _with_prediction(attention, predicted)

    memory = [p for p in pts if p.kind == "elementwise"]
    if memory:
        moved = np.array([p.shape["bytes"] for p in memory], dtype=float)
        measured = np.array([p.seconds for p in memory])
        hbm = gpu.hbm_tb_s * 1e12
        k, found, predicted = _fit(("hbm_efficiency",), k,
                                   lambda c: moved / (hbm * c.hbm_efficiency), measured)
        fitted.update(found)
        out += _with_prediction(memory, predicted)

    layer_ops = [p for p in pts if p.kind == "eager"]
    if len(layer_ops) >= 2:
        moved = np.array([p.shape["bytes"] for p in layer_ops], dtype=float)
        ops = np.array([p.shape["ops"] for p in layer_ops], dtype=float)
        measured = np.array([p.seconds for p in layer_ops])
        bandwidth = gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
        k, found, predicted = _fit(
            ("eager_efficiency", "eager_op_s"), k,
            lambda c: eager_time(moved, ops, bandwidth, c), measured)
        fitted.update(found)
        out += _with_prediction(layer_ops, predicted)

    comm = [p for p in pts if p.kind in ("collective", "send")]
    if comm:
        across = cfg.cluster.nodes > 1
        names = ["nvlink_efficiency", "latency_base_s", "latency_intra_s"]
        names += ["comm_efficiency", "latency_inter_s"] if across else []
        if cfg.cluster.cpu_processes:  # gloo's ops differ in bus bandwidth (NCCL's do not)
            names += [name for name, ops in OP_BANDWIDTH.items()
                      if any(p.op in ops and p.shape["bytes"] >= 1 << 20 for p in comm)]
        measured = np.array([p.seconds for p in comm])
        k, found, predicted = _fit(names, k, lambda c: comm_seconds(cfg, comm, c), measured)
        fitted.update(found)
        out += _with_prediction(comm, predicted)
    predicted_s = {point_key(p): p.predicted_s for p in out}
    return fitted, [p.model_copy(update={"predicted_s": predicted_s.get(point_key(p))})
                    for p in points]


def gemm_weights(seconds: np.ndarray) -> np.ndarray:
    """CPU workers' GEMM points weighted by the square root of their time over the median's:
    one curve cannot follow both a skinny GEMM whose call overhead dominates (a MoE router's
    N = 4 experts reaches a tenth of the rate of the others) and the layers' GEMMs where the
    step's time goes, so the fit follows the time (the router's points weigh about a tenth
    of the output layer's)."""
    weights: np.ndarray = np.sqrt(seconds / np.median(seconds))
    return weights


def comm_seconds(cfg: AutotuneConfig, points: Sequence[Point], k: Constants) -> np.ndarray:
    """The model's time of each collective or send point (`autotune.costmodel.collectives`)."""
    per_node = np.array([float(cfg.cluster.gpus_per_node)])
    times = []
    for p in points:
        nbytes = np.array([float(p.shape["bytes"])])
        ranks = np.array([float(len(p.ranks))])
        if p.kind == "send":
            times.append(send_s(nbytes, np.array([spans_nodes(cfg, p.ranks)]), cfg, k)[0])
        elif p.op == "all_to_all":
            times.append(all_to_all_s(nbytes, ranks, per_node, cfg, k)[0])
        else:
            times.append(collective_s(p.op, nbytes, ranks, per_node, cfg, k)[0])  # type: ignore[arg-type]
    return np.array(times, dtype=float)


def _relative(rates: dict[tuple[int, ...], float],
              kind: Callable[[tuple[int, ...]], object] = lambda key: None
              ) -> dict[tuple[int, ...], float]:
    """Each rate over the median of the others of its `kind` (its peers)."""
    out = {}
    for key, rate in rates.items():
        peers = [r for other, r in rates.items() if other != key and kind(other) == kind(key)]
        out[key] = rate / statistics.median(peers) if peers else 1.0
    return out


def worker_repeats(points: Sequence[Point]) -> dict[int, list[float]]:
    """Each worker's GEMM rates to screen: the rounds of its screening GEMM; in a file without
    screening points, its rates at the three largest shapes every worker ran."""
    screens = [p for p in points if p.kind == "screen"]
    if screens:
        return {p.ranks[0]: list(p.repeats or [p.rate]) for p in screens}
    gemm: dict[int, dict[tuple[int, ...], float]] = defaultdict(dict)
    for p in points:
        if p.kind == "gemm":
            gemm[p.ranks[0]][tuple(sorted(p.shape.values()))] = p.rate
    common = set.intersection(*(set(g) for g in gemm.values())) if gemm else set()
    top = sorted(common, key=lambda s: float(np.prod(s)))[-3:]
    return {r: [g[s] for s in top] for r, g in gemm.items()} if top else {}


def screen(points: Sequence[Point], hosts: dict[int, str],
           margin: float = SCREEN_MARGIN) -> Screening:
    """Per-worker GEMM rate (`worker_repeats`, `screening_rate`), per node (the median of its
    workers), per-link send bandwidth at the largest message; each relative to the median of
    its peers (a node: the other nodes; a link between nodes: the other links between nodes).
    A worker below its peers by less than twice the workers' median spread is not named
    (`Screening.noise`): two equal workers timed with 10 % noise differ by that much; a link
    likewise by less than twice the links' median spread over their rounds
    (`Screening.link_noise`)."""
    repeats = worker_repeats(points)
    workers = []
    noise = 0.0
    if repeats:
        figures: dict[tuple[int, ...], tuple[float, float]] = {
            (r,): screening_rate(values) for r, values in sorted(repeats.items())}
        rates, noise = _rates_and_noise(figures)
        workers = [WorkerRate(ranks=list(key), host=hosts.get(key[0], ""), rate=rates[key],
                              relative=rel, spread=figures[key][1])
                   for key, rel in _relative(rates).items()]
    nodes = _nodes(workers)
    sends = [p for p in points if p.kind == "send"]
    links = []
    link_noise = 0.0
    if sends:
        biggest = max(p.shape["bytes"] for p in sends)
        # each link's rounds as the workers' (a file without rounds: its one rate, no spread)
        timed = {tuple(p.ranks): screening_rate(p.repeats) if p.repeats else (p.rate, 0.0)
                 for p in sends if p.shape["bytes"] == biggest}
        rates, link_noise = _rates_and_noise(timed)

        def across(key: tuple[int, ...]) -> bool:  # links between nodes have their own peers
            return len({hosts.get(r, "") for r in key}) > 1

        links = [WorkerRate(ranks=list(key), host=hosts.get(key[0], ""), rate=rate,
                            relative=rel, spread=timed[key][1], across_nodes=across(key))
                 for (key, rate), rel
                 in zip(rates.items(), _relative(rates, across).values(), strict=True)]
    return Screening(margin=margin, noise=noise, workers=workers, nodes=nodes, links=links,
                     link_noise=link_noise)


def _rates_and_noise(figures: dict[tuple[int, ...], tuple[float, float]]
                     ) -> tuple[dict[tuple[int, ...], float], float]:
    """Each worker's or link's rate from its (rate, spread), and the noise bar: twice the
    median spread (two equal peers timed with that noise differ by about as much)."""
    rates = {key: rate for key, (rate, _) in figures.items()}
    return rates, 2 * statistics.median(spread for _, spread in figures.values())


def _nodes(workers: Sequence[WorkerRate]) -> list[WorkerRate]:
    """Each node's median worker GEMM rate, relative to the median of the other nodes (none for
    one node): a node slow as a whole is then named once, not as each of its workers."""
    by_host: dict[str, list[WorkerRate]] = defaultdict(list)
    for worker in workers:
        by_host[worker.host].append(worker)
    if len(by_host) < 2:
        return []
    ranks = {host: tuple(sorted(r for w in group for r in w.ranks))
             for host, group in by_host.items()}
    rates = {ranks[host]: statistics.median(w.rate for w in group)
             for host, group in by_host.items()}
    relative = _relative(rates)
    return [WorkerRate(ranks=list(ranks[host]), host=host, rate=rates[ranks[host]],
                       relative=relative[ranks[host]]) for host in by_host]
