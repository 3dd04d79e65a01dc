"""What a robust-aggregation hook adds to a data-parallel step, predicted from generic calibrations.

    >>> from trainsim.testbed.calibrate import calibrate
    >>> from trainsim.run.robust_cost import predict_overhead, time_collectives, time_rules
    >>> cal = calibrate(world=4, allgather_sizes=[16 << 10, 256 << 10, 1 << 20])   # doctest: +SKIP
    >>> coll = time_collectives(4, [16 << 10, 256 << 10, 1 << 20])                 # doctest: +SKIP
    >>> rules = time_rules(4, ops=True)                                             # doctest: +SKIP
    >>> predict_overhead("median", 85_002, cal, rules, coll=coll).total_us         # doctest: +SKIP

The hook replaces one all-reduce of the bucket (S bytes) by an all-gather of S bytes per rank and then
combines the rows on every rank. Its extra time per step, for one bucket that nothing overlaps, is the
larger of two bounds:

    wire = [allgather(S) - allreduce(S)] + share * compute(rule, S)          (the ranks wait for the link)
    cpu  = share * ([cpu_allgather(S) - cpu_allreduce(S)] + compute(rule, S))  (the ranks wait for cores)

1. ``allgather(S)`` and ``allreduce(S)``: wall times, ``Calibration.allgather_us`` and
   ``Calibration.predict_us`` of a ``trainsim.testbed.calibrate`` run on the same link and world size,
   at its own generic sizes;
2. ``cpu_allgather(S)``, ``cpu_allreduce(S)``: the CPU time (every thread of a rank: the poster, gloo's
   threads, the waiter that completes the hook's future, the kernel's socket work) that one rank spends
   per call of each primitive as the hooks issue it (future, ``then``, wait), from ``time_collectives``:
   4 ranks on the same link at generic sizes (powers of 2 and 4 bytes), interpolated in log-log. On gloo
   over emulated links the socket work is most of it: the all-gather sends and receives ``world - 1``
   whole buckets per rank where the ring all-reduce moves ``2 (world - 1) / world`` of one;
3. ``compute``: ``time_rules`` times each rule (``robust.aggregate`` and the copy into the bucket) at a
   generic grid of sizes (powers of 2 elements, never the model's), one thread per core all timing at
   once, each on rows flushed from the caches before every call (``RuleTimes.corun``): in a run the
   rows arrive from the sockets and every core computes, and the rule's CPU time there is several times
   its time alone with warm caches (docs/log/robust.md); Zeno's rule
   is priced in parts (``zeno_parts``) under the same conditions: its Python machinery, timed on a
   skeleton of the model (every ``Linear`` made 1 x 1: the same modules and parameter tensors, none of
   the arithmetic) in one process per core at once, caches flushed before every call; ``world + 1``
   forward passes and the per-row arithmetic from an op-cost table timed the same way (``time_ops``:
   GEMMs and adds at generic sizes, ``RuleTimes.ops``), but the first pass over each row (it arrives
   from the sockets) at the bandwidth that each core gets while all stream (``RuleTimes.stream_gbps``);
   the kept rows' average and the copy into the bucket as the ``mean`` rule's time;
4. ``share``: ``max(1, world / cores)``. In the link-bound estimate the rule starts on every rank at
   once, when the same gather completes, so the ranks share the cores while it runs: its wall time is
   ``share`` times its CPU time. With more ranks than cores the host is saturated, so every millisecond
   of CPU that a rank adds lengthens the step by ``world / cores`` of a millisecond, wherever in the step
   the rank spends it (measurements in docs/log/robust.md).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

RULE_SIZES = tuple(2**k for k in range(10, 22))
"""numel grid of ``time_rules``: 1,024 .. 2,097,152 elements per rank, every power of 2: the time per
element jumps between 262,144 and 1,048,576 elements (docs/log/robust.md), which a grid of powers of 4
left to the interpolation"""
TIMED_RULES = ("mean", "median", "trimmed_mean", "krum")


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleTimes:
    """Per rule, the median time (µs) of combining ``world`` rows at each size of ``sizes``."""

    world: int
    sizes: tuple[int, ...]
    us: dict[str, list[float]]
    threads: int = 1
    corun: int = 1
    """threads timing at once, one per core (each its own rows, caches flushed before every call)"""
    stream_gbps: float = 0.0
    """GB/s that one thread moves (read + write) while all ``corun`` stream at once: the median over
    the flushes of ``time_rules`` (``FLUSH_BYTES`` read and written each); 0: not timed"""
    ops: Any = None
    """an op-cost table (``trainsim.transform.opcost.OpCostTable``: ``matmul_nt`` and ``elementwise``) timed
    as the rules are (``time_ops``: one process per core at once, caches flushed); None: not timed"""

    def at(self, rule: str, numel: int) -> float:
        """Interpolated in log size and log time; the end slopes held beyond the grid."""
        return loglog(self.sizes, self.us[rule], numel)


def loglog(sizes: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``ys`` (> 0, at ascending ``sizes``, >= 2 of them) interpolated at ``x`` in log size and log value;
    the end slopes held beyond the grid."""
    lx = [math.log(s) for s in sizes]
    lv = math.log(max(1.0, x))
    i = 0 if lv <= lx[1] else len(lx) - 2 if lv >= lx[-2] else max(j for j in range(len(lx) - 1) if lx[j] <= lv)
    w = (lv - lx[i]) / (lx[i + 1] - lx[i])
    return math.exp((1 - w) * math.log(ys[i]) + w * math.log(ys[i + 1]))


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveCpu:
    """Per call of each primitive as the hooks issue it, on ``world`` ranks, at ``sizes_bytes`` (per rank):
    the wall time and the CPU time of one rank (all its threads; the mean of the ranks), in µs."""

    world: int
    sizes_bytes: tuple[int, ...]
    allreduce_us: list[float]
    allgather_us: list[float]
    allreduce_cpu_us: list[float]
    allgather_cpu_us: list[float]

    def cpu_us(self, kind: str, size_bytes: float) -> float:
        """``kind`` (``allreduce`` or ``allgather``) CPU time per call at ``size_bytes``, in log-log."""
        ys = {"allreduce": self.allreduce_cpu_us, "allgather": self.allgather_cpu_us}[kind]
        return loglog(self.sizes_bytes, ys, size_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"world": self.world, "sizes_bytes": list(self.sizes_bytes), "allreduce_us": self.allreduce_us,
                "allgather_us": self.allgather_us, "allreduce_cpu_us": self.allreduce_cpu_us,
                "allgather_cpu_us": self.allgather_cpu_us}  # fmt: skip


