"""``trainsim validate dp``: predict data-parallel step times before running them, then measure.

    $ trainsim validate calibrate                 # once per machine (``testbed.machine``)
    $ trainsim validate dp --quick
    $ trainsim validate dp --seed 7 --json --out dp.json
    $ trainsim validate dp --model mlp --rate 100 --latency-us 5000 --mode ddp --mode p3

It follows ``trainsim.validate.protocol``:

1. **the machine**: the calibration file of ``trainsim validate calibrate`` (generic all-reduce sizes
   over loopback and one shaped link, a standard kernel alone and co-run); another machine's file is
   refused (``--recalibrate`` measures this one);
2. **profile** each model as a user would, one process alone, before any real run: a Kineto trace of
   the training loop and its untraced steps (``run.traced``, ``world=1``), and the host work that DDP
   and the P3-style runtime add to the loop, in a process group of one rank
   (``dp_worker.runtime_overhead``);
3. **predict** every configuration and freeze the predictions in the result file
   (``predictions_frozen_at``): ``transform.dataparallel.data_parallel`` adds DDP buckets (or P3
   slices, ByteScheduler partitions) to the one-process graph, each collective timed by the machine
   calibration's model (``MachineCalibration.allreduce_us`` at the configuration's rate, latency and
   world); the computation runs ``MachineCalibration.slowdown(world)`` slower (ranks that share this
   host share its cores); ``testbed.contention`` charges the collectives' host CPU (the loopback
   all-reduce's host cost) to the computation they overlap;
4. **measure**: real training, one gloo process per network namespace on links shaped with tc
   (``testbed.netns``; unshaped loopback without the rights, said once), ``--passes`` passes over
   every configuration interleaved (A B C A B C ...). Nothing measured here reaches a prediction; a
   run's own readings (its steps, whether the ranks stayed in sync) go to its ``diagnostics``.

Besides the fixed configurations, every invocation draws some from a seed that it prints and stores
(``draw_configs``; ``--seed`` repeats a draw): zoo model and MLP width and depth, link rate and
latency, DDP bucket size or P3 slice size. Everything it creates is removed at the end, also on Ctrl-C;
an interrupted run's measurements stay in the result file, marked partial.

Why one module: it is the one validation's whole flow (its configuration, draw, prediction, real run
and command), and ``validate.compress`` reuses its profile, drivers and printing.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trainsim.cli.options import us_to_ms
from trainsim.errors import UserError
from trainsim.transform.scheduling import BYTESCHEDULER_CREDIT as BS_CREDIT
from trainsim.transform.scheduling import BYTESCHEDULER_PARTITION_BYTES as BS_PARTITION_BYTES
from trainsim.validate.protocol import protocol_options

RUN_MODES = ("ddp", "p3", "bytescheduler")
"""what ``validate dp`` runs: torch DDP, the P3-style runtime, and that runtime with ByteScheduler's
partitions and credit (``dp_worker``)"""
PRIORITY_MODES = ("p3", "bytescheduler")
"""the modes run by ``dp_worker.P3Runtime`` (its communication thread, its host work, its rounds)"""
MLP_DEFAULT = (1024, 4)
"""the zoo MLP's width and depth (``models.zoo.ZooSpec``)"""


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
    width: int = MLP_DEFAULT[0]
    """MLP hidden width (mlp only)"""
    depth: int = MLP_DEFAULT[1]
    """MLP linear layers (mlp only)"""
    bucket_cap_mb: float = 25.0
    """DDP bucket cap, MiB (torch's default)"""
    slice_bytes: int = 1 << 20
    """P3 slice size"""
    partition_bytes: int = BS_PARTITION_BYTES
    """ByteScheduler partition size"""
    credit: int = BS_CREDIT
    """ByteScheduler partitions in flight"""

    def __post_init__(self) -> None:
        if self.mode not in RUN_MODES:
            raise UserError(f"validate dp: mode={self.mode!r}; expected one of {', '.join(RUN_MODES)}")
        if self.slice_bytes < 4 or self.partition_bytes < 4 or self.credit < 1 or not self.bucket_cap_mb > 0:
            raise UserError(f"validate dp: slice_bytes={self.slice_bytes}, partition_bytes={self.partition_bytes}, "
                            f"credit={self.credit}, bucket_cap_mb={self.bucket_cap_mb}; expected pieces of >= 4 "
                            "bytes, buckets > 0 MiB and credit >= 1")  # fmt: skip
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise UserError(f"validate dp: rate={self.rate_mbit!r} Mbit/s; expected > 0")
        if not self.delay_ms >= 0:
            raise UserError(f"validate dp: delay={self.delay_ms!r} ms; expected >= 0")
        if self.world < 2:
            raise UserError(f"validate dp: world={self.world}; expected >= 2 processes")
        if self.model != "mlp" and (self.width, self.depth) != MLP_DEFAULT:
            raise UserError(f"validate dp: width/depth given for {self.model!r}; only the mlp has them")

    @property
    def model_key(self) -> tuple[str, int, int]:
        """What the one-process profile depends on."""
        return (self.model, self.width, self.depth)

    def label(self) -> str:
        rate = "unshaped" if self.rate_mbit is None else f"{self.rate_mbit:g}Mbit"
        shape = f" w{self.width}d{self.depth}" if (self.width, self.depth) != MLP_DEFAULT else ""
        piece = ""
        if self.mode == "ddp" and self.bucket_cap_mb != 25.0:
            piece = f" bucket {self.bucket_cap_mb:g}MiB"
        elif self.mode == "p3" and self.slice_bytes != 1 << 20:
            piece = f" slice {self.slice_bytes >> 10}KiB"
        return f"{self.model}{shape} {rate} +{self.delay_ms:g}ms {self.mode}{piece} x{self.world}"


