"""Goodput of a long training job under failures: the best checkpoint interval, by Monte Carlo.

    >>> from trainsim.plan.goodput import GoodputConfig, goodput
    >>> cfg = GoodputConfig(step_s=10.0, gpus=16384, mtbf_gpu_hours=50_000.0, checkpoint_s=60.0,
    ...                     restart_s=600.0, steps=100_000)
    >>> r = goodput(cfg, samples=2000, seed=0)
    >>> 0.8 < r.goodput < 0.95, abs(r.interval_s / r.young_daly_interval_s - 1) < 0.15
    (True, True)

Model (one job, synchronous training: any failure stops every rank):

1. Failures arrive as a Poisson process while the job computes or writes a checkpoint, at the job rate
   ``lambda = gpus / mtbf_gpu + nodes / mtbf_node + gpus / mtbf_link`` (independent components with
   exponential lifetimes; ``nodes = ceil(gpus / gpus_per_node)``; one NIC link per GPU). No failure
   strikes while the job is down (restarting, restoring, waiting for a node).
2. The work (``steps * step_s`` seconds of compute) runs in segments of ``interval_s`` compute followed
   by a checkpoint write of ``checkpoint_s``; the last segment is shorter and also ends with a write.
3. A failure loses everything since the last completed checkpoint (a write in progress is lost too),
   then costs a downtime of ``restart_s + restore_s`` plus, for the node that failed:
   with no spares, ``repair_s`` (the job waits until its node is back); with spares, ``replace_s`` to
   swap one in while the failed node goes to repair for ``repair_s`` and then rejoins the spare pool.
   When every spare is in repair the job waits for the first one to come back (it never shrinks).
4. Monte Carlo: ``samples`` independent failure traces, vectorised over traces and candidate intervals
   (one numpy step per failure, not per trace); every candidate sees the same random draws (common random
   numbers), so differences between intervals are far less noisy than the times themselves.
5. Search: a log grid around the closed-form optimum, two refinements, and the vertex of a quadratic
   fit in ``log(interval)`` (near its minimum the expected time is ``~cosh`` in ``log(interval)``).

With a constant downtime (no spares, or no repair time) the expected time of a segment of length ``w``
is ``(exp(lambda w) - 1) (1/lambda + D)`` (Daly 2006, eq. 15 with failures not striking the downtime), so
the optimum interval does not depend on ``D`` and solves ``(1 - lambda tau) exp(lambda (tau + C)) = 1``;
Young (1974) approximates it by ``sqrt(2 C M)``, Daly (2006) adds higher-order terms.

References: J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
1974; J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), 2006; failure rates at scale: Llama 3 (Dubey et al. 2024, arXiv:2407.21783, §3.3.4),
419 unexpected interruptions in 54 days on 16,384 H100s, 58.7% of them GPU issues.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from trainsim.errors import UserError

Progress = Callable[[int, int], None]
HOUR_S = 3600.0
MONTH_S = 30 * 86400.0  # default job length: one month of compute
Z95 = 1.959964  # two-sided 95 % normal quantile
MAX_ROUNDS = 2_000_000  # failures per trace before we give up (the job would practically never finish)


@dataclass(frozen=True, kw_only=True, slots=True)
class GoodputConfig:
    """One job and its failure model; times in seconds, MTBFs in hours."""

    step_s: float
    """time of one training step without failures (``trainsim estimate``'s step_s)"""
    gpus: int
    """GPUs in the job"""
    gpus_per_node: int = 8
    """GPUs per host; a node failure stops its GPUs, a failed GPU takes its node out"""
    mtbf_gpu_hours: float
    """one GPU's mean time between failures (Llama 3: 16,384 GPUs, ~246 GPU issues in 54 days -> ~86,000 h)"""
    mtbf_node_hours: float | None = None
    """one host's (CPU, memory, PSU, SSD...) mean time between failures; None: hosts never fail"""
    mtbf_link_hours: float | None = None
    """one GPU's network link (NIC, cable, switch port); None: links never fail"""
    checkpoint_s: float
    """time to write one checkpoint (the job is stalled meanwhile)"""
    restore_s: float = 0.0
    """time to read the last checkpoint back after a failure"""
    restart_s: float
    """restart overhead per failure: detection, rescheduling, process start, process-group init"""
    spare_nodes: int = 0
    """healthy hosts kept aside to swap in for a failed one (at most the job's node count)"""
    replace_s: float = 0.0
    """time to swap a spare in (spares > 0 only)"""
    repair_s: float = 0.0
    """time until a failed node is back in service; with no spare free the job waits for it"""
    steps: int | None = None
    """training steps to run; None: one month of compute (30 days / step_s)"""
    interval_s: float | None = None
    """compute between checkpoints; None: search the best"""

    def __post_init__(self) -> None:
        for f in ("step_s", "checkpoint_s"):
            _check_number(f, getattr(self, f), positive=True)
        for f in ("restore_s", "restart_s", "replace_s", "repair_s"):
            _check_number(f, getattr(self, f), positive=False)
        _check_number("mtbf_gpu_hours", self.mtbf_gpu_hours, positive=True, what="hours (one GPU's MTBF)")
        for f in ("mtbf_node_hours", "mtbf_link_hours"):
            if getattr(self, f) is not None:
                _check_number(f, getattr(self, f), positive=True, what="hours, or None for never")
        for f, lo in (("gpus", 1), ("gpus_per_node", 1), ("spare_nodes", 0)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise UserError(f"{f}={v!r}; expected an integer >= {lo}")
        if self.spare_nodes > self.nodes:
            raise UserError(f"spare_nodes={self.spare_nodes} exceeds the job's {self.nodes} nodes "
                            f"({self.gpus} GPUs / {self.gpus_per_node} per node); expected at most {self.nodes}")  # fmt: skip
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1):
            raise UserError(f"steps={self.steps!r}; expected a positive integer or None (one month)")
        if self.interval_s is not None:
            _check_number("interval_s", self.interval_s, positive=True)
            if self.interval_s < self.checkpoint_s:
                raise UserError(f"interval_s={self.interval_s:g} is shorter than checkpoint_s={self.checkpoint_s:g}: "
                                "more time would go to saving than to training; expected interval_s >= checkpoint_s "
                                "(or no interval, to search the best)")  # fmt: skip

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def n_steps(self) -> int:
        return self.steps if self.steps is not None else max(1, math.ceil(MONTH_S / self.step_s))

    @property
    def work_s(self) -> float:
        """useful compute time of the whole job, seconds"""
        return self.n_steps * self.step_s

    @property
    def failure_rate_per_s(self) -> float:
        """job failure rate: the sum over its components of 1 / MTBF"""
        per_h = self.gpus / self.mtbf_gpu_hours
        if self.mtbf_node_hours is not None:
            per_h += self.nodes / self.mtbf_node_hours
        if self.mtbf_link_hours is not None:
            per_h += self.gpus / self.mtbf_link_hours
        return per_h / HOUR_S

    @property
    def job_mtbf_s(self) -> float:
        return 1.0 / self.failure_rate_per_s

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_number(name: str, v: object, *, positive: bool, what: str = "seconds") -> None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise UserError(f"{name}={v!r}; expected a {'positive' if positive else 'non-negative'} finite number of {what}")


# =============================================================================== closed forms
def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 C M)``, first order in ``C / M``."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006) eq. 37: ``sqrt(2CM) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C`` for ``C < 2M``, else ``M``."""
    c, m = checkpoint_s, mtbf_s
    if c >= 2 * m:
        return m
    r = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c