def _median_us(
    fn: Callable[[], object], reps: int, before: Callable[[], object] | None = None, before_s: list[float] | None = None
) -> float:  # fmt: skip
    """Median wall time (µs) of ``fn``; ``before`` runs untimed ahead of each call (its CPU times, s,
    appended to ``before_s`` when given). With ``before``, the calling thread's CPU time instead (other
    threads then share the cores: their waits are not the rule's)."""
    fn()  # warm-up: allocations
    clock = time.perf_counter if before is None else time.thread_time
    times = []
    for _ in range(reps):
        if before is not None:
            b0 = time.thread_time()
            before()
            if before_s is not None:
                before_s.append(time.thread_time() - b0)
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return 1e6 * statistics.median(times)


FLUSH_BYTES = 64 << 20
"""scratch written before each timed call of ``time_rules``: twice this host's L3 (32 MiB), so the rows
come from memory, as in a run where they arrive from the sockets"""


def time_rules(
    world: int, sizes: Sequence[int] = RULE_SIZES, *, reps: int = 15, seed: int = 0, corun: int | None = None,
    ops: bool = False,
) -> RuleTimes:  # fmt: skip
    """Time ``robust.aggregate`` of each rule in ``TIMED_RULES``, and the copy of its result into a
    bucket, on ``world`` random rows of each size: ``corun`` threads (default: one per core) at once,
    one intra-op thread each as the ranks run, each on its own rows and flushing the caches with a
    write of ``FLUSH_BYTES`` before every call; per rule and size the mean over the threads of each
    one's median CPU time (a step pays a typical call). The flushes, timed too, give ``stream_gbps``;
    ``ops``: also the op-cost table of Zeno's forward passes and per-row work (``time_ops``)."""
    import threading

    import torch

    from trainsim.run.robust import RobustState, aggregate

    corun = corun or len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(seed)
        us: dict[str, list[float]] = {r: [] for r in TIMED_RULES}
        scratch = [torch.zeros(FLUSH_BYTES // 4) for _ in range(corun)]
        flush_s: list[float] = []  # list.append is atomic under the GIL
        for n in sizes:
            rows = [torch.randn(world, n, generator=g) for _ in range(corun)]
            bucket = [torch.empty(n) for _ in range(corun)]
            for rule in TIMED_RULES:
                state = RobustState(rule, world_size=world, rank=0, f=0, trim=0.25)
                got = [0.0] * corun

                def one(i: int, state: RobustState = state, got: list[float] = got, rows: Any = rows,
                        bucket: Any = bucket) -> None:  # fmt: skip
                    call = partial(lambda r, b: b.copy_(aggregate(state, r)), rows[i], bucket[i])
                    got[i] = _median_us(call, reps, before=partial(scratch[i].add_, 1.0), before_s=flush_s)

                pool = [threading.Thread(target=one, args=(i,)) for i in range(corun)]
                for th in pool:
                    th.start()
                for th in pool:
                    th.join()
                us[rule].append(statistics.fmean(got))
    finally:
        torch.set_num_threads(threads)
    stream = 2 * FLUSH_BYTES / statistics.median(flush_s) / 1e9  # add_ in place: reads and writes every byte
    return RuleTimes(world=world, sizes=tuple(sizes), us=us, corun=corun, stream_gbps=stream,
                     ops=time_ops(corun=corun) if ops else None)  # fmt: skip


OPS_AXES: dict[str, tuple[tuple[int, ...], ...]] = {
    "matmul_nt": (tuple(4**i for i in range(6)), tuple(4**i for i in range(1, 6)), tuple(4**i for i in range(1, 6))),
    "elementwise": (tuple(12 * 4**i for i in range(2, 12)),),
}
"""grid of ``time_ops``: x W^T with m 1 .. 1,024 rows and k, n 4 .. 1,024 (points beyond
``opcost.MAX_MACS`` filled linearly, as ``opcost`` does); c = a + b of 192 B .. 48 MiB (fp32)"""


def time_ops(*, reps: int = 5, corun: int | None = None, axes: dict[str, Any] | None = None) -> Any:
    """The op-cost table (``opcost.OpCostTable``) of the two kinds that ``zeno_parts`` prices, timed as
    ``time_rules`` times the rules: ``corun`` processes at once (default one per core), one intra-op
    thread each, each writing ``FLUSH_BYTES`` before every call (operands from memory), per point the
    mean over the processes of each one's median CPU time. Generic sizes only (``OPS_AXES``)."""
    import json
    import tempfile
    from pathlib import Path

    import numpy as np

    from trainsim.transform import opcost

    corun = corun or len(os.sched_getaffinity(0))
    axes = axes or OPS_AXES
    with tempfile.TemporaryDirectory(prefix="trainsim-ops-") as tmp:
        (Path(tmp) / "axes.json").write_text(json.dumps(axes))
        got = [json.loads(t) for t in _co_run("time_ops", "_ops_proc", tmp, corun, reps)]
    grid = {k: tuple(tuple(int(x) for x in a) for a in v) for k, v in axes.items()}
    us = {}
    for kind, kaxes in grid.items():
        arr = np.mean([np.asarray(g[kind], np.float64) for g in got], axis=0)
        us[kind] = opcost._fill(arr, kaxes) if kind.startswith("matmul") else arr
    return opcost.OpCostTable(axes=grid, us=us, machine=opcost.machine_identity(1),
                              created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip


def _co_run(what: str, entry: str, tmp: str, corun: int, *args: object) -> list[str]:
    """Runs ``entry(tmp, index, corun, *args)`` of this module in ``corun`` processes at once (one intra-op
    thread each) and returns what each wrote to ``tmp/us.<index>``."""
    import subprocess
    import sys

    code = f"import sys; from trainsim.run.robust_cost import {entry}; {entry}(*sys.argv[1:])"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code, tmp, str(i), str(corun), *map(str, args)], env=env)
             for i in range(corun)]  # fmt: skip
    codes = [pr.wait(timeout=600) for pr in procs]
    if any(codes):
        raise RuntimeError(f"{what}: a timing process failed (exit codes {codes}); see its stderr above")
    return [(Path(tmp) / f"us.{i}").read_text() for i in range(corun)]