# Two comm-heavy and one compute-heavier model, 20 Mbit/s .. 1 Gbit/s, with and without latency, DDP
# and the P3-style runtime. mlp (9.5 MB of gradients) stays >= 100 Mbit/s to bound time.
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

# --------------------------------------------------------------------------- the draw
RATE_RANGE_MBIT = {"mlp": (100.0, 1000.0), "cnn": (20.0, 1000.0), "transformer": (20.0, 1000.0)}
"""drawn link rates, log-uniform (the mlp's 2.4-9.5 MB of gradients stay >= 100 Mbit/s to bound time)"""
DELAY_RANGE_MS = (0.5, 10.0)
"""drawn added latency, uniform, on half the drawn links (the others get none)"""
MLP_WIDTHS = (512, 768, 1024, 1536)
MLP_DEPTHS = (3, 4, 5)
BUCKET_RANGE_MB = (1.0, 25.0)
"""drawn DDP bucket caps, log-uniform"""
SLICE_RANGE_BYTES = (256 << 10, 4 << 20)
"""drawn P3 slice sizes, log-uniform (rounded to KiB)"""


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def draw_configs(seed: int, n: int) -> list[RunConfig]:
    """``n`` configurations drawn from ``seed`` (the same seed, the same draw): a zoo family (for the
    mlp a width and a depth), a rate and a latency, DDP with a bucket cap or P3 with a slice size."""
    rng = random.Random(seed)
    out: list[RunConfig] = []
    for _ in range(n):
        model = rng.choice(("mlp", "mlp", "cnn", "transformer"))
        shape = {"width": rng.choice(MLP_WIDTHS), "depth": rng.choice(MLP_DEPTHS)} if model == "mlp" else {}
        rate = round(_log_uniform(rng, *RATE_RANGE_MBIT[model]), 1)
        delay = round(rng.uniform(*DELAY_RANGE_MS), 1) if rng.random() < 0.5 else 0.0
        mode = rng.choice(("ddp", "p3"))
        piece: dict[str, Any] = (
            {"bucket_cap_mb": round(_log_uniform(rng, *BUCKET_RANGE_MB), 1)} if mode == "ddp"
            else {"slice_bytes": round(_log_uniform(rng, *SLICE_RANGE_BYTES) / 1024) * 1024}
        )  # fmt: skip
        out.append(RunConfig(model=model, rate_mbit=rate, delay_ms=delay, mode=mode, **shape, **piece))
    return out


