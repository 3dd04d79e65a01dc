"""``trainsim validate dp``: predict data-parallel step times from a single-process profile, then measure.

    $ trainsim validate dp --quick
    $ trainsim validate dp --json > dp.json
    $ trainsim validate dp --model mlp --rate 100 --delay 5 --mode ddp --mode p3

Per configuration ``(model, link rate, added latency, mode)``:

1. **profile** one rank alone (``trainsim.capture.profile``: Kineto trace + parameter sidecar, one
   thread), once per model, and turn it into a task graph (``trainsim.graph.build.load_trace``); time
   the same loop without the profiler (its overhead is scaled out) and, unless ``--no-corun``, with one
   copy per rank running at once and no communication (ranks that share a host share its cores, caches
   and memory bandwidth: the *co-run factor*, a property of the host like the link is of the network;
   read again during each run, from plain steps interleaved with the measured ones, since a shared
   host's speed drifts); and time the loop under
   DDP in a process group of one rank: DDP's own host work per step (hooks, bucket copies), which the
   plain loop's profile lacks;
2. **emulate the network**: 2 network namespaces joined by veth links shaped with tc
   (``trainsim.validate.netns``); **calibrate** the gloo all-reduce on it (``trainsim.cluster.calibrate``),
   once per link;
3. **predict**: ``trainsim.transform.dataparallel.data_parallel`` adds DDP buckets (or P3 slices) timed
   by the calibrated model to the single-process graph; ``trainsim.simulate.engine.simulate`` replays it,
   at the host's speed read during the run of step 4;
4. **measure**: real training, one gloo process per namespace (``trainsim.validate.dp_worker``: torch DDP,
   or the P3-style runtime), median step time after warm-up; the measured steps alternate with a few
   steps of the plain loop on every rank at once (``dp_worker.interleaved``), the co-run loop of that
   minute;
5. print both and the error. Everything it creates is removed at the end, also on Ctrl-C.

Without the rights to make namespaces it says so once and runs on unshaped loopback instead.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import click

from trainsim.errors import UserError
from trainsim.transform.scheduling import BYTESCHEDULER_CREDIT as BS_CREDIT
from trainsim.transform.scheduling import BYTESCHEDULER_PARTITION_BYTES as BS_PARTITION_BYTES
from trainsim.validate import progress_log

RUN_MODES = ("ddp", "p3", "bytescheduler")
"""what ``validate dp`` runs: torch DDP, the P3-style runtime, and that runtime with ByteScheduler's
partitions and credit (``dp_worker``)"""
PRIORITY_MODES = ("p3", "bytescheduler")
"""the modes run by ``dp_worker.P3Runtime`` (its communication thread, its host work, its rounds)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """One harness configuration."""

    model: str
    """zoo model"""
    rate_mbit: float | None
    """link rate (None: unshaped)"""
    delay_ms: float = 0.0
    """added one-way latency"""
    mode: str = "ddp"
    """ddp | p3 | bytescheduler"""
    world: int = 2
    """processes (one thread each)"""
    slice_bytes: int = 1 << 20
    """P3 slice size"""
    partition_bytes: int = BS_PARTITION_BYTES
    """ByteScheduler partition size"""
    credit: int = BS_CREDIT
    """ByteScheduler partitions in flight"""

    def __post_init__(self) -> None:
        if self.mode not in RUN_MODES:
            raise UserError(f"validate dp: mode={self.mode!r}; expected one of {', '.join(RUN_MODES)}")
        if self.slice_bytes < 4 or self.partition_bytes < 4 or self.credit < 1:
            raise UserError(f"validate dp: slice_bytes={self.slice_bytes}, partition_bytes={self.partition_bytes}, "
                            f"credit={self.credit}; expected pieces of >= 4 bytes and credit >= 1")  # fmt: skip
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise UserError(f"validate dp: rate={self.rate_mbit!r} Mbit/s; expected > 0")
        if not self.delay_ms >= 0:
            raise UserError(f"validate dp: delay={self.delay_ms!r} ms; expected >= 0")
        if self.world < 2:
            raise UserError(f"validate dp: world={self.world}; expected >= 2 processes")

    @property
    def link_key(self) -> tuple[float | None, float, int]:
        return (self.rate_mbit, self.delay_ms, self.world)

    def label(self) -> str:
        rate = "unshaped" if self.rate_mbit is None else f"{self.rate_mbit:g}Mbit"
        return f"{self.model} {rate} +{self.delay_ms:g}ms {self.mode} x{self.world}"


