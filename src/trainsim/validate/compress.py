"""``trainsim validate compress``: compressed-DDP step times predicted before the runs, then measured.

    $ trainsim validate calibrate                 # once per machine (``testbed.machine``)
    $ trainsim validate compress --quick
    $ trainsim validate compress --seed 7 --json --out compress.json
    $ trainsim validate compress --rate 100 --algorithm onebit --algorithm topk

The protocol of ``trainsim.validate.protocol``, as ``validate dp``:

1. **the machine**: the calibration file (generic collectives over loopback and one shaped link, the
   standard kernel alone and co-run); another machine's file is refused;
2. **profile**, one process alone, before any real run: each model as ``validate dp`` does
   (``validate.dp.profile_model``), and each algorithm's encode/decode timed on this machine in one
   process with one thread, at the generic sizes of ``compress.secopa.CAL_SIZES``
   (``transform.compression.CodecCost.calibrate``);
3. **predict** every configuration and freeze the predictions: the compression what-if
   (``transform.compression.compression``; plain DDP: ``validate.dp.predict_ms``) with every
   collective, all-gather and send timed by the machine calibration's model at the link's rate and
   latency (gloo's collectives two at once, the hook's all-gather beside them), the computation and
   the codec ``MachineCalibration.slowdown(2)`` slower (two ranks share this host), the transfers' host CPU (the loopback host cost, and a shaped link's cost per byte)
   charged to the computation they overlap; a ``plan`` configuration's SeCoPa plan (PS) is made here,
   from the same costs;
4. **measure**: real 2-process DDP with ``trainsim.run.hooks`` (this module's worker) on a shaped link
   per run, ``--passes`` passes interleaved; the ranks' threads' CPU and run-queue waits
   (``run.ranks.ThreadClock``) go to each run's ``diagnostics``, never to a prediction.

Besides the fixed configurations every invocation draws some from a seed that it prints and stores
(``draw_configs``): MLP width and depth, link rate and latency, algorithm and top-k ratio, scheme.
Without the rights to make namespaces it says so once and runs on unshaped loopback instead.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from trainsim.errors import UserError
from trainsim.validate.dp import MLP_DEFAULT, Profile, Profiler
from trainsim.validate.protocol import link_label, protocol_options

WORLD = 2
"""ranks of every run"""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """One harness configuration."""

    model: str = "mlp"
    """zoo model"""
    width: int = MLP_DEFAULT[0]
    """MLP hidden width (mlp only)"""
    depth: int = MLP_DEFAULT[1]
    """MLP linear layers (mlp only)"""
    rate_mbit: float | None = 100.0
    """link rate (None: unshaped)"""
    delay_ms: float = 0.0
    """added one-way latency"""
    algorithm: str = "none"
    """'none' = plain DDP; else a registered algorithm"""
    options: dict[str, Any] = field(default_factory=dict)
    """algorithm options"""
    scheme: str = "allgather"
    """allgather | ps | ring"""
    plan: bool = False
    """use a SeCoPa plan (PS) instead of compressing every eligible gradient"""

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise UserError(f"validate compress: rate={self.rate_mbit!r} Mbit/s; expected > 0")
        if not self.delay_ms >= 0:
            raise UserError(f"validate compress: delay={self.delay_ms!r} ms; expected >= 0")
        if self.model != "mlp" and (self.width, self.depth) != MLP_DEFAULT:
            raise UserError(f"validate compress: width/depth given for {self.model!r}; only the mlp has them")

    @property
    def model_key(self) -> tuple[str, int, int]:
        return (self.model, self.width, self.depth)

    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        algo = "plain DDP" if self.algorithm == "none" else self.algorithm + (f"({opts})" if opts else "")
        extra = f" {self.scheme}" if self.scheme != "allgather" else ""
        shape = f" w{self.width}d{self.depth}" if (self.width, self.depth) != MLP_DEFAULT else ""
        return (f"{self.model}{shape} {link_label(self.rate_mbit, self.delay_ms)} {algo}{extra}"
                f"{' SeCoPa plan' if self.plan else ''}")  # fmt: skip


def _runs(rate: float) -> list[RunConfig]:
    return [
        RunConfig(rate_mbit=rate),
        RunConfig(rate_mbit=rate, algorithm="onebit"),
        RunConfig(rate_mbit=rate, algorithm="topk", options={"ratio": 0.01}),
        RunConfig(rate_mbit=rate, algorithm="onebit", scheme="ps"),
        RunConfig(rate_mbit=rate, algorithm="onebit", scheme="ps", plan=True),
    ]


FULL: tuple[RunConfig, ...] = tuple(itertools.chain.from_iterable(_runs(r) for r in (20.0, 100.0, 1000.0)))
QUICK: tuple[RunConfig, ...] = (RunConfig(rate_mbit=100.0), RunConfig(rate_mbit=100.0, algorithm="onebit"))

# --------------------------------------------------------------------------- the draw
RATE_RANGE_MBIT = (20.0, 1000.0)
"""drawn link rates of compressed runs, log-uniform"""
PLAIN_RATE_RANGE_MBIT = (100.0, 1000.0)
"""drawn rates of plain DDP (its 2.4-9.5 MB per step: >= 100 Mbit/s bounds the run time)"""
DELAY_RANGE_MS = (0.5, 10.0)
"""drawn added latency, uniform, on half the drawn links"""
TOPK_RATIO_RANGE = (0.002, 0.05)
"""drawn top-k ratios, log-uniform"""


def draw_configs(seed: int, n: int) -> list[RunConfig]:
    """``n`` configurations drawn from ``seed`` (the same seed, the same draw): MLP width and depth,
    algorithm (plain DDP, onebit, top-k with a drawn ratio), scheme, link rate and latency."""
    from trainsim.validate.dp import MLP_DEPTHS, MLP_WIDTHS, _log_uniform

    rng = random.Random(seed)
    out: list[RunConfig] = []
    for _ in range(n):
        width, depth = rng.choice(MLP_WIDTHS), rng.choice(MLP_DEPTHS)
        algo = rng.choice(("none", "onebit", "onebit", "topk", "topk"))
        opts = {"ratio": round(_log_uniform(rng, *TOPK_RATIO_RANGE), 4)} if algo == "topk" else {}
        scheme = rng.choice(("allgather", "allgather", "ps")) if algo == "onebit" else "allgather"
        rate = round(_log_uniform(rng, *(PLAIN_RATE_RANGE_MBIT if algo == "none" else RATE_RANGE_MBIT)), 1)
        delay = round(rng.uniform(*DELAY_RANGE_MS), 1) if rng.random() < 0.5 else 0.0
        out.append(RunConfig(width=width, depth=depth, rate_mbit=rate, delay_ms=delay, algorithm=algo, options=opts,
                             scheme=scheme))  # fmt: skip
    return out


MEASURE_S = 3.0
"""wall time that a run's measured steps fill at least (``measured_steps``)"""
MAX_STEP_FACTOR = 4
"""a fast run measures at most this many times the steps asked for"""