# --------------------------------------------------------------------------- the profile
@dataclass(frozen=True, slots=True)
class Profile:
    """What one process alone tells of a model (step 2 of the module docstring)."""

    graph: Any
    """the traced step's task graph, CPU tasks scaled to the untraced step (the profiler's overhead out)"""
    params: Any
    layers: list[str]
    buffer_bytes: int
    plain_steps_ms: list[float]
    """the untraced steps of the one process"""
    traced_ms: float
    """median traced step"""
    ddp_overhead_ms: float = 0.0
    """DDP's own host work per step, one process alone (``dp_worker.ddp_overhead``)"""
    p3_overhead_ms: float = 0.0
    """the same for the P3-style runtime (``dp_worker.runtime_overhead``)"""
    ddp_finalize_ms: float = 0.0
    """the part of ``ddp_overhead_ms`` after the last bucket's collective (``dp_worker.ddp_finalize_ms``)"""

    @property
    def plain_ms(self) -> float:
        return float(statistics.median(self.plain_steps_ms))

    def describe(self) -> dict[str, float]:
        return {"plain_ms": round(self.plain_ms, 3), "traced_ms": round(self.traced_ms, 3),
                "ddp_overhead_ms": round(self.ddp_overhead_ms, 3), "ddp_finalize_ms": round(self.ddp_finalize_ms, 3),
                "p3_overhead_ms": round(self.p3_overhead_ms, 3)}  # fmt: skip


def profile_model(key: tuple[str, int, int], workdir: Path, *, steps: int = 8) -> Profile:
    """Profile ``key`` = (model, width, depth) in one process alone: a traced run of one rank
    (``run.traced``: untimed warm-up, ``steps`` untraced steps, 3 traced ones) and the runtimes' own host
    work (``dp_worker.runtime_overhead``, a process group of one rank)."""
    import numpy as np

    from trainsim.capture.profile import sidecar_path
    from trainsim.graph.build import load_trace
    from trainsim.graph.ir import TaskKind
    from trainsim.models.zoo import ZooSpec, build
    from trainsim.run.traced import TracedRunConfig, traced_run
    from trainsim.testbed.launch import run_json
    from trainsim.transform.dataparallel import read_params
    from trainsim.transform.primitives import scale

    model, width, depth = key
    folder = workdir / f"profile-{model}-w{width}-d{depth}"
    res = traced_run(TracedRunConfig(model=model, width=width, depth=depth, world=1, warmup=3, steps=steps, profiled=3),
                     folder)  # fmt: skip
    trace = res["traces"][0]
    plain = [float(x) for x in res["rank_step_ms"][0]]
    g = load_trace(trace)
    traced_ms = float(np.median(g.steps.measured_us)) / 1e3 if g.steps.ids.size else 0.0
    if traced_ms > 0:
        g = scale(g, g.kind == TaskKind.CPU, min(1.0, statistics.median(plain) / traced_ms))
    params, layers = read_params(sidecar_path(trace))
    m, _ = build(model, spec=ZooSpec(width=width, depth=depth))
    buffer_bytes = sum(b.numel() * b.element_size() for b in m.buffers())
    cfg = {"model": model, "width": width, "depth": depth, "mode": "overhead", "steps": max(4, steps), "warmup": 2,
           "slice_bytes": 1 << 20}  # fmt: skip
    data = run_json(1, "trainsim.validate.dp_worker", cfg, net=None, timeout_s=300)[0]
    return Profile(g, params, layers, buffer_bytes, plain, traced_ms, float(data["overhead_ms"]),
                   float(data["p3_overhead_ms"]), float(data["finalize_ms"]))  # fmt: skip


# --------------------------------------------------------------------------- the prediction
P3_AGREE_MAX_US = 3000.0
"""the P3 runtime's threshold for agreement rounds (``dp_worker.P3Runtime``, ``agree_max_us``)"""


def p3_uses_rounds(comm_us: Callable[[float], float], world: int) -> bool:
    """Whether the P3 runtime agrees on each slice with a round (it does where a tiny all-reduce is
    cheap, ``P3Runtime.agree_max_us``) rather than piggybacking the counters on the previous slice."""
    return comm_us(4 * world) <= P3_AGREE_MAX_US