# The full set: two comm-heavy and one compute-heavier model, 20 Mbit/s .. 1 Gbit/s, with and without
# latency, DDP and the P3-style runtime. mlp (9.5 MB of gradients) stays >= 100 Mbit/s to bound time.
FULL: tuple[RunConfig, ...] = (
    RunConfig(model="mlp", rate_mbit=1000, mode="ddp"),
    RunConfig(model="mlp", rate_mbit=200, mode="ddp"),
    RunConfig(model="mlp", rate_mbit=200, mode="p3"),
    RunConfig(model="mlp", rate_mbit=100, delay_ms=5, mode="ddp"),
    RunConfig(model="mlp", rate_mbit=100, delay_ms=5, mode="p3"),
    RunConfig(model="cnn", rate_mbit=1000, mode="ddp"),
    RunConfig(model="cnn", rate_mbit=100, mode="ddp"),
    RunConfig(model="cnn", rate_mbit=100, mode="p3"),
    RunConfig(model="cnn", rate_mbit=20, mode="ddp"),
    RunConfig(model="cnn", rate_mbit=20, delay_ms=10, mode="ddp"),
    RunConfig(model="cnn", rate_mbit=20, delay_ms=10, mode="p3"),
    RunConfig(model="transformer", rate_mbit=100, delay_ms=2, mode="ddp"),
    RunConfig(model="transformer", rate_mbit=20, mode="ddp"),
    RunConfig(model="transformer", rate_mbit=20, mode="p3"),
)
QUICK: tuple[RunConfig, ...] = (
    RunConfig(model="mlp", rate_mbit=200, mode="ddp"),
    RunConfig(model="cnn", rate_mbit=200, mode="ddp"),
)


@dataclass(frozen=True, slots=True)
class RunResult:
    config: RunConfig
    predicted_ms: float
    measured_ms: float
    measured_steps_ms: list[float]
    calibrated: dict[str, float]
    where: str
    single_ms: dict[str, float]
    params_in_sync: bool = True
    predicted_alone_ms: float = float("nan")
    """prediction without the co-run factor (the single-process profile only)"""
    passes: tuple[tuple[float, float], ...] = ()
    """``(predicted, measured)`` ms of each pass where there were several (``run_harness(passes=)``)"""

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_ms - self.measured_ms) / self.measured_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "predicted_ms": round(self.predicted_ms, 3),
            "measured_ms": round(self.measured_ms, 3),
            "error_pct": round(self.error_pct, 2),
            "measured_steps_ms": [round(x, 3) for x in self.measured_steps_ms],
            "calibrated": self.calibrated,
            "where": self.where,
            "single_process_ms": self.single_ms,
            "params_in_sync": self.params_in_sync,
            "predicted_alone_ms": round(self.predicted_alone_ms, 3),
            **({"passes": [{"predicted_ms": round(a, 3), "measured_ms": round(b, 3)} for a, b in self.passes]}
               if self.passes else {}),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Profiled:
    graph: Any
    params: Any
    layers: list[str]
    buffer_bytes: int
    bucket_bytes: list[int]
    traced_ms: float
    """median profiled step time (with the profiler's overhead)"""
    plain_ms: float
    """median step time of the same loop without the profiler"""
    corun_ms: float
    """median step time of the plain loop with one copy per rank running at once (at profile time, or
    measured again beside a run: ``at_host_speed``)"""
    graph_alone: Any
    """the graph without the co-run factor"""
    ddp_overhead_ms: float = 0.0
    """DDP's own host work per step, measured alone in one process (``dp_worker.ddp_overhead``)"""
    p3_overhead_ms: float = 0.0
    """the same for the P3-style runtime (``dp_worker.runtime_overhead``)"""
    straggler_ms: float = 0.0
    """expected wait per step for the slowest rank, from the co-run loop's jitter (``straggler_ms``)"""
    ddp_finalize_ms: float = 0.0
    """the part of ``ddp_overhead_ms`` after the last bucket's collective (``dp_worker.ddp_finalize_ms``)"""

    @property
    def host_factor(self) -> float:
        """How much slower the CPU runs with every rank's process on the host (co-run / plain)."""
        return self.corun_ms / self.plain_ms if self.plain_ms > 0 and self.corun_ms > 0 else 1.0

    def host_overhead_us(self, runtime_ms: float, *, alone: bool = False) -> float:
        """Per-step host work to add to the prediction: a runtime's own work ``runtime_ms`` (measured
        alone) at the co-run speed, plus the wait for the slowest rank; ``alone``: the work as measured,
        no wait."""
        return 1e3 * runtime_ms if alone else 1e3 * (runtime_ms * self.host_factor + self.straggler_ms)

    def finalize_us(self, *, alone: bool = False) -> float:
        """DDP's work after its last collective (``ddp_finalize_ms``) at the co-run speed (``alone``: as
        measured): the part of ``host_overhead_us(ddp_overhead_ms)`` that follows the transfers."""
        return 1e3 * self.ddp_finalize_ms * (1.0 if alone else self.host_factor)

    def at_host_speed(self, per_rank: list[list[float]]) -> _Profiled:
        """The same profile with the co-run loop measured again (``per_rank``: each rank's plain step
        times, e.g. interleaved with a run's steps): the host's speed drifts by tens of percent
        within minutes when other jobs share it, and a prediction should use the speed the run sees,
        like it uses the link's calibration."""
        from dataclasses import replace

        from trainsim.graph.ir import TaskKind
        from trainsim.transform.primitives import scale

        corun_ms = _median_step_ms(per_rank)
        if not corun_ms > 0 or not self.plain_ms > 0:
            return self
        g = scale(self.graph_alone, self.graph_alone.kind == TaskKind.CPU, corun_ms / self.plain_ms)
        return replace(self, graph=g, corun_ms=corun_ms, straggler_ms=straggler_ms(per_rank))