def _start_together(d: Path, index: str, corun: int, what: str) -> None:
    """Marks this timing process ready in ``d`` and waits for all ``corun`` of them: the cores busy at once."""
    (d / f"ready.{index}").touch()
    deadline = time.monotonic() + 120.0
    while len(list(d.glob("ready.*"))) < corun:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {corun} processes expected, not all started within 120 s")
        time.sleep(0.001)


def _ops_proc(tmp: str, index: str, corun: str, reps: str) -> None:
    """One process of ``time_ops`` (``python -c``): waits until all ``corun`` are ready, writes its
    median CPU time (µs) at every grid point as JSON to ``tmp/us.<index>`` (NaN beyond ``MAX_MACS``)."""
    import json
    from pathlib import Path

    import torch

    from trainsim.transform.opcost import MAX_MACS

    torch.set_num_threads(1)
    d = Path(tmp)
    axes = json.loads((d / "axes.json").read_text())
    scratch = torch.zeros(FLUSH_BYTES // 4)
    _start_together(d, index, int(corun), "time_ops")
    flush = partial(scratch.add_, 1.0)
    out: dict[str, Any] = {}
    with torch.no_grad():
        mm = axes["matmul_nt"]
        grid = [[[math.nan] * len(mm[2]) for _ in mm[1]] for _ in mm[0]]
        for i, m in enumerate(mm[0]):
            for j, k in enumerate(mm[1]):
                for n_i, n in enumerate(mm[2]):
                    if m * k * n <= MAX_MACS:
                        x, w = torch.randn(m, k), torch.randn(n, k)
                        grid[i][j][n_i] = _median_us(partial(torch.mm, x, w.t()), int(reps), before=flush)
        out["matmul_nt"] = grid
        ew = []
        for nbytes in axes["elementwise"][0]:
            a, b = torch.randn(max(1, nbytes // 12)), torch.randn(max(1, nbytes // 12))
            ew.append(_median_us(partial(torch.add, a, b), int(reps), before=flush))
        out["elementwise"] = ew
    (d / f"us.{index}").write_text(json.dumps(out))


def skeleton(model: Any) -> Any:
    """A copy of ``model`` with every ``nn.Linear`` made ``Linear(1, 1)``: the same modules and parameter
    tensors, in the same order, with none of the arithmetic (what ``time_skeleton`` times)."""
    import copy

    from torch import nn

    out = copy.deepcopy(model)
    for name, m in list(out.named_modules()):
        for child, sub in list(m.named_children()):
            if isinstance(sub, nn.Linear):
                setattr(m, child, nn.Linear(1, 1, bias=sub.bias is not None))
        del name
    return out


def time_skeleton(model: Any, world: int, batch: int, *, reps: int = 30, corun: int | None = None) -> float:
    """Zeno's Python machinery per bucket (µs): ``robust.zeno_scores`` of ``world`` rows on the model's
    ``skeleton`` (batch samples of one feature), one intra-op thread: the module calls, the swaps of
    ``torch.func.functional_call``, the per-tensor views and casts, the loss and its read-back, with
    1 x 1 GEMMs. Timed as ``time_rules`` times the other rules: ``corun`` processes at once (default
    one per core; threads would take turns on the GIL), each flushing the caches with a write of
    ``FLUSH_BYTES`` before every call; the mean of their median CPU times (this way it reads more than
    alone and warm: docs/log/robust.md). The model's own arithmetic is priced from the op-cost table (``zeno_parts``)."""
    import pickle
    import tempfile
    from pathlib import Path

    corun = corun or len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="trainsim-skeleton-") as tmp:
        (Path(tmp) / "skeleton.pkl").write_bytes(pickle.dumps(skeleton(model)))
        return statistics.fmean(float(t) for t in _co_run("time_skeleton", "_skeleton_proc", tmp, corun, world, batch, reps))


def _skeleton_proc(tmp: str, index: str, corun: str, world: str, batch: str, reps: str) -> None:
    """One process of ``time_skeleton`` (``python -c``): loads the skeleton from ``tmp``, waits until all
    ``corun`` are ready, writes its median CPU time (µs) of ``zeno_scores`` to ``tmp/us.<index>``."""
    import pickle
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    from trainsim.run.robust import RobustState, zeno_scores

    torch.set_num_threads(1)
    d = Path(tmp)
    sk = pickle.loads((d / "skeleton.pkl").read_bytes())
    params = list(sk.parameters())
    x, y = torch.ones(int(batch), 1), torch.zeros(int(batch), dtype=torch.int64)
    state = RobustState("zeno", world_size=int(world), rank=0, drop=0, lr=0.1, model=sk, validation=(x, y),
                        loss_fn=F.cross_entropy)  # fmt: skip
    rows = torch.zeros(int(world), sum(p.numel() for p in params))
    scratch = torch.zeros(FLUSH_BYTES // 4)
    _start_together(d, index, int(corun), "time_skeleton")
    us = _median_us(partial(zeno_scores, state, rows, params), int(reps), before=partial(scratch.add_, 1.0))
    (d / f"us.{index}").write_text(repr(us))


def zeno_parts(
    model: Any, batch: int, world: int, table: Any, skeleton_us: float, classes: int, rules: RuleTimes | None = None
) -> dict[str, float]:  # fmt: skip
    """Zeno's compute per bucket (µs; the whole model in one bucket), in parts:

    1. ``machinery``: ``skeleton_us`` (``time_skeleton``);
    2. ``forward``: ``world + 1`` forward passes on ``batch`` samples from the op-cost ``table`` (Linear
       GEMMs, the bias adds, activations, and the loss as elementwise traffic);
    3. ``rows``: per row, the swapped parameters (``lr g``, then ``p - that``) and the row's norm; the
       first pass (``lr g``: reads the row, writes as much) at ``rules.stream_gbps`` (the row comes
       from the sockets, not from a cache), the others from the table (the row is cached by then);
    4. ``combine``: averaging the kept rows and the copy into the bucket, priced as the ``mean`` rule
       (``rules.at``: a mean over ``world`` rows and the copy, every core busy; Zeno first gathers
       ``world - drop`` rows, then averages them: about as many bytes).

    Without ``rules``: the first pass from the table too, and no ``combine``. With ``rules.ops``
    (``time_ops``: one process per core at once, caches flushed, as the rules are timed) the forward
    passes and the per-row work are priced from that table instead of ``table`` (timed alone)."""
    from torch import nn

    if rules is not None and rules.ops is not None:
        table = rules.ops

    numel = sum(p.numel() for p in model.parameters())
    fwd = 0.0
    width = 1  # features coming out of the last Linear
    for m in model.modules():
        if isinstance(m, nn.Linear):
            width = m.out_features
            fwd += table.time_us("matmul_nt", (batch, m.in_features, width))  # x W^T
            fwd += table.time_us("elementwise", (3 * 4 * batch * width,))  # the bias add, fp32
        elif isinstance(m, nn.ReLU | nn.GELU | nn.Tanh | nn.Sigmoid):
            fwd += table.time_us("elementwise", (2 * 4 * batch * width,))
    fwd += 4 * table.time_us("elementwise", (3 * 4 * batch * classes,))  # cross-entropy: ~4 passes over the logits
    if rules is not None and rules.stream_gbps > 0:
        first = 2 * 4 * numel / (rules.stream_gbps * 1e3)  # bytes / (GB/s) in µs
    else:
        first = table.time_us("elementwise", (3 * 4 * numel,))
    per_row = (
        first  # lr * g
        + table.time_us("elementwise", (3 * 4 * numel,))  # p - that
        + table.time_us("elementwise", (2 * 4 * numel,))  # |g|^2
    )
    return {"machinery": skeleton_us, "forward": (world + 1) * fwd, "rows": world * per_row,
            "combine": rules.at("mean", numel) if rules is not None else 0.0}  # fmt: skip


def zeno_us(
    model: Any, batch: int, world: int, table: Any, skeleton_us: float, classes: int, rules: RuleTimes | None = None
) -> float:  # fmt: skip
    """Zeno's compute per bucket (µs): the sum of ``zeno_parts``."""
    return sum(zeno_parts(model, batch, world, table, skeleton_us, classes, rules).values())


@dataclass(frozen=True, kw_only=True, slots=True)
class OverheadPrediction:
    """The predicted extra time per step of one rule over the plain all-reduce (µs): the larger of the
    link-bound and the core-bound estimate (module docstring)."""

    rule: str
    size_bytes: int
    """the bucket: fp32 gradient bytes per rank"""
    allreduce_us: float
    allgather_us: float
    compute_us: float
    """the rule's CPU time on a busy host (``time_rules``: every core computing, rows from memory)"""
    contention: float
    """``max(1, world / cores)``: the step's share of each CPU millisecond a rank adds"""
    allreduce_cpu_us: float = 0.0
    allgather_cpu_us: float = 0.0
    """one rank's CPU time per call of each primitive (all its threads; ``time_collectives``)"""

    @property
    def link_us(self) -> float:
        return self.allgather_us - self.allreduce_us

    @property
    def wire_us(self) -> float:
        """The ranks wait for the link: the gather's extra wall time, then the rule, which every rank runs
        at the same moment (the gather ends for all at once) and so on ``contention`` ranks per core."""
        return self.link_us + self.contention * self.compute_us

    @property
    def cpu_us(self) -> float:
        """One rank's extra CPU time per step: the gather's over the all-reduce's, and the rule."""
        return self.allgather_cpu_us - self.allreduce_cpu_us + self.compute_us

    @property
    def total_us(self) -> float:
        return max(self.wire_us, self.contention * self.cpu_us)


def predict_overhead(
    rule: str, numel: int, cal: Any, rules: RuleTimes, *, coll: CollectiveCpu | None = None,
    zeno_compute_us: float | None = None, cores: int | None = None,
) -> OverheadPrediction:  # fmt: skip
    """``rule``'s overhead for a one-bucket model of ``numel`` fp32 gradients (module docstring); ``cal``:
    a ``Calibration`` with all-gather sizes, of ``rules.world`` ranks; ``coll``: the primitives' CPU
    times (``time_collectives``; without it the core-bound estimate counts the rule alone); Zeno needs
    ``zeno_compute_us``."""
    if cal.world != rules.world or (coll is not None and coll.world != rules.world):
        raise ValueError(f"robust overhead: link calibrated for {cal.world} ranks, collectives' CPU for "
                         f"{coll.world if coll else '-'}, rules timed for {rules.world}; expected one world size")  # fmt: skip
    if rule == "zeno":
        if zeno_compute_us is None:
            raise ValueError("robust overhead: zeno needs zeno_compute_us (see zeno_us)")
        compute = zeno_compute_us
    elif rule in rules.us:
        compute = rules.at(rule, numel)
    else:
        raise ValueError(f"robust overhead: unknown rule {rule!r}; expected one of {', '.join([*rules.us, 'zeno'])}")
    size = 4 * numel
    cores = cores or len(os.sched_getaffinity(0))
    return OverheadPrediction(
        rule=rule, size_bytes=size, allreduce_us=cal.predict_us(size), allgather_us=cal.allgather_us(size),
        compute_us=compute, contention=max(1.0, rules.world / cores),
        allreduce_cpu_us=coll.cpu_us("allreduce", size) if coll else 0.0,
        allgather_cpu_us=coll.cpu_us("allgather", size) if coll else 0.0,
    )  # fmt: skip


COLLECTIVE_SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20)
"""per-rank bytes of ``time_collectives``: the all-gather calibration's grid"""


def time_collectives(
    world: int, sizes: Sequence[int] = COLLECTIVE_SIZES, *, rounds: int = 5, calls: int = 6, popen: Any = None,
    master: str = "127.0.0.1", timeout_s: float = 600.0,
) -> CollectiveCpu:  # fmt: skip
    """Launch ``world`` gloo ranks (``popen``: e.g. a ``Netns``'s, for the same link as the run) and time
    the two primitives at each of ``sizes`` as the hooks issue them: DDP's all-reduce (``async_op``, its
    future, a ``then``) and the robust hook's all-gather (``casync.all_gather_bytes``, its future, a
    ``then``), ``calls`` back to back after a barrier, the two taking turns for ``rounds`` rounds; per
    size the median over rounds of wall and process CPU time per call, the mean of the ranks."""
    from trainsim.run.ranks import local_popen, run_workers

    cfg = _ProbeConfig(world=world, sizes=list(sizes), rounds=rounds, calls=calls)
    ranks = run_workers("trainsim.run.robust_cost", cfg, world, popen=popen or local_popen, master=master, port=None,
                        timeout_s=timeout_s)  # fmt: skip

    def mean(key: str) -> list[float]:
        return [statistics.fmean(r[key][i] for r in ranks) for i in range(len(sizes))]

    return CollectiveCpu(world=world, sizes_bytes=tuple(sizes), allreduce_us=mean("allreduce_us"),
                         allgather_us=mean("allgather_us"), allreduce_cpu_us=mean("allreduce_cpu_us"),
                         allgather_cpu_us=mean("allgather_cpu_us"))  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class _ProbeConfig:
    world: int
    sizes: list[int]
    rounds: int
    calls: int
    timeout_s: float = 60.0


def _probe_rank(cfg_json: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    """One rank of ``time_collectives``: writes its per-size medians as JSON to ``out``."""
    import json
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from trainsim.run.casync import all_gather_bytes
    from trainsim.run.ranks import init_gloo

    cfg = _ProbeConfig(**cfg_json)
    init_gloo(rank, cfg.world, master, port, cfg.timeout_s)
    res: dict[str, list[float]] = {k: [] for k in ("allreduce_us", "allgather_us", "allreduce_cpu_us", "allgather_cpu_us")}
    for size in cfg.sizes:
        x = torch.ones(max(1, size // 4))
        gathered = torch.empty(cfg.world * x.numel())

        def allreduce(x: Any = x) -> None:
            dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0]).wait()

        def allgather(x: Any = x, gathered: Any = gathered) -> None:
            all_gather_bytes(gathered, x, None).get_future().then(lambda f, g=gathered: g).wait()

        per: dict[str, list[tuple[float, float]]] = {"allreduce": [], "allgather": []}
        for fn in (allreduce, allgather):
            fn()  # warm-up: connections, allocations
        for r in range(cfg.rounds):
            for name, fn in (("allreduce", allreduce), ("allgather", allgather))[:: 1 if r % 2 == 0 else -1]:
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(cfg.calls):
                    fn()
                per[name].append(((time.perf_counter() - t0) / cfg.calls, (time.process_time() - c0) / cfg.calls))
        for name, got in per.items():
            res[f"{name}_us"].append(1e6 * statistics.median(w for w, _ in got))
            res[f"{name}_cpu_us"].append(1e6 * statistics.median(c for _, c in got))
    Path(out).write_text(json.dumps(res))
    dist.barrier()


if __name__ == "__main__":
    from trainsim.run.ranks import rank_main

    rank_main(_probe_rank, "one rank of robust_cost.time_collectives")