def exact_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """The ``tau`` minimising ``(exp((tau + C)/M) - 1) / tau``: root of ``(1 - x) e^(x + c) = 1``, x = tau/M.

    Newton on ``g(x) = c + x + log(1 - x)`` (decreasing, concave) from the right of the root
    (``sqrt(2c)`` bounds it: ``g = c - x^2/2 - x^3/3 - ...``) converges monotonically.
    """
    c = checkpoint_s / mtbf_s
    x = min(math.sqrt(2 * c), 1 - 1e-12)
    for _ in range(200):
        g = c + x + math.log1p(-x)
        step = g / (-x / (1 - x))
        x_new = x - step
        if not 0 < x_new < 1:
            x_new = x / 2
        if abs(x_new - x) <= 1e-15 * x:
            x = x_new
            break
        x = x_new
    return x * mtbf_s


def constant_downtime_s(cfg: GoodputConfig) -> float | None:
    """The downtime per failure when it does not depend on history (no spare pool to run dry), else None."""
    base = cfg.restart_s + cfg.restore_s
    if cfg.spare_nodes == 0:
        return base + cfg.repair_s
    if cfg.repair_s == 0:
        return base + cfg.replace_s
    return None


def expected_time_s(cfg: GoodputConfig, interval_s: float) -> float | None:
    """Closed-form expected wall time of the job (constant downtime only, else None).

    Each segment of length ``w`` takes ``(exp(lambda w) - 1)(1/lambda + D)`` on average: a geometric number
    of failed attempts, each losing the work done up to the failure plus ``D``, then one clean run.
    """
    d = constant_downtime_s(cfg)
    if d is None:
        return None
    lam = cfg.failure_rate_per_s
    n, w, w_last = _segments(cfg, interval_s)
    return float((n - 1) * math.expm1(lam * w) * (1 / lam + d) + math.expm1(lam * w_last) * (1 / lam + d))