def _plain_step_ms(model: str, steps: int) -> float:
    """Median step time of the same single-process loop as the profile, without the profiler."""
    import torch

    from trainsim.capture.profile import load_model
    from trainsim.validate.dp_worker import loop_ms

    torch.set_num_threads(1)
    net, batch = load_model(model, 32, 0)
    return float(statistics.median(loop_ms(net, batch, torch.nn.CrossEntropyLoss(), 0.01, 2, steps)))


CORUN_START_S = 4.0
"""Copies of the co-run loop start their loops this long after launch (every copy has imported torch)"""


def _corun_steps(model: str, world: int, steps: int) -> list[list[float]]:
    """Step times (ms) of the plain loop on each of ``world`` copies run at once (no communication):
    the copies start their loops at one moment, and only steps that ran while every copy ran count
    (``overlapping_steps``)."""
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": model, "mode": "plain", "steps": steps, "warmup": 2,
                      "start_at": time.time() + CORUN_START_S})  # fmt: skip
    outs = launch(world, ["-m", "trainsim.validate.dp_worker", cfg], net=None, timeout_s=300)
    data = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return overlapping_steps([[float(x) for x in d["marks"]] for d in data])


def overlapping_steps(marks: list[list[float]], min_steps: int = 5) -> list[list[float]]:
    """Per copy, the step times (ms) between its consecutive ``marks`` (seconds on one clock) of the
    steps that ran while every copy ran its loop. Copies launched together do not start together (one
    imports torch a second later), and the first to finish runs none of the other's last steps: those
    steps ran alone, faster, and a co-run factor taken over them reads low (on the cnn, predictions
    from three readings a minute apart spread from 54.9 to 67.5 ms while the runs measured 63.5-67.4).
    A copy with fewer than ``min_steps`` steps inside the window keeps all of its steps."""
    lo = max(m[0] for m in marks)
    hi = min(m[-1] for m in marks)
    out = []
    for m in marks:
        inside = [(b - a) * 1e3 for a, b in itertools.pairwise(m) if a >= lo and b <= hi]
        out.append(inside if len(inside) >= min_steps else [(b - a) * 1e3 for a, b in itertools.pairwise(m)])
    return out


def interleaved_corun(every: list[list[list[float]]]) -> list[list[float]]:
    """Per rank, the plain loop's steps of an interleaved run (``dp_worker.interleaved``: per rank, per
    round, step starts) that ran while every rank ran the loop (``overlapping_steps``, per round)."""
    per_rank: list[list[float]] = [[] for _ in every]
    for marks in zip(*every, strict=True):  # one round: every rank's starts
        for r, steps in enumerate(overlapping_steps(list(marks), min_steps=2)):
            per_rank[r] += steps
    return per_rank


def _median_step_ms(per_rank: list[list[float]]) -> float:
    """The typical step of a co-run: the median over ranks of each rank's median step."""
    return float(statistics.median(statistics.median(r) for r in per_rank))


def straggler_ms(per_rank: list[list[float]], draws: int = 4000, seed: int = 0) -> float:
    """Expected wait per step for the slowest rank: ``E[max over ranks of one step] - median step``.

    A synchronous data-parallel step ends when every rank has its gradients, so it lasts as long as
    the slowest rank's computation; with per-step jitter the expected maximum of ``world`` steps
    exceeds the typical one. Steps are drawn independently from each rank's measured samples (the
    co-run loop, whose ranks run unsynchronised at once on the same host)."""
    import numpy as np

    ranks = [np.asarray(r, float) for r in per_rank if len(r)]
    if len(ranks) < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    draws_ms = np.stack([rng.choice(r, size=draws) for r in ranks])
    return max(0.0, float(draws_ms.max(axis=0).mean() - np.median(np.concatenate(ranks))))