def measured_steps(steps: int, predicted_ms: float) -> int:
    """How many steps a run measures, from its frozen prediction: a third of ``steps`` (at least 3)
    where a step is predicted to take over a second; else ``steps``, or more where they would not fill
    ``MEASURE_S`` seconds (at most ``MAX_STEP_FACTOR * steps``). On this 2-vCPU host fast steps move by
    +-15 % from one step to the next."""
    if predicted_ms >= 1000.0:
        return max(3, steps // 3)
    want = math.ceil(MEASURE_S * 1e3 / max(predicted_ms, 1.0))
    return min(max(steps, want), MAX_STEP_FACTOR * steps)


# --------------------------------------------------------------------------- the profile's codec timing
def _codec_key(c: RunConfig) -> str:
    """The key of ``c``'s codec among the timed costs: its algorithm and options."""
    return json.dumps([c.algorithm, c.options], sort_keys=True)


def time_codec(c: RunConfig) -> Any:
    """``c``'s encode/decode timed in this process, one thread, at the generic calibration sizes
    (``CodecCost.calibrate``): part of the profile step, before any real run."""
    from trainsim.transform.compression import CodecCost

    return CodecCost.calibrate(c.algorithm, threads=1, concurrent=1, **c.options)


def at_speed(cost: Any, factor: float) -> Any:
    """``cost`` with every encode/decode ``factor`` times slower (the co-run slowdown of the ranks)."""
    acc = cost.acc_us
    return dataclasses.replace(
        cost, enc_us=lambda n: factor * cost.enc_us(n), dec_us=lambda n: factor * cost.dec_us(n),
        acc_us=None if acc is None else (lambda n: factor * acc(n)),
    )  # fmt: skip


# --------------------------------------------------------------------------- the prediction
def model_link(mcal: Any, c: RunConfig) -> Any:
    """The link of ``c`` as the ring model sees it, from the machine calibration: one send's latency
    (host line + added delay) and the delivered rate (``efficiency`` of the nominal one, at 1 MB; unshaped:
    the host's per-byte cost of a send)."""
    from trainsim.cluster.catalog import Link

    a, b = mcal.p2p_line
    lat = a + c.delay_ms * 1e3
    if c.rate_mbit:
        bytes_per_us = c.rate_mbit * mcal.efficiency(c.rate_mbit, delay_ms=c.delay_ms) / 8.0
    else:
        bytes_per_us = 1.0 / max(b, 1e-6)
    return Link(name="machine-calibration", bw_gbyte_s=bytes_per_us / 1e3, latency_us=lat, source="testbed.machine")


def _plan(c: RunConfig, cost: Any, link: Any, names: list[tuple[str, int]], shapes: dict[str, Any]) -> Any:
    """The SeCoPa plan (PS) of ``c`` from the profile-time costs."""
    from trainsim.compress.secopa import plan_gradients
    from trainsim.transform.compression import _secopa_constants

    consts = _secopa_constants(cost, link, WORLD)
    eligible = [(n, k) for n, k in names if len(shapes[n]) >= 2 and k >= 1024]
    return plan_gradients(eligible, c.algorithm, cost.fits["ratio"], consts, topology="ps", world_size=WORLD,
                          options=dict(c.options))  # fmt: skip


def predict_ms(prof: Profile, c: RunConfig, mcal: Any, cost: Any, shapes: dict[str, tuple[int, ...]],
               plan: Any = None) -> dict[str, Any]:  # fmt: skip
    """Predicted step of ``c`` from the one-process profile ``prof``, the machine calibration ``mcal``
    and the codec ``cost`` timed in one process (None for plain DDP): ``validate.dp.predict_ms`` for
    plain DDP; else the compression what-if with DDP's own work and the wait for the slowest rank as
    for plain DDP, every collective from ``mcal``'s model, the codec and the computation at the co-run
    speed, simulated with the transfers' host CPU taken from the computation (every rank's helper
    work beside the rank that sets the step: ``concentration``)."""
    from trainsim.graph.ir import TaskKind
    from trainsim.testbed.contention import simulate_contended
    from trainsim.transform.compression import CALLBACK_THREAD, CompressConfig, compression
    from trainsim.transform.dataparallel import BACKEND_LANES, dp_step_ms
    from trainsim.transform.primitives import scale
    from trainsim.validate import dp

    dpc = dp.RunConfig(model=c.model, width=c.width, depth=c.depth, rate_mbit=c.rate_mbit, delay_ms=c.delay_ms,
                       world=WORLD)  # fmt: skip
    if c.algorithm == "none":
        return dp.predict_ms(prof, dpc, mcal)
    f = float(mcal.slowdown(WORLD))
    wait_ms = f * dp.straggler_ms([prof.plain_steps_ms] * WORLD)
    ccfg = CompressConfig(algorithm=c.algorithm, options=c.options, scheme=c.scheme, plan=plan, world=WORLD,
                          host_overhead_us=1e3 * (prof.ddp_overhead_ms * f + wait_ms),
                          finalize_us=1e3 * prof.ddp_finalize_ms * f, lanes=BACKEND_LANES["gloo"])  # fmt: skip
    link = model_link(mcal, c)
    a, b = mcal.p2p_line
    per_byte = b + (8.0 / (c.rate_mbit * mcal.efficiency(c.rate_mbit, delay_ms=c.delay_ms)) if c.rate_mbit else 0.0)
    p2p = (a + c.delay_ms * 1e3, per_byte)
    graph = scale(prof.graph, prof.graph.kind == TaskKind.CPU, f)
    g2 = compression(
        graph, prof.params, prof.layers, shapes, ccfg, at_speed(cost, f), link,
        allreduce_time=dp.comm_model(mcal, dpc),
        allgather_time=lambda s: float(mcal.allgather_us(s, world=WORLD, rate_mbit=c.rate_mbit, delay_ms=c.delay_ms)),
        p2p=p2p, duplex=1.0, ps_lines=(p2p, p2p), xfer_cpu=(a, b),
    )  # fmt: skip
    res = simulate_contended(g2, mcal.host_us, None, helper_threads=(CALLBACK_THREAD,), concentration=float(WORLD),
                             wire_cpu_us=dp.wire_cpu(mcal, c.rate_mbit, WORLD))  # fmt: skip
    return {"predicted_ms": round(dp_step_ms(res.step_ms, "ddp"), 3),
            "parts": {"corun_slowdown": round(f, 4), "straggler_ms": round(wait_ms, 3),
                      "codec_enc_us_per_mi": round(cost.enc_us(1 << 20), 1),
                      "codec_dec_us_per_mi": round(cost.dec_us(1 << 20), 1), "profile": prof.describe()}}  # fmt: skip


# --------------------------------------------------------------------------- the runs
def run_config(c: RunConfig, *, steps: int, warmup: int, plan_file: str | None, netns: bool) -> tuple[float, dict[str, Any]]:
    """Run ``c`` for real (2 ranks of this module's worker on a link shaped for it, or loopback); return
    the median step (the slowest rank's, ms) and the run's diagnostics."""
    from trainsim.run.ranks import run_queue_ms
    from trainsim.validate.dp import run_measured

    wcfg = {"model": c.model, "width": c.width, "depth": c.depth, "algorithm": c.algorithm, "options": c.options,
            "scheme": c.scheme, "steps": steps, "warmup": warmup, "plan": plan_file}  # fmt: skip
    step, diag, data = run_measured("trainsim.validate.compress", WORLD, wcfg, rate_mbit=c.rate_mbit,
                                    delay_ms=c.delay_ms, netns=netns)  # fmt: skip
    threads = tuple(t or {} for t in data.get("threads", []))
    rq = run_queue_ms(threads)
    diag.update({"run_queue_ms": None if rq is None else round(rq, 3), "threads": list(threads)})
    return step, diag


def model_shapes(key: tuple[str, int, int]) -> tuple[dict[str, tuple[int, ...]], list[tuple[str, int]]]:
    """The parameters of ``key`` = (model, width, depth): shapes by name, and (name, elements) in order."""
    from trainsim.models.zoo import ZooSpec, build

    net, _ = build(key[0], spec=ZooSpec(width=key[1], depth=key[2]))
    return {n: tuple(p.shape) for n, p in net.named_parameters()}, [(n, p.numel()) for n, p in net.named_parameters()]


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
    codec_timer: Callable[[RunConfig], Any] = time_codec,
    runner: Runner | None = None,
    passes: int = 3,
    steps: int = 12,
    warmup: int = 2,
    netns: bool = True,
    log: Callable[[str], None] = lambda s: None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Profile every model and codec, predict every configuration and freeze the predictions in
    ``out``, then run them ``passes`` times, interleaved; return the finished document (the first
    ``n_fixed`` configurations are the fixed ones, the rest ``held_out``)."""
    from trainsim.validate.dp import _workdir, measure_frozen, profile_models
    from trainsim.validate.protocol import config_row, open_result

    res = open_result(out, name="compress", seed=seed, passes=passes, meta=meta)
    n_fixed = len(configs) if n_fixed is None else n_fixed
    with _workdir() as wd:
        profs = profile_models({c.model_key for c in configs}, wd, profiler, steps=steps, log=log)
        shapes: dict[tuple[str, int, int], dict[str, tuple[int, ...]]] = {}
        names: dict[tuple[str, int, int], list[tuple[str, int]]] = {}
        for key in profs:
            shapes[key], names[key] = model_shapes(key)
        costs: dict[str, Any] = {}
        for c in configs:
            if c.algorithm != "none" and _codec_key(c) not in costs:
                log(f"timing {c.algorithm} encode/decode {c.options or ''} (one process, one thread)")
                costs[_codec_key(c)] = codec_timer(c)
        rows, plan_files = [], []
        for i, c in enumerate(configs):
            cost = costs.get(_codec_key(c))
            plan, plan_file = None, None
            if c.plan and cost is not None:
                plan = _plan(c, cost, model_link(mcal, c), names[c.model_key], shapes[c.model_key])
                plan_file = wd / f"plan-{i}.yaml"
                plan.save(plan_file)
            plan_files.append(None if plan_file is None else str(plan_file))
            pred = predict_ms(profs[c.model_key], c, mcal, cost, shapes[c.model_key], plan)
            rows.append(config_row(c, i, n_fixed, {**pred, "steps": measured_steps(steps, pred["predicted_ms"])}))

        def run(i: int, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
            if runner is not None:
                return runner(configs[i], row)
            return run_config(configs[i], steps=row["steps"], warmup=warmup, plan_file=plan_files[i], netns=netns)

        return measure_frozen(res, rows, configs, run, passes=passes, log=log)


@click.command("compress")
@click.option("--quick", is_flag=True, help="2 fixed and 2 drawn configurations, short runs (under 3 minutes)")
@click.option("--rate", "rates", type=click.FloatRange(min=0, min_open=True), multiple=True,
              help="link rate(s) in Mbit/s for a custom fixed set")
@click.option("--algorithm", "algorithms", multiple=True,
              help="algorithm(s) for a custom fixed set ('none' = plain DDP)")
@click.option("--model", default="mlp", show_default=True, help="zoo model of the fixed set")
@click.option("--steps", type=int, default=None,
              help=f"measured steps per run (default 12; 3 with --quick): a third of them where a step takes over a "
                   f"second, more (up to {MAX_STEP_FACTOR}x) where they would take under {MEASURE_S:g} s")
@click.option("--warmup", type=int, default=2, show_default=True, help="warm-up steps per run")
@protocol_options("compress")
def compress_command(
    quick: bool, rates: tuple[float, ...], algorithms: tuple[str, ...], model: str, steps: int | None, warmup: int,
    passes: int, seed: int | None, calibration: str | None, recalibrate: bool, out: str | None, force: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Predict compressed-DDP step times from a one-process profile, freeze them, then run them on shaped links."""

    from trainsim.compress import make_codec
    from trainsim.models.zoo import MODELS
    from trainsim.validate.dp import print_result
    from trainsim.validate.protocol import draw_seed, open_run

    steps = steps if steps is not None else 3 if quick else 12
    if steps < 1 or warmup < 1:
        raise UserError(f"validate compress: steps={steps}, warmup={warmup}; expected >= 1 each")
    if passes < 1:
        raise UserError(f"validate compress: --passes {passes}; expected >= 1")
    if model not in MODELS:
        raise UserError(f"validate compress: unknown model {model!r}; expected one of {', '.join(sorted(MODELS))}")
    for a in algorithms:
        if a != "none":
            make_codec(a)
    seed = draw_seed(seed)
    if rates or algorithms:
        fixed = [RunConfig(model=model, rate_mbit=r, algorithm=a) for r in (rates or (100.0,))
                 for a in (algorithms or ("none", "onebit"))]  # fmt: skip
    else:
        fixed = [dataclasses.replace(c, model=model) for c in (QUICK if quick else FULL)]
    configs = fixed + draw_configs(seed, 2 if quick else 5)
    path, log, mcal, cal_path, notes = open_run("compress", seed=seed, out=out, force=force, calibration=calibration,
                                                recalibrate=recalibrate, what=f"{len(configs)} configurations ({len(fixed)} fixed)")  # fmt: skip
    cmd = ("trainsim validate compress" + (" --quick" if quick else "") + "".join(f" --rate {r:g}" for r in rates)
           + "".join(f" --algorithm {a}" for a in algorithms) + f" --model {model} --steps {steps} --warmup {warmup}"
           f" --passes {passes} --seed {seed}")  # fmt: skip
    meta = {"command": cmd, "calibration": mcal.describe(cal_path), "quick": quick, "passes": passes, "notes": notes,
            "method": "predicted from a one-process profile (trace, untraced steps, DDP's own work alone, the codec "
                      "timed in one process), the machine calibration and the config; frozen before any run"}  # fmt: skip
    try:
        doc = run_validation(configs, path, seed=seed, mcal=mcal, n_fixed=len(fixed), passes=passes, steps=steps,
                             warmup=warmup, netns=not notes, log=log, meta=meta)  # fmt: skip
    except KeyboardInterrupt:
        raise UserError(f"validate compress: interrupted; what was measured is in {path}, marked partial") from None
    print_result(doc, "validate compress", path, as_json)


# ---- the worker: one rank of compressed DDP (python -m trainsim.validate.compress JSON) ----------


def worker(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainsim.models.zoo import ZooSpec, build_with_batches
    from trainsim.run.hooks import CompressionState, hook_for
    from trainsim.run.ranks import ThreadClock, slowest_and_in_sync, write_result

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    spec = ZooSpec(batch_size=32, width=int(cfg.get("width", 1024)), depth=int(cfg.get("depth", 4)))
    model, batch = build_with_batches(cfg["model"], seed=0, spec=spec)
    algo = cfg["algorithm"]
    # ``"trace": true``: per bucket and step, when the hook was entered, when it returned (encode and
    # issue done, on the autograd thread) and when its future completed (transfer and decode done)
    trace: list[tuple[int, float, float, float]] | None = [] if cfg.get("trace") else None

    def traced(hook: Any) -> Any:
        def run(state: Any, bucket: Any) -> Any:
            t0 = time.perf_counter()
            fut = hook(state, bucket)
            t1 = time.perf_counter()

            def done(f: Any) -> Any:
                if trace is not None:
                    trace.append((int(bucket.index()), t0, t1, time.perf_counter()))
                return f.value()

            return fut.then(done)

        run.__annotations__ = {}  # DDP checks annotations as objects; these are strings here
        return run

    net = DDP(model)
    if algo != "none":
        plan = None
        if cfg.get("plan"):
            from trainsim.compress.secopa import Plan

            plan = Plan.load(cfg["plan"])
        state = CompressionState(algo, model=model, scheme=cfg.get("scheme", "allgather"), plan=plan,
                                 gather=cfg.get("gather", "exchange"), **cfg.get("options", {}))  # fmt: skip
        net.register_comm_hook(state, hook_for(algo) if trace is None else traced(hook_for(algo)))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    warmup, steps = int(cfg["warmup"]), int(cfg["steps"])
    diag: dict[str, list[Any]] = {"cpu_ms": [], "main_thread_cpu_ms": [], "backward_ms": [], "forward_ms": []}
    clock = ThreadClock()  # every thread's CPU and run-queue wait over the measured steps
    starts, cpu, main_cpu, bwd, fwd = [], [], [], [], []
    for step in range(warmup + steps + 1):
        if step == warmup:
            clock.start()
            if trace is not None:
                trace.clear()
        elif step == warmup + steps:
            clock.stop()
        starts.append(time.perf_counter())
        cpu.append(time.process_time())
        main_cpu.append(time.thread_time())
        x, y = batch(step * 1000 + rank)
        opt.zero_grad(set_to_none=True)
        tf = time.perf_counter()
        loss = loss_fn(net(x), y)
        t0 = time.perf_counter()
        fwd.append((t0 - tf) * 1e3)
        loss.backward()  # with DDP: until every bucket's hook future is done
        bwd.append((time.perf_counter() - t0) * 1e3)
        opt.step()
    diag["cpu_ms"] = [(b - a) * 1e3 for a, b in itertools.pairwise(cpu)][warmup:]
    diag["main_thread_cpu_ms"] = [(b - a) * 1e3 for a, b in itertools.pairwise(main_cpu)][warmup:]
    diag["backward_ms"], diag["forward_ms"] = bwd[warmup:-1], fwd[warmup:-1]
    step_ms = [(b - a) * 1e3 for a, b in itertools.pairwise(starts)][warmup:]
    if trace is not None:  # relative to the first measured step's start, ms
        t_ref = starts[warmup]
        diag["buckets"] = [(b, *(round((t - t_ref) * 1e3, 3) for t in ts)) for b, *ts in trace]
        diag["step_starts_ms"] = [round((t - t_ref) * 1e3, 3) for t in starts[warmup:]]
        diag["t_ref_s"] = [t_ref]  # time.perf_counter (CLOCK_MONOTONIC: one clock for every rank on a host)
    slowest, in_sync, _ = slowest_and_in_sync(step_ms, model)
    threads: list[Any] = [None] * dist.get_world_size()  # per rank, by thread name: run and wait ms per step
    dist.all_gather_object(threads, clock.per_step(steps))
    if rank == 0 or trace is not None:  # traced: every rank's timeline (its own stdout)
        write_result(out, {"step_ms": slowest, "params_in_sync": in_sync, "rank0": diag,
                           "cores": sorted(os.sched_getaffinity(0)), "threads": threads})  # fmt: skip
    dist.barrier()


if __name__ == "__main__":  # one rank (rank_main's protocol), started by ``run_config`` through run_json
    from trainsim.run.ranks import rank_main

    rank_main(worker, "one rank of a real compressed DDP run (started by trainsim validate compress)")