def _segments(cfg: GoodputConfig, interval_s: float) -> tuple[int, float, float]:
    """(number of segments, length of a full one, length of the last one), checkpoint writes included."""
    work = cfg.work_s
    n = max(1, math.ceil(work / interval_s - 1e-9))
    return n, interval_s + cfg.checkpoint_s, work - (n - 1) * interval_s + cfg.checkpoint_s


# =============================================================================== Monte Carlo
def simulate(
    cfg: GoodputConfig, intervals_s: np.ndarray | list[float], *, samples: int, seed: int | list[int] = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Wall time to finish the job and number of failures, shape ``(len(intervals_s), samples)``.

    One loop round per failure, over the flattened (interval, trace) pairs still running; trace ``i``
    takes the ``i``-th draw of each round whatever the interval (common random numbers).
    """
    taus = np.atleast_1d(np.asarray(intervals_s, dtype=np.float64))
    k, n_tr = taus.size, int(samples)
    if n_tr < 1:
        raise UserError(f"samples={samples!r}; expected a positive integer")
    segs = [_segments(cfg, float(t)) for t in taus]
    n_seg = np.array([s[0] for s in segs], np.float64)
    w = np.array([s[1] for s in segs])
    w_last = np.array([s[2] for s in segs])
    lam = cfg.failure_rate_per_s
    if float(lam * w.min()) > 50:  # exp(50) failed attempts per segment: it never finishes
        raise UserError(f"the job fails every {cfg.job_mtbf_s:.3g} s on average, far more often than one checkpoint "
                        f"segment ({w.min():.3g} s) can complete; expected a job MTBF of at least a segment")  # fmt: skip
    rng = np.random.default_rng(seed)
    base = cfg.restart_s + cfg.restore_s
    spares = cfg.spare_nodes
    fixed = base + (cfg.replace_s if spares else cfg.repair_s)
    # at most repair_s / fixed + 1 nodes can be in repair at once (each failure is followed by >= fixed s down)
    pool = spares if fixed <= 0 else min(spares, int(cfg.repair_s // fixed) + 1)
    t = np.zeros(k * n_tr)
    done = np.zeros(k * n_tr)  # completed segments
    fails = np.zeros(k * n_tr, np.int64)
    ret = np.full((k * n_tr, pool), -np.inf) if pool else None  # when each spare slot is free again
    cfg_of = np.repeat(np.arange(k), n_tr)
    idx = np.arange(k * n_tr)
    for _ in range(MAX_ROUNDS):
        if not idx.size:
            break
        x = rng.exponential(1.0 / lam, size=n_tr)[idx % n_tr]  # running time to the next failure
        c = cfg_of[idx]
        left = (n_seg[c] - 1 - done[idx]) * w[c] + w_last[c]
        fin = x >= left
        t[idx[fin]] += left[fin]
        keep = ~fin
        idx, x, c = idx[keep], x[keep], c[keep]
        done[idx] += np.floor(x / w[c])
        t_fail = t[idx] + x
        fails[idx] += 1
        if ret is None:
            t[idx] = t_fail + fixed
        else:
            slot = ret[idx].argmin(axis=1)
            wait = np.maximum(0.0, ret[idx, slot] - t_fail)
            ret[idx, slot] = t_fail + cfg.repair_s
            t[idx] = t_fail + wait + fixed
    else:
        raise UserError(f"more than {MAX_ROUNDS} failures in one trace; the job (MTBF {cfg.job_mtbf_s:.3g} s) "
                        "would practically never finish")  # fmt: skip
    return t.reshape(k, n_tr), fails.reshape(k, n_tr)


def best_interval_s(
    cfg: GoodputConfig, *, samples: int = 10_000, seed: int = 0, progress: Progress | None = None
) -> tuple[float, list[tuple[float, float]]]:
    """The interval with the least expected time to train, and every (interval_s, mean time s) evaluated.

    1. A log grid of 9 intervals over [tau0 / 10, tau0 * 10], tau0 the closed-form optimum, clipped to
       [max(checkpoint_s, step_s), work]; shifted while its minimum sits on an unclipped edge.
    2. Two refinements: 9 points between the best point's neighbours, then 7 over +-20 % of the vertex.
    3. The vertex of a least-squares quadratic in ``log(interval)`` through the points of the last bracket.
    """
    lo, hi = max(cfg.checkpoint_s, cfg.step_s), max(cfg.work_s, cfg.checkpoint_s, cfg.step_s)
    mtbf = cfg.job_mtbf_s
    hi = min(hi, max(lo, 30 * mtbf))  # beyond, a segment would practically never complete
    tau0 = min(max(exact_interval_s(cfg.checkpoint_s, mtbf), lo), hi)
    seen: dict[float, float] = {}

    def run(taus: np.ndarray) -> np.ndarray:
        taus = np.unique(np.clip(taus, lo, hi))
        new = np.array([x for x in taus if float(x) not in seen])
        if new.size:
            tt, _ = simulate(cfg, new, samples=samples, seed=[seed, 0])
            for x, m in zip(new, tt.mean(axis=1), strict=True):
                seen[float(x)] = float(m)
        return taus

    grid = run(tau0 * np.logspace(-1, 1, 9))
    for _ in range(3):  # shift the grid while its minimum sits on an edge that is not a bound
        i = int(np.argmin([seen[float(x)] for x in grid]))
        if 0 < i < grid.size - 1 or grid.size == 1 or not lo * (1 + 1e-12) < grid[i] < hi * (1 - 1e-12):
            break
        grid = run(grid[i] * np.logspace(-1, 1, 9))
    if progress:
        progress(1, 4)
    i = int(np.argmin([seen[float(x)] for x in grid]))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    best = _vertex(run(np.geomspace(a, b, 9)), seen, a, b)
    if progress:
        progress(2, 4)
    a, b = max(lo, best / 1.2), min(hi, best * 1.2)
    best = _vertex(run(np.geomspace(a, b, 7)), seen, a, b)
    if progress:
        progress(3, 4)
    return best, sorted(seen.items())


def _vertex(grid: np.ndarray, seen: dict[float, float], a: float, b: float) -> float:
    """Minimum of a quadratic fit in log(interval) over the evaluated points in [a, b]; argmin if not convex."""
    pts = np.array([x for x in seen if a * (1 - 1e-12) <= x <= b * (1 + 1e-12)])
    ys = np.array([seen[float(x)] for x in pts])
    arg = float(pts[int(np.argmin(ys))]) if pts.size else float(grid[0])
    if pts.size < 3 or a == b:
        return arg
    u = np.log(pts)
    c2, c1, _ = np.polyfit(u - u.mean(), ys / ys.mean(), 2)
    if c2 <= 0:
        return arg
    return float(np.clip(math.exp(u.mean() - c1 / (2 * c2)), a, b))


# =============================================================================== the answer
@dataclass(frozen=True, slots=True)
class Goodput:
    """What ``trainsim goodput`` prints."""

    config: GoodputConfig
    interval_s: float
    """the interval evaluated: the one given, or the best found"""
    searched: bool
    goodput: float
    """useful compute / expected wall time (0-1)"""
    goodput_ci95: tuple[float, float]
    time_to_train_s: float
    """expected wall time to run ``steps`` steps"""
    time_to_train_ci95: tuple[float, float]
    """95 % confidence interval of that expectation (normal approximation over the traces)"""
    time_to_train_p05_p95: tuple[float, float]
    """spread of single runs: 5th and 95th percentiles"""
    failures_mean: float
    job_mtbf_s: float
    young_daly_interval_s: float
    daly_interval_s: float
    exact_interval_s: float
    """closed-form optimum (constant downtime); the MC optimum should agree"""
    young_daly_goodput: float
    """Monte Carlo goodput when checkpointing every ``young_daly_interval_s``"""
    closed_form_time_s: float | None
    """closed-form expected time at ``interval_s`` (constant downtime only)"""
    samples: int
    seed: int
    seconds: float
    evaluated: tuple[tuple[float, float], ...]
    """(interval_s, mean time s) of every interval the search tried"""

    @property
    def interval_steps(self) -> int:
        return max(1, round(self.interval_s / self.config.step_s))

    def to_json(self) -> dict[str, object]:
        return {
            "goodput": self.goodput, "goodput_ci95": list(self.goodput_ci95),
            "best_interval_s": self.interval_s if self.searched else None, "interval_s": self.interval_s,
            "interval_steps": self.interval_steps, "young_daly_interval_s": self.young_daly_interval_s,
            "daly_interval_s": self.daly_interval_s, "exact_interval_s": self.exact_interval_s,
            "young_daly_goodput": self.young_daly_goodput,
            "time_to_train_s": self.time_to_train_s, "time_to_train_days": self.time_to_train_s / 86400,
            "time_to_train_ci95_s": list(self.time_to_train_ci95),
            "time_to_train_p05_p95_s": list(self.time_to_train_p05_p95),
            "closed_form_time_s": self.closed_form_time_s, "failures_mean": self.failures_mean,
            "job_mtbf_s": self.job_mtbf_s, "work_s": self.config.work_s, "steps": self.config.n_steps,
            "nodes": self.config.nodes, "samples": self.samples, "seed": self.seed, "seconds": self.seconds,
            "config": self.config.to_json(),
            "evaluated": [{"interval_s": x, "time_s": y} for x, y in self.evaluated],
        }  # fmt: skip


def goodput(cfg: GoodputConfig, *, samples: int = 10_000, seed: int = 0, progress: Progress | None = None) -> Goodput:
    """Expected goodput and time to train at ``cfg.interval_s``, or at the best interval when it is None.

    The search and the final estimate use independent random streams, so the reported confidence
    interval is not biased by having picked the interval on the same draws.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise UserError(f"samples={samples!r}; expected an integer >= 2")
    t0 = time.perf_counter()
    mtbf = cfg.job_mtbf_s
    yd = young_interval_s(cfg.checkpoint_s, mtbf)
    evaluated: list[tuple[float, float]] = []
    if cfg.interval_s is None:
        tau, evaluated = best_interval_s(cfg, samples=samples, seed=seed, progress=progress)
    else:
        tau = cfg.interval_s
    yd_eval = max(yd, cfg.checkpoint_s)
    tt, ff = simulate(cfg, [tau, yd_eval], samples=samples, seed=[seed, 1])
    if progress:
        progress(4, 4)
    work = cfg.work_s
    t, n = tt[0], samples
    mean = float(t.mean())
    half = Z95 * float(t.std(ddof=1)) / math.sqrt(n)
    lo_t, hi_t = mean - half, mean + half
    return Goodput(
        config=cfg, interval_s=float(tau), searched=cfg.interval_s is None,
        goodput=work / mean, goodput_ci95=(work / hi_t, work / lo_t if lo_t > 0 else 1.0),
        time_to_train_s=mean, time_to_train_ci95=(lo_t, hi_t),
        time_to_train_p05_p95=(float(np.percentile(t, 5)), float(np.percentile(t, 95))),
        failures_mean=float(ff[0].mean()), job_mtbf_s=mtbf, young_daly_interval_s=yd,
        daly_interval_s=daly_interval_s(cfg.checkpoint_s, mtbf),
        exact_interval_s=exact_interval_s(cfg.checkpoint_s, mtbf), young_daly_goodput=work / float(tt[1].mean()),
        closed_form_time_s=expected_time_s(cfg, tau), samples=n, seed=seed, seconds=time.perf_counter() - t0,
        evaluated=tuple(evaluated),
    )  # fmt: skip


def closed_form_goodput(cfg: GoodputConfig, interval_s: float | None = None) -> float:
    """Goodput from the closed form at ``interval_s`` (default: the exact optimum); spares treated as never
    running dry. Cheap enough to rank many plans (``trainsim plan --goodput``)."""
    tau = interval_s if interval_s is not None else max(exact_interval_s(cfg.checkpoint_s, cfg.job_mtbf_s), cfg.step_s)
    lam = cfg.failure_rate_per_s
    d = constant_downtime_s(cfg)
    if d is None:
        d = cfg.restart_s + cfg.restore_s + cfg.replace_s
    n, w, w_last = _segments(cfg, tau)
    return cfg.work_s / ((n - 1) * math.expm1(lam * w) * (1 / lam + d) + math.expm1(lam * w_last) * (1 / lam + d))