def _runtime_overhead_ms(model: str, steps: int, slice_bytes: int = 1 << 20) -> tuple[float, float, float]:
    """Host work per step that DDP and the P3 runtime add to ``model``'s plain loop, one process alone
    (``dp_worker.runtime_overhead``), and the part of DDP's that follows its last collective
    (``dp_worker.ddp_finalize_ms``)."""
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": model, "mode": "overhead", "steps": steps, "warmup": 2, "slice_bytes": slice_bytes})
    out = launch(1, ["-m", "trainsim.validate.dp_worker", cfg], net=None, timeout_s=300)
    data = json.loads(out[0].strip().splitlines()[-1])
    return float(data["overhead_ms"]), float(data["p3_overhead_ms"]), float(data["finalize_ms"])


def _profile(model: str, workdir: Path, steps: int, world: int = 2, corun: bool = True) -> _Profiled:
    """Profile ``model`` alone and build its graph (see the module docstring, step 1).

    CPU task durations are scaled by (plain step time / profiled step time), which removes the profiler's
    own overhead, and, with ``corun``, by (co-run step time / plain step time): ranks that share a host
    share its cores, caches and memory bandwidth, measured by running ``world`` copies of the plain loop
    at once without any communication. Both ratios are kept in the result for the report.
    """
    import numpy as np

    from trainsim.capture.profile import ProfileConfig, profile, sidecar_path
    from trainsim.graph.build import load_trace
    from trainsim.graph.ir import TaskKind
    from trainsim.models.zoo import build
    from trainsim.transform.dataparallel import ddp_buckets, read_params
    from trainsim.transform.primitives import scale

    trace = profile(ProfileConfig(model=model, steps=steps, warmup=2, threads=1, out=str(workdir / f"{model}.json.gz")))
    g = load_trace(trace)
    traced_ms = float(np.median(g.steps.measured_us)) / 1e3 if g.steps.ids.size else 0.0
    plain_ms = _plain_step_ms(model, steps)
    samples = _corun_steps(model, world, steps) if corun else []
    corun_ms = _median_step_ms(samples) if samples else plain_ms
    alone = g
    if traced_ms > 0:
        alone = scale(g, g.kind == TaskKind.CPU, min(1.0, plain_ms / traced_ms))
        g = scale(g, g.kind == TaskKind.CPU, min(1.0, plain_ms / traced_ms) * corun_ms / plain_ms)
    params, layers = read_params(sidecar_path(trace))
    m, _ = build(model)
    buffer_bytes = sum(b.numel() * b.element_size() for b in m.buffers())
    buckets = ddp_buckets([p.size_bytes for p in params])
    ddp_ms, p3_ms, finalize_ms = _runtime_overhead_ms(model, steps)
    return _Profiled(g, params, layers, buffer_bytes, [sum(params[i].size_bytes for i in b) for b in buckets],
                     traced_ms, plain_ms, corun_ms, alone, ddp_ms, p3_ms, straggler_ms(samples),
                     ddp_finalize_ms=finalize_ms)  # fmt: skip


P3_AGREE_MAX_US = 3000.0
"""the P3 runtime's threshold for agreement rounds (``dp_worker.P3Runtime``, ``agree_max_us``)"""


def p3_uses_rounds(comm_us: Callable[[float], float], world: int) -> bool:
    """Whether the P3 runtime agrees on each slice with a round (it does where a tiny all-reduce is
    cheap, ``P3Runtime.agree_max_us``) rather than piggybacking the counters on the previous slice."""
    return comm_us(4 * world) <= P3_AGREE_MAX_US


@dataclass(frozen=True, slots=True)
class AgreeProbe:
    """What ``agree_round_us`` measured: the P3 runtime's agreement round, and every rank's training
    steps while the rounds ran."""

    round_us: float
    """mean time of one agreement round"""
    steps_ms: list[list[float]]
    """per rank, its training steps under the rounds' load"""
    plain_ms: list[list[float]] = field(default_factory=list)
    """per rank, the same loop's steps without the communication thread, every rank at once, just
    before and after the rounds"""

    @property
    def stretch(self) -> float | None:
        """How much slower the ranks compute while the communication thread works: the median step
        under the rounds over the median plain step (>= 1); None without plain steps. On the cnn at
        100 Mbit/s 1.37-1.59 (e.g. 64.7 against 42.6 ms): the thread's rounds and slices and gloo's
        threads take a share of the host from the computation, which the calibrated CPU per
        transfer, measured with nothing computing, does not see."""
        if not self.plain_ms or not all(self.plain_ms) or not self.steps_ms or not all(self.steps_ms):
            return None
        return max(1.0, _median_step_ms(self.steps_ms) / _median_step_ms(self.plain_ms))

    @property
    def straggler_ms(self) -> float | None:
        """The wait for the slowest rank under that load (``straggler_ms`` of ``steps_ms``); None with
        fewer than 5 steps on a rank (too few to tell)."""
        if len(self.steps_ms) < 2 or min(len(r) for r in self.steps_ms) < 5:
            return None
        return straggler_ms(self.steps_ms)