def straggler_ms(per_rank: list[list[float]], draws: int = 4000, seed: int = 0) -> float:
    """Expected wait per step for the slowest rank: ``E[max over ranks of one step] - median step``,
    steps drawn independently from each rank's samples. A synchronous step lasts as long as the
    slowest rank's computation; with per-step jitter the expected maximum of ``world`` steps exceeds
    the typical one."""
    import numpy as np

    ranks = [np.asarray(r, float) for r in per_rank if len(r)]
    if len(ranks) < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    draws_ms = np.stack([rng.choice(r, size=draws) for r in ranks])
    return max(0.0, float(draws_ms.max(axis=0).mean() - np.median(np.concatenate(ranks))))


def comm_model(mcal: Any, cfg: RunConfig) -> Callable[[float], float]:
    """All-reduce time (us) of S bytes on ``cfg``'s link, from the machine calibration's model."""
    return lambda b: float(mcal.allreduce_us(b, world=cfg.world, rate_mbit=cfg.rate_mbit, delay_ms=cfg.delay_ms))


def wire_cpu(mcal: Any, rate_mbit: float | None, world: int) -> Callable[[float], float]:
    """Computation (us) a collective of S bytes takes from a rank on a link shaped to ``rate_mbit``,
    beyond the loopback line (``MachineCalibration.wire_cpu_us``)."""
    return lambda b: float(mcal.wire_cpu_us(b, rate_mbit=rate_mbit, world=world))


def predict_ms(prof: Profile, cfg: RunConfig, mcal: Any) -> dict[str, Any]:
    """The predicted steady-state step of ``cfg`` from the one-process profile and the machine
    calibration ``mcal`` (``testbed.machine.MachineCalibration``) only:

    1. the profile's CPU tasks run ``mcal.slowdown(world)`` slower (``world`` ranks on this host);
    2. the runtime's own host work (one process alone) at that speed, plus the wait for the slowest
       rank: ``straggler_ms`` of ``world`` ranks drawing from the one process's step times, scaled;
    3. collectives from ``mcal.allreduce_us`` at the link's rate, latency and world (P3's agreement
       round: a tiny all-reduce, where the runtime agrees by rounds); their host CPU taken from
       overlapping computation: the loopback cost (``mcal.host_us``), every rank's
       (``concentration=world``), and the shaped link's cost per byte sent (``mcal.wire_cpu_us``),
       measured as the rank that sets the step loses it;
    4. ``data_parallel`` + ``simulate_contended``; the median simulated step (``dp_step_ms``).

    Returns ``predicted_ms`` and the parts it was made of."""
    from trainsim.graph.ir import TaskKind
    from trainsim.testbed.contention import simulate_contended
    from trainsim.transform.dataparallel import BACKEND_LANES, DPConfig, data_parallel, dp_step_ms
    from trainsim.transform.primitives import scale

    f = float(mcal.slowdown(cfg.world))
    graph = scale(prof.graph, prof.graph.kind == TaskKind.CPU, f)
    wait_ms = f * straggler_ms([prof.plain_steps_ms] * cfg.world)
    runtime_ms = prof.p3_overhead_ms if cfg.mode in PRIORITY_MODES else prof.ddp_overhead_ms
    comm_us = comm_model(mcal, cfg)
    rounds = cfg.mode == "bytescheduler" or (cfg.mode == "p3" and p3_uses_rounds(comm_us, cfg.world))
    one_round = comm_us(4 * cfg.world)
    dpc = DPConfig(world=cfg.world, mode=cfg.mode, bucket_cap_mb=cfg.bucket_cap_mb, slice_bytes=cfg.slice_bytes,
                   partition_bytes=cfg.partition_bytes, credit=cfg.credit, broadcast_bytes=prof.buffer_bytes,
                   host_overhead_us=1e3 * (runtime_ms * f + wait_ms), lanes=BACKEND_LANES["gloo"],
                   finalize_us=1e3 * prof.ddp_finalize_ms * f if cfg.mode == "ddp" else 0.0,
                   round_us=one_round if cfg.mode == "bytescheduler" else 0.0)  # fmt: skip
    round_us = one_round if cfg.mode == "p3" and rounds else 0.0
    g = data_parallel(graph, prof.params, prof.layers, dpc, comm_us=lambda b: comm_us(b) + round_us,
                      broadcast_us=lambda b: comm_us(b) / 2)  # fmt: skip
    res = simulate_contended(g, mcal.host_us, None, concentration=float(cfg.world),
                             wire_cpu_us=wire_cpu(mcal, cfg.rate_mbit, cfg.world))  # fmt: skip
    return {"predicted_ms": round(dp_step_ms(res.step_ms, cfg.mode), 3), "agree_rounds": rounds,
            "parts": {"corun_slowdown": round(f, 4), "straggler_ms": round(wait_ms, 3),
                      "runtime_ms": round(runtime_ms * f, 3), "round_us": round(one_round, 1) if rounds else 0.0,
                      "profile": prof.describe()}}  # fmt: skip