def agree_round_us(model: str, world: int, net: Any, rounds: int = 300) -> AgreeProbe:
    """Time the P3 runtime's agreement round on ``net``'s link while ``world`` ranks train ``model``
    (``dp_worker.agree_probe``): the idle calibration of a tiny all-reduce misses what the rounds pay
    on a host whose cores and GIL the training holds (on cnn at 100 Mbit/s ~3 ms against ~1.5 ms
    idle). Also returns the ranks' training steps meanwhile: their spread under the communication
    thread's load is the wait for the slowest rank that the runtime pays at every slice (see
    ``predict_ms``)."""
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": model, "mode": "agree_probe", "rounds": rounds})
    out = launch(world, ["-m", "trainsim.validate.dp_worker", cfg], net=net, timeout_s=300)
    data = json.loads(out[0].strip().splitlines()[-1])
    return AgreeProbe(float(data["round_us"]), [[float(x) for x in r] for r in data.get("steps_ms", [])],
                      [[float(x) for x in r] for r in data.get("plain_steps_ms", [])])  # fmt: skip


def predict_ms(
    prof: _Profiled,
    cfg: RunConfig,
    comm_us: Callable[[float], float],
    *,
    mode: str | None = None,
    alone: bool = False,
    cpu_us: Callable[[float], float] | None = None,
    slowdown: Callable[[float], float] | None = None,
    agree_us: float | None = None,
    straggler_wait_ms: float | None = None,
    comm_thread_stretch: float | None = None,
    concentration: float = 1.0,
) -> float:
    """Predicted steady-state step time of ``cfg`` from the single-process profile (``mode`` overrides
    ``cfg.mode``, e.g. ``"bytescheduler"``, which has a model but no runtime here; ``alone``: without the
    co-run factor; ``cpu_us``: host CPU per all-reduce of S bytes, taken from overlapping compute;
    ``slowdown``: how much longer an all-reduce of S bytes takes while the ranks compute; both
    ``trainsim.simulate.contention``; ``agree_us``: the P3 runtime's agreement round as measured while
    training (``agree_round_us``), else the calibrated tiny all-reduce; ``straggler_wait_ms``: the wait
    for the slowest rank to use instead of the profile's (from the co-run loop), e.g.
    ``AgreeProbe.straggler_ms``; ``comm_thread_stretch``: how much slower the ranks compute while the
    P3 runtime's communication thread works (``AgreeProbe.stretch``, s >= 1): each slice then takes a
    share ``1 - 1/s`` of the host from the computation it overlaps, where that exceeds the calibrated
    CPU of the transfer); ``concentration``: how many ranks' worth of the transfers' host CPU the rank
    that sets the step loses (``simulate.contention``): the number of ranks where they share this
    host's cores; not applied on top of a measured ``comm_thread_stretch``, which already holds it."""
    from dataclasses import replace

    from trainsim.simulate.contention import simulate_contended
    from trainsim.simulate.engine import simulate
    from trainsim.transform.dataparallel import BACKEND_LANES, DPConfig, data_parallel, dp_step_ms

    m = mode or cfg.mode
    if straggler_wait_ms is not None and not alone:
        prof = replace(prof, straggler_ms=straggler_wait_ms)
    runtime_ms = prof.p3_overhead_ms if m in PRIORITY_MODES else prof.ddp_overhead_ms
    dpc = DPConfig(world=cfg.world, mode=m, slice_bytes=cfg.slice_bytes, partition_bytes=cfg.partition_bytes,
                   credit=cfg.credit, broadcast_bytes=prof.buffer_bytes,
                   host_overhead_us=prof.host_overhead_us(runtime_ms, alone=alone), lanes=BACKEND_LANES["gloo"],
                   finalize_us=prof.finalize_us(alone=alone) if m == "ddp" else 0.0)  # fmt: skip
    # the P3 runtime agrees on the next slice with one tiny all-reduce (a counter per rank) before each
    # where such a round trip is cheap (P3Runtime, agree_max_us), else piggybacks the counters
    one_round = comm_us(4 * cfg.world) if agree_us is None or alone else agree_us
    round_us = one_round if m == "p3" and p3_uses_rounds(comm_us, cfg.world) else 0.0
    if m == "bytescheduler":  # a round before each partition, on the link (``DPConfig.round_us``)
        dpc = replace(dpc, round_us=one_round)
    g = data_parallel(
        prof.graph_alone if alone else prof.graph, prof.params, prof.layers, dpc,
        comm_us=lambda b: comm_us(b) + round_us,
        broadcast_us=lambda b: comm_us(b) / 2,  # two ranks: one message instead of the ring's two steps
    )  # fmt: skip
    # the runtime's stretch as measured while it trained, where it applies (P3 and ByteScheduler: the same
    # communication thread, the same meeting of the ranks at every round)
    stretch = (comm_thread_stretch if m in PRIORITY_MODES and not alone and (comm_thread_stretch or 0.0) > 1
               else None)  # fmt: skip
    if cpu_us is not None and stretch is not None:
        share, calibrated = 1.0 - 1.0 / stretch, cpu_us

        def cpu_us(b: float) -> float:
            return max(calibrated(b), share * (comm_us(b) + round_us))

    conc = 1.0 if alone or stretch is not None else concentration
    res = simulate(g) if cpu_us is None else simulate_contended(g, cpu_us, slowdown, concentration=conc)
    return dp_step_ms(res.step_ms, m)


def _one_pass(
    c: RunConfig, prof: _Profiled, cal: Any, net: Any, *, steps: int, warmup: int, torchrun: bool, corun: bool,
    recheck_host: bool, log: Callable[[str], None], tag: str = "",
) -> RunResult:  # fmt: skip
    """Run ``c`` for real on ``net`` and predict it at the host's speed meanwhile: one pass."""
    from trainsim.validate.launch import launch

    base = prof
    # ByteScheduler's runtime always agrees by rounds
    rounds = c.mode == "bytescheduler" or (c.mode == "p3" and p3_uses_rounds(cal.predict_us, c.world))
    agree = None
    if rounds and corun:
        log(f"timing the {c.mode} runtime's agreement round while {c.model} trains")
        agree = agree_round_us(c.model, c.world, net)
        log(f"  agreement round {agree.round_us / 1e3:.2f} ms, slower-rank wait "
            f"{agree.straggler_ms or 0.0:.1f} ms, computation x{agree.stretch or 1.0:.2f} while the thread works")  # fmt: skip
    # ``interleave``: the run alternates its measured steps with the plain loop on every rank at once,
    # the co-run loop of the same minute (``dp_worker.interleaved``): the prediction then uses the
    # host's speed of the run, not that of a reading a minute before it (the cnn's co-run loop read
    # 44.7-54.4 ms before runs that measured 57-62 ms)
    interleave = corun and recheck_host
    log(f"running {c.label()}{tag}" + (", its steps interleaved with the plain loop" if interleave else ""))
    wcfg = {"model": c.model, "mode": c.mode, "steps": steps, "warmup": warmup, "slice_bytes": c.slice_bytes,
            "partition_bytes": c.partition_bytes, "credit": c.credit, "interleave": interleave}  # fmt: skip
    if c.mode == "p3":  # the mode the prediction assumed (the runtime's own probe is as noisy)
        wcfg["agree_rounds"] = rounds
    out = launch(c.world, ["-m", "trainsim.validate.dp_worker", json.dumps(wcfg)], net=net, timeout_s=600,
                 torchrun=torchrun)  # fmt: skip
    data = json.loads(out[0].strip().splitlines()[-1])
    meas = [float(x) for x in data["step_ms"]]
    if interleave:
        prof = prof.at_host_speed(interleaved_corun(data["corun_marks"]))
    # with rounds, the runtime meets the other rank before every slice: the wait for the slowest rank is
    # the ranks' spread while the communication thread works, which the probe measured
    pred = predict_ms(prof, c, cal.predict_us, cpu_us=cal.cpu_us, slowdown=cal.slowdown,
                      agree_us=None if agree is None else agree.round_us,
                      straggler_wait_ms=None if agree is None else agree.straggler_ms,
                      comm_thread_stretch=None if agree is None else agree.stretch,
                      concentration=float(c.world))  # fmt: skip
    pred_alone = predict_ms(prof, c, cal.predict_us, alone=True)
    res = RunResult(
        c, pred, float(statistics.median(meas)), meas,
        {"a_us": round(cal.a_us, 2), "b_us_per_byte": cal.b_us_per_byte, "floor_us": round(cal.floor_us, 2),
         "bw_gbps": cal.link.bw_gbps, "alpha_us": cal.link.latency_us},
        cal.where,
        {"profiled": round(prof.traced_ms, 3), "plain": round(prof.plain_ms, 3),
         "ddp_overhead": round(prof.ddp_overhead_ms, 3), "ddp_finalize": round(prof.ddp_finalize_ms, 3),
         "p3_overhead": round(prof.p3_overhead_ms, 3), "straggler": round(prof.straggler_ms, 3),
         **({} if agree is None else {"p3_round": round(agree.round_us / 1e3, 3)}),
         **({} if agree is None or agree.straggler_ms is None else {"p3_straggler": round(agree.straggler_ms, 3)}),
         **({} if agree is None or agree.stretch is None else {"p3_stretch": round(agree.stretch, 3)}),
         "corun": round(prof.corun_ms, 3), "corun_at_profile": round(base.corun_ms, 3)},
        bool(data.get("params_in_sync", True)),
        pred_alone,
    )  # fmt: skip
    log(f"  predicted {res.predicted_ms:.1f} ms, measured {res.measured_ms:.1f} ms, error {res.error_pct:+.1f}%")
    return res