# --------------------------------------------------------------------------- the runs
def run_config(cfg: RunConfig, *, steps: int, warmup: int, agree_rounds: bool, netns: bool) -> tuple[float, dict[str, Any]]:
    """Run ``cfg`` for real (``dp_worker``, one gloo process per namespace on a link shaped for it, or
    on loopback when ``netns`` is False); return the median step (the slowest rank's, ms) and the run's
    diagnostics."""
    wcfg = {"model": cfg.model, "width": cfg.width, "depth": cfg.depth, "mode": cfg.mode, "steps": steps,
            "warmup": warmup, "bucket_cap_mb": cfg.bucket_cap_mb, "slice_bytes": cfg.slice_bytes,
            "partition_bytes": cfg.partition_bytes, "credit": cfg.credit, "agree_rounds": agree_rounds}  # fmt: skip
    step, diag, _ = run_measured("trainsim.validate.dp_worker", cfg.world, wcfg, rate_mbit=cfg.rate_mbit,
                                 delay_ms=cfg.delay_ms, netns=netns)  # fmt: skip
    return step, diag


def run_measured(
    module: str, world: int, wcfg: dict[str, Any], *, rate_mbit: float | None, delay_ms: float, netns: bool
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """Run ``module``'s worker for real (``testbed.launch.run_json``): ``world`` gloo processes, one per
    namespace on a link shaped to ``rate_mbit`` and ``delay_ms``, or on loopback when ``netns`` is False.
    Returns the median step (the slowest rank's, ms), the diagnostics every such run has (its steps,
    whether the ranks ended in sync, where it ran) and rank 0's whole result."""
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns

    with Netns(world, rate_mbit=rate_mbit, delay_ms=delay_ms) if netns else contextlib.nullcontext() as net:
        data = run_json(world, module, wcfg, net=net, timeout_s=600)[0]
    meas = [float(x) for x in data["step_ms"]]
    diag = {"steps_ms": [round(x, 3) for x in meas], "params_in_sync": bool(data.get("params_in_sync", True)),
            "where": "netns" if netns else "loopback"}  # fmt: skip
    return float(statistics.median(meas)), diag, data


Profiler = Callable[[tuple[str, int, int], Path], Profile]
Runner = Callable[[RunConfig, dict[str, Any]], "tuple[float, dict[str, Any]]"]
"""``runner(config, frozen row)``: one real run, its measured step (ms) and diagnostics"""


def run_validation(
    configs: list[RunConfig],
    out: Path,
    *,
    seed: int,
    mcal: Any,
    n_fixed: int | None = None,
    profiler: Profiler | None = None,
    runner: Runner | None = None,
    passes: int = 3,
    steps: int = 8,
    warmup: int = 3,
    netns: bool = True,
    log: Callable[[str], None] = lambda s: None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Profile every model, predict every configuration and freeze the predictions in ``out``, then run
    them ``passes`` times, interleaved (``protocol.interleave``); return the finished document. The
    first ``n_fixed`` configurations (default all) are the fixed ones, the rest drawn (``held_out``).
    ``profiler`` and ``runner`` default to the real ones (``profile_model``, ``run_config``)."""
    from trainsim.validate.protocol import config_row, open_result

    res = open_result(out, name="dp", seed=seed, passes=passes, meta=meta)
    n_fixed = len(configs) if n_fixed is None else n_fixed
    with _workdir() as wd:
        profs = profile_models({c.model_key for c in configs}, wd, profiler, steps=steps, log=log)
        for key, prof in profs.items():
            log(f"  {key[0]}: {prof.plain_ms:.1f} ms/step; DDP's own work {prof.ddp_overhead_ms:.1f} ms, "
                f"the P3 runtime's {prof.p3_overhead_ms:.1f} ms")  # fmt: skip
        rows = [config_row(c, i, n_fixed, predict_ms(profs[c.model_key], c, mcal)) for i, c in enumerate(configs)]
        real = runner or (lambda c, row: run_config(c, steps=steps, warmup=warmup, agree_rounds=row["agree_rounds"],
                                                    netns=netns))  # fmt: skip
        return measure_frozen(res, rows, configs, lambda i, row: real(configs[i], row), passes=passes, log=log)


def measure_frozen(
    res: Any, rows: list[dict[str, Any]], configs: Sequence[Any],
    run: Callable[[int, dict[str, Any]], tuple[float, dict[str, Any]]], *, passes: int, log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """Freeze ``rows`` (one per configuration) in ``res`` (a ``protocol.ResultFile``), then run
    configuration ``i`` with ``run(i, its frozen row)`` ``passes`` times, interleaved
    (``protocol.interleave``), noting any run whose ranks ended out of sync; the finished document."""
    from trainsim.validate.protocol import interleave

    res.freeze(rows)  # every prediction on disk before the first real run
    log(f"{len(rows)} predictions frozen in {res.path}")

    def run_one(i: int, _pass: int) -> tuple[float, dict[str, Any]]:
        step, diag = run(i, res.doc["runs"][i])
        note_out_of_sync(res, configs[i].label(), diag)
        return step, diag

    return interleave(res, run_one, passes=passes, log=log)


def profile_models(keys: set[tuple[str, int, int]], wd: Path, profiler: Profiler | None, *, steps: int,
                   log: Callable[[str], None]) -> dict[tuple[str, int, int], Profile]:  # fmt: skip
    """Each model of ``keys`` (model, width, depth) profiled in one process alone, in ``wd``
    (``profiler``: a stand-in for tests; default ``profile_model``)."""
    prof = profiler or (lambda k, w: profile_model(k, w, steps=max(5, steps)))
    out: dict[tuple[str, int, int], Profile] = {}
    for key in sorted(keys):
        log(f"profiling {key[0]}" + (f" w{key[1]} d{key[2]}" if key[1:] != MLP_DEFAULT else "") + " (one process alone)")
        out[key] = prof(key, wd)
    return out


def note_out_of_sync(res: Any, label: str, diag: dict[str, Any]) -> None:
    """Say in the result file when a run's ranks ended with different weights (``params_in_sync``)."""
    if not diag.get("params_in_sync", True):
        res.doc.setdefault("notes", []).append(f"{label}: ranks ended with different weights")


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="trainsim-dp-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- the command
def select_configs(quick: bool, seed: int, models: tuple[str, ...] = (), rates: tuple[float, ...] = (),
                   delays: tuple[float, ...] = (), modes: tuple[str, ...] = ()) -> tuple[list[RunConfig], int]:  # fmt: skip
    """The fixed configurations (a custom set where any of ``models`` .. ``modes`` is given) and the
    drawn ones (2 with ``quick``, else 6); returns them and how many are fixed."""
    from trainsim.models.zoo import MODELS

    if models or rates or delays or modes:
        fixed = [
            RunConfig(model=m, rate_mbit=r, delay_ms=d, mode=mo)
            for m in (models or ("mlp",)) for r in (rates or (100.0,)) for d in (delays or (0.0,))
            for mo in (modes or ("ddp",))
        ]  # fmt: skip
    else:
        fixed = list(QUICK if quick else FULL)
    for c in fixed:
        if c.model not in MODELS:
            raise UserError(f"validate dp: unknown model {c.model!r}; expected one of {', '.join(sorted(MODELS))}")
    return fixed + draw_configs(seed, 2 if quick else 6), len(fixed)


@click.command("dp")
@click.option("--quick", is_flag=True, help="2 fixed and 2 drawn configurations, short runs (under 3 minutes)")
@click.option("--model", "models", multiple=True, help="zoo model(s) for a custom fixed set (mlp, cnn, transformer)")
@click.option("--rate", "rates", type=click.FloatRange(min=0, min_open=True), multiple=True,
              help="link rate(s) in Mbit/s for a custom fixed set")
@click.option("--latency-us", "delays", type=click.FloatRange(min=0), multiple=True, callback=us_to_ms,
              help="added one-way latency(ies), us")
@click.option("--mode", "modes", type=click.Choice(RUN_MODES), multiple=True,
              help="ddp, p3 and/or bytescheduler (4 MB partitions, credit 4)")
@click.option("--steps", type=int, default=None, help="measured steps per run (default 10; 5 with --quick)")
@click.option("--warmup", type=int, default=None, help="warm-up steps per run (default 3; 2 with --quick)")
@protocol_options("dp")
def dp_command(
    quick: bool, models: tuple[str, ...], rates: tuple[float, ...], delays: tuple[float, ...], modes: tuple[str, ...],
    steps: int | None, warmup: int | None, passes: int, seed: int | None, calibration: str | None, recalibrate: bool,
    out: str | None, force: bool, as_json: bool,
) -> None:  # fmt: skip
    """Predict data-parallel step times from a one-process profile, freeze them, then run real 2-process training."""

    from trainsim.validate.protocol import draw_seed, open_run

    steps = steps if steps is not None else 5 if quick else 10
    warmup = warmup if warmup is not None else 2 if quick else 3
    if steps < 1 or warmup < 2:
        raise UserError(f"validate dp: steps={steps}, warmup={warmup}; expected steps >= 1, warmup >= 2")
    if passes < 1:
        raise UserError(f"validate dp: --passes {passes}; expected >= 1")
    seed = draw_seed(seed)
    configs, n_fixed = select_configs(quick, seed, models, rates, delays, modes)
    path, log, mcal, cal_path, notes = open_run("dp", seed=seed, out=out, force=force, calibration=calibration,
                                                recalibrate=recalibrate, what=f"{len(configs)} configurations ({n_fixed} fixed)")  # fmt: skip
    cmd = ("trainsim validate dp" + (" --quick" if quick else "") + "".join(f" --model {m}" for m in models)
           + "".join(f" --rate {r:g}" for r in rates) + "".join(f" --latency-us {1000 * d:g}" for d in delays)
           + "".join(f" --mode {m}" for m in modes) + f" --steps {steps} --warmup {warmup} --passes {passes} --seed {seed}")  # fmt: skip
    meta = {"command": cmd, "calibration": mcal.describe(cal_path), "quick": quick, "passes": passes, "notes": notes,
            "steps": steps, "warmup": warmup,
            "method": "predicted from a one-process profile (trace + untraced steps + the runtimes' own work alone), "
                      "the machine calibration (collectives, co-run slowdown) and the config; frozen before any run"}  # fmt: skip
    try:
        doc = run_validation(configs, path, seed=seed, mcal=mcal, n_fixed=n_fixed, passes=passes, steps=steps,
                             warmup=warmup, netns=not notes, log=log, meta=meta)  # fmt: skip
    except KeyboardInterrupt:
        raise UserError(f"validate dp: interrupted; what was measured is in {path}, marked partial") from None
    print_result(doc, "validate dp", path, as_json)


def print_result(doc: dict[str, Any], title: str, path: Path, as_json: bool) -> None:
    """The finished document as one JSON line, or a table and the headline figures."""
    if as_json:
        click.echo(json.dumps(doc))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{title}: frozen prediction vs measured step (seed {doc['seed']}; * drawn)")
    for h in ("configuration", "predicted ms", "measured ms", "spread %", "error %", "within"):
        t.add_column(h, justify="left" if h == "configuration" else "right")
    for r in doc["runs"]:
        t.add_row(r["label"], f"{r['predicted_ms']:.1f}", f"{r['measured_ms']:.1f}", f"{r['spread_pct']:.1f}",
                  f"{r['error_pct']:+.1f}", str(r["within"] or "no"))  # fmt: skip
    Console().print(t)
    click.echo(f"mean |error| {doc['mean_abs_error_pct']} %, max {doc['max_abs_error_pct']} %; within 10 %: "
               f"{doc['within_10pct']}, within their spread: {doc['within_spread']}, outside both: {doc['outside']}; "
               f"written to {path}")  # fmt: skip