class _PassResult(Protocol):
    """What ``median_of_passes`` reads of a result (the harnesses' frozen ``RunResult`` dataclasses)."""

    @property
    def predicted_ms(self) -> float: ...
    @property
    def measured_ms(self) -> float: ...
    @property
    def params_in_sync(self) -> bool: ...


R = TypeVar("R", bound=_PassResult)


def median_of_passes(runs: list[R], *also: str) -> R:
    """One result for a configuration measured in several passes (a ``RunResult`` of this module or of
    ``validate.compress``): the median predicted and measured step times over the passes (each pass's
    own median step), and of the fields named in ``also``; the steps and host figures of the pass whose
    measurement is that median (the upper one of an even count); every pass's pair in ``passes``. A
    single pass is returned as it is."""
    from dataclasses import replace

    if len(runs) == 1:
        return runs[0]
    mid = sorted(runs, key=lambda r: r.measured_ms)[len(runs) // 2]
    medians = {f: float(statistics.median(getattr(r, f) for r in runs)) for f in ("predicted_ms", "measured_ms", *also)}
    out: R = replace(cast(Any, mid), **medians, params_in_sync=all(r.params_in_sync for r in runs),
                     passes=tuple((r.predicted_ms, r.measured_ms) for r in runs))  # a dataclass: see _PassResult
    return out


def run_harness(
    configs: tuple[RunConfig, ...] | list[RunConfig],
    *,
    steps: int = 20,
    warmup: int = 3,
    reps: int = 5,
    log: Callable[[str], None] = lambda s: None,
    workdir: Path | None = None,
    torchrun: bool = False,
    corun: bool = True,
    recheck_host: bool = True,
    passes: int = 1,
) -> tuple[list[RunResult], list[str]]:
    """Profile, calibrate, predict and measure every configuration; return results and notes.
    ``torchrun``: start the training ranks with ``python -m torch.distributed.run``; ``corun=False``:
    predict from the single-process profile alone (no co-run factor); ``recheck_host``: measure the
    co-run step time again during each run, interleaved with its measured steps
    (``dp_worker.interleaved``, ``_Profiled.at_host_speed``); ``passes``: predict and
    measure each configuration that many times, all configurations of a link once per pass, and report
    the medians (``median_of_passes``)."""
    from trainsim.cluster.calibrate import calibrate, default_sizes
    from trainsim.validate.netns import Netns, netns_unavailable

    if passes < 1:
        raise UserError(f"validate dp: passes={passes}; expected >= 1")
    notes: list[str] = []
    reason = netns_unavailable()
    if reason is not None:
        notes.append(f"network namespaces unavailable ({reason}); running on unshaped loopback")
    tmp = tempfile.TemporaryDirectory(prefix="trainsim-dp-")
    wd = workdir or Path(tmp.name)
    try:
        profiled: dict[tuple[str, int], _Profiled] = {}
        for model, world in sorted({(c.model, c.world) for c in configs}):
            log(f"profiling {model} (one process, one thread; then {world} plain copies at once)")
            profiled[model, world] = _profile(model, wd, steps=max(5, steps), world=world, corun=corun)
        results: list[RunResult] = []
        by_link: dict[tuple[float | None, float, int], list[RunConfig]] = {}
        for c in configs:
            by_link.setdefault(c.link_key if reason is None else (None, 0.0, c.world), []).append(c)
        for (rate, delay, world), group in by_link.items():
            # DDP's buckets in flight together end as one all-reduce of their bytes (``dataparallel.BACKEND_LANES``): up to all of them
            max_msg = max(sum(profiled[c.model, c.world].bucket_bytes) if c.mode == "ddp" else c.slice_bytes for c in group)
            sizes = sorted({*default_sizes(max_msg), max_msg})
            net_cm = Netns(world, rate_mbit=rate, delay_ms=delay) if reason is None else None
            with net_cm if net_cm is not None else contextlib.nullcontext() as net:
                log(f"calibrating gloo all-reduce on {_link(rate, delay)} ({len(sizes)} sizes)")
                cal = calibrate(world=world, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=reps, net=net)
                # every configuration of the link once per pass, the passes one after the other: a
                # burst of load on the shared host then disturbs one pass of a configuration, and the
                # median over the passes drops it (each pass predicts again at the host's speed then)
                runs: list[list[RunResult]] = [[] for _ in group]
                for k in range(passes):
                    for c, done in zip(group, runs, strict=True):
                        tag = f" (pass {k + 1}/{passes})" if passes > 1 else ""
                        done.append(_one_pass(c, profiled[c.model, c.world], cal, net, steps=steps,
                                              warmup=warmup, torchrun=torchrun, corun=corun,
                                              recheck_host=recheck_host, log=log, tag=tag))  # fmt: skip
                for c, done in zip(group, runs, strict=True):
                    res = median_of_passes(done, "predicted_alone_ms")
                    if not res.params_in_sync:
                        notes.append(f"{c.label()}: ranks ended with different weights (gradient sync is broken)")
                    if passes > 1:
                        log(f"{c.label()}: median of {passes} passes {res.measured_ms:.1f} ms measured, "
                            f"{res.predicted_ms:.1f} ms predicted ({res.error_pct:+.1f}%)")  # fmt: skip
                    results.append(res)
        return results, notes
    finally:
        tmp.cleanup()


def _link(rate: float | None, delay: float) -> str:
    return ("unshaped" if rate is None else f"{rate:g} Mbit/s") + (f" +{delay:g} ms" if delay else "")


def summary(results: list[RunResult]) -> dict[str, Any]:
    errs = [abs(r.error_pct) for r in results]
    return {
        "runs": [r.to_json() for r in results],
        "mean_abs_error_pct": round(sum(errs) / len(errs), 2) if errs else None,
        "max_abs_error_pct": round(max(errs), 2) if errs else None,
    }


@click.command("dp")
@click.option("--quick", is_flag=True, help="a short subset (2 runs, under a minute)")
@click.option("--model", "models", multiple=True, help="zoo model(s) for a custom set (mlp, cnn, transformer)")
@click.option("--rate", "rates", type=click.FloatRange(min=0, min_open=True), multiple=True, help="link rate(s) in Mbit/s for a custom set")
@click.option("--delay", "delays", type=click.FloatRange(min=0), multiple=True, help="added one-way latency(ies) in ms")
@click.option("--mode", "modes", type=click.Choice(RUN_MODES), multiple=True,
              help="ddp, p3 and/or bytescheduler (4 MB partitions, credit 4)")
@click.option("--steps", type=int, default=20, show_default=True, help="measured steps per run")
@click.option("--warmup", type=int, default=3, show_default=True, help="warm-up steps per run")
@click.option("--passes", type=int, default=1, show_default=True,
              help="runs per configuration, all configurations once per pass; the medians are reported")
@click.option("--torchrun", is_flag=True, help="start the training ranks with torchrun (slower start)")
@click.option("--no-corun", is_flag=True, help="predict from the one-process profile alone (no co-run factor)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def dp_command(
    quick: bool,
    models: tuple[str, ...],
    rates: tuple[float, ...],
    delays: tuple[float, ...],
    modes: tuple[str, ...],
    steps: int,
    warmup: int,
    passes: int,
    torchrun: bool,
    no_corun: bool,
    as_json: bool,
) -> None:
    """Predict DDP step times from a one-process profile, then run real 2-process DDP on shaped links."""
    from rich.console import Console
    from rich.table import Table

    if steps < 1 or warmup < 2:
        raise UserError(f"validate dp: steps={steps}, warmup={warmup}; expected steps >= 1, warmup >= 2")
    if passes < 1:
        raise UserError(f"validate dp: --passes {passes}; expected >= 1")
    if models or rates or delays or modes:
        configs = [
            RunConfig(model=m, rate_mbit=r, delay_ms=d, mode=mo)
            for m in (models or ("mlp",)) for r in (rates or (100.0,)) for d in (delays or (0.0,))
            for mo in (modes or ("ddp",))
        ]  # fmt: skip
    else:
        configs = list(QUICK if quick else FULL)
    from trainsim.models.zoo import MODELS

    for c in configs:
        if c.model not in MODELS:
            raise UserError(f"validate dp: unknown model {c.model!r}; expected one of {', '.join(sorted(MODELS))}")
    err = Console(stderr=True)
    results, notes = run_harness(
        configs, steps=4 if quick else steps, warmup=2 if quick else warmup, reps=3 if quick else 5,
        log=progress_log(err),
        torchrun=torchrun,
        corun=not no_corun,
        passes=passes,
    )  # fmt: skip
    for n in notes:
        err.print(f"[yellow]note:[/] {n}")
    out = summary(results)
    if as_json:
        click.echo(json.dumps({**out, "notes": notes}))
        return
    table = Table(title="validate dp: predicted vs measured step time")
    for col in ("model", "link", "mode", "predicted ms", "measured ms", "error"):
        table.add_column(col, justify="right" if "ms" in col or col == "error" else "left")
    for r in results:
        c = r.config
        table.add_row(c.model, _link(c.rate_mbit, c.delay_ms), c.mode, f"{r.predicted_ms:.1f}",
                      f"{r.measured_ms:.1f}", f"{r.error_pct:+.1f}%")  # fmt: skip
    Console().print(table)
    click.echo(f"mean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}%")
