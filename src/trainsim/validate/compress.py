"""``trainsim validate compress``: predicted vs measured step time of compressed DDP on emulated links.

    $ trainsim validate compress --quick
    $ trainsim validate compress --json > compress.json
    $ trainsim validate compress --rate 100 --algorithm onebit --algorithm topk

Per link (2 network namespaces joined by a shaped veth, ``trainsim.validate.netns``), the same steps
as ``validate dp``: profile the model alone once; calibrate the gloo all-reduce and all-gather on the link
(``trainsim.cluster.calibrate``); calibrate each algorithm's encode/decode on this machine with one
thread, like the workers (``trainsim.compress.secopa.calibrate_codec``); predict with
``trainsim.transform.compression.compression`` (or ``data_parallel`` for plain DDP) and the simulator;
measure real 2-process DDP with ``trainsim.run.hooks.compress_hook`` (this module's worker); print both.
The ``plan`` runs use a SeCoPa plan (PS topology, constants from the same calibrations) beside
"compress everything" with the same PS scheme and plain DDP ("compress nothing").

Without the rights to make namespaces it says so once and runs on unshaped loopback instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from trainsim.errors import UserError
from trainsim.validate import progress_log


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """One harness configuration."""

    model: str = "mlp"
    """zoo model"""
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

    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        algo = "plain DDP" if self.algorithm == "none" else self.algorithm + (f"({opts})" if opts else "")
        extra = f" {self.scheme}" if self.scheme != "allgather" else ""
        return f"{self.model} {_link(self.rate_mbit, self.delay_ms)} {algo}{extra}{' SeCoPa plan' if self.plan else ''}"


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


@dataclass(frozen=True, slots=True)
class RunResult:
    config: RunConfig
    predicted_ms: float
    measured_ms: float
    measured_steps_ms: list[float]
    where: str
    params_in_sync: bool = True
    passes: tuple[tuple[float, float], ...] = ()
    """``(predicted, measured)`` ms of each pass where there were several (``run_harness(passes=)``)"""
    run_queue_ms: float | None = None
    """the ranks' training threads' wait for a core, ms per measured step, the largest over the ranks
    (``run.ranks.ThreadClock``; None where the kernel does not say): time that the emulation's shared
    host, not the modelled cluster, put into the measurement"""
    threads: tuple[dict[str, dict[str, float]], ...] = ()
    """per rank, by thread name: CPU (``run_ms``) and run-queue wait (``wait_ms``) per measured step"""

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
            "where": self.where,
            "params_in_sync": self.params_in_sync,
            "run_queue_ms": None if self.run_queue_ms is None else round(self.run_queue_ms, 3),
            "threads": list(self.threads),
            **({"passes": [{"predicted_ms": round(a, 3), "measured_ms": round(b, 3)} for a, b in self.passes]}
               if self.passes else {}),
        }  # fmt: skip


def _link(rate: float | None, delay: float) -> str:
    return ("unshaped" if rate is None else f"{rate:g} Mbit/s") + (f" +{delay:g} ms" if delay else "")


def summary(results: list[RunResult]) -> dict[str, Any]:
    errs = [abs(r.error_pct) for r in results]
    return {
        "runs": [r.to_json() for r in results],
        "mean_abs_error_pct": round(sum(errs) / len(errs), 2) if errs else None,
        "max_abs_error_pct": round(max(errs), 2) if errs else None,
    }


MEASURE_S = 3.0
"""wall time that a run's measured steps fill at least (``measured_steps``)"""
MAX_STEP_FACTOR = 4
"""a fast run measures at most this many times the steps asked for"""


def measured_steps(steps: int, predicted_ms: float) -> int:
    """How many steps a run measures: a third of ``steps`` (at least 3) where a step is predicted to take
    over a second; else ``steps``, or more where they would not fill ``MEASURE_S`` seconds (at most
    ``MAX_STEP_FACTOR * steps``). On this 2-vCPU host fast steps (50 ms, onebit at 100 Mbit/s) move by
    +-15 % from one step to the next and by 10-20 % over runs of a dozen steps, so 12 steps (0.6 s) left
    a pass's median as far from the next pass's as the error the harness is there to measure."""
    if predicted_ms >= 1000.0:
        return max(3, steps // 3)
    want = math.ceil(MEASURE_S * 1e3 / max(predicted_ms, 1.0))
    return min(max(steps, want), MAX_STEP_FACTOR * steps)


HOOK_ROUNDS = 5
"""rounds of the one-process measurement of the hook's own work (``_hook_overhead_ms``)"""


def _hook_overhead_ms(
    wcfg: dict[str, Any], ccfg: Any, link: Any, params: Any, shapes: dict[str, Any]
) -> tuple[float, str | None]:  # fmt: skip
    """The compression hook's own host work per step beyond its codec, measured in one process: a
    one-rank group runs plain DDP and DDP with the hook, step by step in turn, in ``HOOK_ROUNDS``
    rounds, each after a timing of the codec (the worker's ``overhead`` mode). Per round, the paired step
    difference less the codec time the what-if charges for one rank (``codec_us_per_step(world=1)``,
    with that round's codec timing); the median over the rounds, at least 0, is the hook's
    bookkeeping (layouts, copies, futures, the non-finite markers). Returns it with why the process
    could not be pinned (None: pinned).

    The process runs on one core (``run.ranks.pin_to_core``), threads and all, as each rank of the
    runs has one core's worth of a host its ranks fill: free to use a second core, it hid the work
    that the hook's helper thread does beside the backward pass (every all-gather bucket's decode
    but the last, and the bookkeeping after it), and subtracting the full codec then under-counted
    the hook by that much: onebit 2.07-2.50 ms per step unpinned against 2.92-3.44 pinned (mlp,
    three rounds each, 2026-11-27; top-k 1.58-3.07 against 2.11-2.62; onebit PS, whose codec runs
    in the hook's own thread, 6.25-6.39 against 5.21-5.84)."""
    from trainsim.compress.secopa import CAL_SIZES
    from trainsim.transform.compression import CodecCost, codec_us_per_step
    from trainsim.validate.launch import launch

    cfg = {**wcfg, "overhead": True, "steps": max(4, int(wcfg["steps"]) // 3), "warmup": 2, "rounds": HOOK_ROUNDS,
           "pin": True}  # fmt: skip
    out = launch(1, ["-m", "trainsim.validate.compress", json.dumps(cfg)], net=None, timeout_s=300)
    data = json.loads(out[0].strip().splitlines()[-1])
    # the codec as fast as it ran in that process in the same second (not at the co-run speed, nor
    # minutes earlier: the hook's work read 0 and 8.9 ms per step for top-k in two sweeps with the
    # codec of the link's calibration; and one process's codec timings moved by 2x within a minute)
    own = []
    for r in data["rounds"]:
        cost = CodecCost.from_samples(ccfg.algorithm, list(CAL_SIZES), [r["codec_samples"]], dict(ccfg.options))
        own.append(r["diff_ms"] - codec_us_per_step(params, shapes, ccfg, cost, link, world=1) / 1e3)
    return max(0.0, float(statistics.median(own))), data.get("pin_error")


def _codec_key(c: RunConfig) -> str:
    """The key of ``c``'s codec among the calibrated costs (``_calibrate_codecs``): its algorithm and options."""
    return json.dumps([c.algorithm, c.options], sort_keys=True)


def _calibrate_codecs(group: list[RunConfig], log: Callable[[str], None], tag: str = "") -> dict[str, Any]:
    """Each algorithm's encode/decode among ``group``, calibrated now as the 2 ranks run it (2
    processes at once, one thread each), keyed by ``_codec_key``."""
    from trainsim.transform.compression import CodecCost

    out: dict[str, Any] = {}
    for c in group:
        key = _codec_key(c)
        if c.algorithm != "none" and key not in out:
            log(f"calibrating {c.algorithm} encode/decode{tag} (2 processes at once, one thread each)")
            out[key] = cost = CodecCost.calibrate(c.algorithm, concurrent=2, **c.options)
            mi = 1 << 20
            log(f"  per Mi elements: encode {cost.enc_us(mi) / 1e3:.2f} ms, decode {cost.dec_us(mi) / 1e3:.2f} ms, "
                f"decode-and-add {cost.dec_add_us(mi) / 1e3:.2f} ms")  # fmt: skip
    return out


def _plan_file(
    c: RunConfig, cost: Any, link: Any, names: list[tuple[str, int]], shapes: dict[str, Any], wd: Path
) -> Path:
    from trainsim.compress.secopa import plan_gradients
    from trainsim.transform.compression import _secopa_constants

    consts = _secopa_constants(cost, link, 2)
    eligible = [(n, k) for n, k in names if len(shapes[n]) >= 2 and k >= 1024]
    plan = plan_gradients(eligible, c.algorithm, cost.fits["ratio"], consts, topology="ps", world_size=2,
                          options=dict(c.options))  # fmt: skip
    path = wd / f"plan-{c.algorithm}-{c.rate_mbit}.yaml"
    plan.save(path)
    return path


def _predict_ms(
    prof: Any, c: RunConfig, ccfg: Any, costs: dict[str, Any], cal: Any, link: tuple[float | None, float],
    hook_ms: float, shapes: dict[str, tuple[int, ...]],
) -> float:  # fmt: skip
    """Predicted step of ``c`` from the profile ``prof`` (``validate.dp._Profiled``, at some host speed):
    plain DDP (``ccfg`` None, ``validate.dp.predict_ms``) or the compression what-if timed by the
    calibration ``cal`` and the codec costs, with DDP's and the hook's own host work (``hook_ms``)."""
    from trainsim.simulate.contention import simulate_contended
    from trainsim.transform.compression import CALLBACK_THREAD, compression
    from trainsim.transform.dataparallel import dp_step_ms
    from trainsim.validate.dp import RunConfig as DPRun
    from trainsim.validate.dp import predict_ms

    if ccfg is None:
        dpc = DPRun(model=c.model, rate_mbit=link[0], delay_ms=link[1])
        return predict_ms(prof, dpc, cal.predict_us, cpu_us=cal.cpu_us, slowdown=cal.slowdown,
                          concentration=float(dpc.world))  # fmt: skip
    # DDP's own work (and the wait for the slowest rank) as for plain DDP; the hook's inside each hook
    ccfg = dataclasses.replace(ccfg, host_overhead_us=prof.host_overhead_us(prof.ddp_overhead_ms),
                               finalize_us=prof.finalize_us(), hook_us=1e3 * hook_ms * prof.host_factor)  # fmt: skip
    p2p_us, p2p_us_per_byte = cal.p2p_line()
    g2 = compression(
        prof.graph, prof.params, prof.layers, shapes, ccfg, costs[_codec_key(c)],
        cal.link, allreduce_time=cal.predict_us, allgather_time=cal.allgather_us, p2p=(p2p_us, p2p_us_per_byte),
        duplex=cal.duplex_factor(), ps_lines=cal.ps_lines(),
        # the 2 ranks fill this host's 2 cores: a PS partition's transfer takes its CPU from the codec
        # it overlaps (``ps_pipeline_us``)
        xfer_cpu=cal.cpu_line(p2p=True),
    )  # fmt: skip
    # the decodes on the future's thread: the rank's own CPU on a host whose cores the ranks fill; the
    # ranks share this host's cores, so the rank that sets the step takes every rank's helper work
    # (``concentration``, docs/compress.md)
    res = simulate_contended(g2, cal.cpu_us, cal.slowdown, helper_threads=(CALLBACK_THREAD,),
                             concentration=float(ccfg.world))  # fmt: skip
    return dp_step_ms(res.step_ms, "ddp")


def run_harness(
    configs: list[RunConfig],
    *,
    steps: int = 12,
    warmup: int = 2,
    reps: int = 3,
    log: Callable[[str], None] = lambda s: None,
    passes: int = 1,
    pin: bool = False,
) -> tuple[list[RunResult], list[str]]:
    """Profile, calibrate, predict and measure every configuration; return results and notes.
    ``passes``: predict and measure each configuration that many times, every configuration of a link
    once per pass, and report the medians (``validate.dp.median_of_passes``). ``pin``: each rank of the
    measured runs on a core of its own (``run.ranks.pin_to_core``; the calibrations are not pinned). Off
    by default: pinned, the 1 Gbit/s runs measured 10-18 % above their predictions (docs/compress.md,
    "One core per rank")."""
    from trainsim.cluster.calibrate import calibrate, default_sizes
    from trainsim.compress.secopa import Plan
    from trainsim.models.zoo import build
    from trainsim.run.ranks import pin_refused_note, run_queue_ms
    from trainsim.transform.compression import CompressConfig
    from trainsim.validate.dp import _profile, interleaved_corun, median_of_passes
    from trainsim.validate.launch import launch
    from trainsim.validate.netns import Netns, netns_unavailable

    if passes < 1:
        raise UserError(f"validate compress: passes={passes}; expected >= 1")
    notes: list[str] = []
    reason = netns_unavailable()
    if reason is not None:
        notes.append(f"network namespaces unavailable ({reason}); running on unshaped loopback")
    tmp = tempfile.TemporaryDirectory(prefix="trainsim-compress-")
    wd = Path(tmp.name)
    try:
        profiled, shapes, names = {}, {}, {}
        for model in sorted({c.model for c in configs}):
            log(f"profiling {model} (one process, one thread)")
            # the 2 ranks share this machine's cores: the profile's CPU tasks are stretched by the co-run
            # factor (``validate dp``), read again during each run
            profiled[model] = prof = _profile(model, wd, steps=max(5, steps))
            log(f"  one process {prof.plain_ms:.1f} ms/step, two at once {prof.corun_ms:.1f} ms/step, "
                f"DDP's own work {prof.ddp_overhead_ms:.1f} ms/step ({prof.ddp_finalize_ms:.1f} after its "
                "last collective)")  # fmt: skip
            net_model, _ = build(model)
            shapes[model] = {n: tuple(p.shape) for n, p in net_model.named_parameters()}
            names[model] = [(n, p.numel()) for n, p in net_model.named_parameters()]
        results: list[RunResult] = []
        by_link: dict[tuple[float | None, float], list[RunConfig]] = {}
        for c in configs:
            by_link.setdefault((c.rate_mbit, c.delay_ms) if reason is None else (None, 0.0), []).append(c)
        for (rate, delay), group in by_link.items():
            max_msg = max(max(profiled[c.model].bucket_bytes) for c in group)
            # as validate dp: up to all of DDP's buckets, which gloo runs at once (``dataparallel.BACKEND_LANES``)
            total = max(sum(profiled[c.model].bucket_bytes) for c in group)
            sizes = sorted({*default_sizes(total), total})
            net_cm = Netns(2, rate_mbit=rate, delay_ms=delay) if reason is None else None
            # each algorithm's encode/decode, timed again for every link, and again for every pass:
            # like the co-run step time, the shared host's speed drifts over the minutes a sweep takes,
            # and a calibration shared by the passes moves all of them: at 1 Gbit/s every onebit
            # prediction of one run stood above the next run's in all three passes (the runs that ended
            # 2026-11-27 23:03 and 23:27 UTC: PS 51.4-53.1 ms against 41.5-42.4, the plan 41.1-42.1 against 34.4-37.2,
            # all-gather 34.7-34.9 against 31.0-31.4) while plain DDP's and the measured steps did
            # not move. The plans come from the first calibration
            costs = _calibrate_codecs(group, log)
            with net_cm if net_cm is not None else contextlib.nullcontext() as net:
                # compressed buckets travel by all-gather: time it too, up to ~1/8 of the largest bucket
                ag_sizes = default_sizes(max(4096, max_msg // 8))
                log(f"calibrating gloo all-reduce ({len(sizes)} sizes) and all-gather ({len(ag_sizes)}) "
                    f"on {_link(rate, delay)}")  # fmt: skip
                # a budget of 1 s per size: on slow links a 256 KiB all-gather takes ~150 ms, and a few
                # samples of it moved by +-10 % between calibrations
                cal = calibrate(world=2, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=reps, net=net,
                                allgather_sizes=ag_sizes, p2p_sizes=[4096, 256 << 10, 1 << 20],
                                budget_s=1.0)  # fmt: skip
                p2p_us, p2p_us_per_byte = cal.p2p_line()
                log(f"  point-to-point: {p2p_us:.0f} us + {p2p_us_per_byte * 1e3:.2f} us/KB, "
                    f"both ways at once x{cal.duplex_factor():.2f}")  # fmt: skip
                # every configuration of the link once per pass, the passes one after the other (as
                # ``validate dp``): the median over the passes drops a pass that a burst of load hit
                runs: list[list[RunResult]] = [[] for _ in group]
                hook_ms: dict[int, float] = {}  # the hook's own work, measured in the first pass
                plans: dict[int, Path] = {}  # SeCoPa plan files, from the link's first codec calibration
                for k in range(passes):
                    pass_costs = costs if k == 0 else _calibrate_codecs(group, log, f" (pass {k + 1}/{passes})")
                    for i, c in enumerate(group):
                        tag = f" (pass {k + 1}/{passes})" if passes > 1 else ""
                        wcfg: dict[str, Any] = {"model": c.model, "algorithm": c.algorithm, "options": c.options,
                                                "scheme": c.scheme, "steps": steps, "warmup": warmup,
                                                "interleave": True, "pin": pin}  # fmt: skip
                        ccfg = None
                        if c.algorithm != "none":
                            plan = None
                            if c.plan:
                                if i not in plans:
                                    cost = costs[_codec_key(c)]
                                    plans[i] = _plan_file(c, cost, cal.link, names[c.model], shapes[c.model], wd)
                                plan = Plan.load(plans[i])
                                wcfg["plan"] = str(plans[i])
                            ccfg = CompressConfig(algorithm=c.algorithm, options=c.options, scheme=c.scheme, plan=plan)
                            if i not in hook_ms:
                                hook_ms[i], refused = _hook_overhead_ms(wcfg, ccfg, cal.link, profiled[c.model].params,
                                                                        shapes[c.model])  # fmt: skip
                                msg = f"the hook's own work was measured unpinned (pinning refused: {refused})"
                                if refused and msg not in notes:
                                    notes.append(msg)
                                log(f"  the hook's own work beyond its codec: {hook_ms[i]:.2f} ms/step (one process)")

                        what = (c, ccfg, pass_costs, cal, (rate, delay), hook_ms.get(i, 0.0), shapes[c.model])
                        # slow runs (plain DDP on a slow link: seconds per step) measure fewer steps, fast
                        # ones more; the profile-time prediction decides
                        wcfg["steps"] = measured_steps(steps, _predict_ms(profiled[c.model], *what))
                        log(f"running {c.label()}{tag}, its steps interleaved with the plain loop")
                        out = launch(
                            2, ["-m", "trainsim.validate.compress", json.dumps(wcfg)], net=net, timeout_s=600
                        )
                        data = json.loads(out[0].strip().splitlines()[-1])
                        meas = [float(x) for x in data["step_ms"]]
                        # predicted at the host's speed during the run: the plain loop's steps between
                        # the measured ones (``validate.dp``, ``interleaved_corun``)
                        pred = _predict_ms(profiled[c.model].at_host_speed(interleaved_corun(data["corun_marks"])), *what)
                        threads = tuple(t or {} for t in data.get("threads", []))
                        res = RunResult(c, pred, float(statistics.median(meas)), meas, cal.where,
                                        bool(data.get("params_in_sync", True)), run_queue_ms=run_queue_ms(threads),
                                        threads=threads)  # fmt: skip
                        note = pin_refused_note([data.get("pin_error")])
                        if note and note not in notes:
                            notes.append(note)
                        waited = "" if res.run_queue_ms is None else (
                            f" (training threads waited up to {res.run_queue_ms:.1f} ms per step for a core)")
                        log(f"  predicted {res.predicted_ms:.1f} ms, measured {res.measured_ms:.1f} ms, "
                            f"error {res.error_pct:+.1f}%{waited}")  # fmt: skip
                        runs[i].append(res)
                for c, done in zip(group, runs, strict=True):
                    res = median_of_passes(done, *(["run_queue_ms"] if all(r.run_queue_ms is not None for r in done) else []))
                    if not res.params_in_sync:
                        notes.append(f"{c.label()}: ranks ended with different weights")
                    if passes > 1:
                        log(f"{c.label()}: median of {passes} passes {res.measured_ms:.1f} ms measured, "
                            f"{res.predicted_ms:.1f} ms predicted ({res.error_pct:+.1f}%)")  # fmt: skip
                    results.append(res)
        return results, notes
    finally:
        tmp.cleanup()


@click.command("compress")
@click.option("--quick", is_flag=True, help="2 runs at 100 Mbit/s (about a minute)")
@click.option("--rate", "rates", type=click.FloatRange(min=0, min_open=True), multiple=True, help="link rate(s) in Mbit/s for a custom set")
@click.option(
    "--algorithm", "algorithms", multiple=True, help="algorithm(s) for a custom set ('none' = plain DDP)"
)
@click.option("--model", default="mlp", show_default=True, help="zoo model")
@click.option("--steps", type=int, default=12, show_default=True, help=f"measured steps per run: a third of them where a step takes over a second, more (up to {MAX_STEP_FACTOR}x) where they would take under {MEASURE_S:g} s")
@click.option("--warmup", type=int, default=2, show_default=True, help="warm-up steps per run")
@click.option("--passes", type=int, default=1, show_default=True,
              help="runs per configuration, all configurations once per pass; the medians are reported")
@click.option("--pin", is_flag=True,
              help="each rank of the measured runs on a core of its own (run.ranks.pin_to_core; see docs/compress.md)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def compress_command(
    quick: bool, rates: tuple[float, ...], algorithms: tuple[str, ...], model: str, steps: int, warmup: int,
    passes: int, pin: bool, as_json: bool,
) -> None:  # fmt: skip
    """Predict compressed-DDP step times from a one-process profile, then run them on shaped links."""
    from rich.console import Console
    from rich.table import Table

    from trainsim.compress import make_codec
    from trainsim.models.zoo import MODELS

    if steps < 1 or warmup < 1:
        raise UserError(f"validate compress: steps={steps}, warmup={warmup}; expected >= 1 each")
    if passes < 1:
        raise UserError(f"validate compress: --passes {passes}; expected >= 1")
    if model not in MODELS:
        raise UserError(
            f"validate compress: unknown model {model!r}; expected one of {', '.join(sorted(MODELS))}"
        )
    if rates or algorithms:
        for a in algorithms:
            if a != "none":
                make_codec(a)
        configs = [RunConfig(model=model, rate_mbit=r, algorithm=a) for r in (rates or (100.0,))
                   for a in (algorithms or ("none", "onebit"))]  # fmt: skip
    else:
        configs = [RunConfig(**{**asdict(c), "model": model}) for c in (QUICK if quick else FULL)]
    err = Console(stderr=True)
    results, notes = run_harness(
        configs, steps=3 if quick else steps, warmup=warmup, reps=2 if quick else 3, passes=passes, pin=pin,
        log=progress_log(err),
    )  # fmt: skip
    for n in notes:
        err.print(f"[yellow]note:[/] {n}")
    out = summary(results)
    if as_json:
        click.echo(json.dumps({**out, "notes": notes}))
        return
    table = Table(title="validate compress: predicted vs measured step time")
    for col in ("run", "predicted ms", "measured ms", "error", "waiting for a core ms/step"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in results:
        wait = "-" if r.run_queue_ms is None else f"{r.run_queue_ms:.1f}"
        table.add_row(r.config.label(), f"{r.predicted_ms:.1f}", f"{r.measured_ms:.1f}", f"{r.error_pct:+.1f}%", wait)
    Console().print(table)
    click.echo(f"mean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}%")


# ---- the worker: one rank of compressed DDP (python -m trainsim.validate.compress JSON) ----------


def worker(cfg: dict[str, Any]) -> None:
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainsim.models.zoo import ZooSpec, build_with_batches
    from trainsim.run.hooks import CompressionState, hook_for
    from trainsim.run.ranks import ThreadClock, pin_to_core
    from trainsim.validate.dp_worker import alternating_ms, interleaved

    torch.set_num_threads(1)
    # before joining: gloo's threads, started then, inherit the core
    pin_error = pin_to_core(int(os.environ.get("RANK", "0"))) if cfg.get("pin") else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, batch = build_with_batches(cfg["model"], seed=0, spec=ZooSpec(batch_size=32))
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

    def wrap(m: Any) -> Any:
        net = DDP(m)
        if algo != "none":
            plan = None
            if cfg.get("plan"):
                from trainsim.compress.secopa import Plan

                plan = Plan.load(cfg["plan"])
            state = CompressionState(algo, model=m, scheme=cfg.get("scheme", "allgather"), plan=plan,
                                     gather=cfg.get("gather", "exchange"), **cfg.get("options", {}))  # fmt: skip
            net.register_comm_hook(state, hook_for(algo) if trace is None else traced(hook_for(algo)))
        return net

    if cfg.get("overhead"):  # one process: the hook's step vs plain DDP's, alternating
        # per round the codec timed in this process, then the two loops' steps in turn, so that the
        # harness subtracts the codec at the speed of the same second (``_hook_overhead_ms``)
        from trainsim.compress.secopa import CAL_SIZES
        from trainsim.transform.compression import codec_samples

        opts = dict(cfg.get("options", {}))
        nets = {"plain_ms": DDP(model), "hook_ms": wrap(copy.deepcopy(model))}
        loss = torch.nn.CrossEntropyLoss()
        rounds: list[dict[str, Any]] = []
        for k in range(int(cfg.get("rounds", HOOK_ROUNDS))):
            samples = codec_samples(algo, list(CAL_SIZES), 1, opts) if algo != "none" else {}
            paired = alternating_ms(nets, batch, loss, 0.01, int(cfg["warmup"]) if k == 0 else 1, int(cfg["steps"]))
            rounds.append({**paired, "codec_samples": samples})
        medians = {k: float(statistics.median(float(r[k]) for r in rounds)) for k in ("plain_ms", "hook_ms")}
        print(json.dumps({**medians, "rounds": rounds, "pin_error": pin_error}), flush=True)
        return
    plain_net = copy.deepcopy(model) if cfg.get("interleave") else None  # before DDP: the plain loop's copy
    net = wrap(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    warmup, steps = int(cfg["warmup"]), int(cfg["steps"])
    diag: dict[str, list[Any]] = {"cpu_ms": [], "main_thread_cpu_ms": [], "backward_ms": [], "forward_ms": []}
    clock = ThreadClock()  # every thread's CPU and run-queue wait over the measured steps

    def segment(w: int, n: int, first: int) -> list[float]:
        """``w + n + 1`` steps numbered from ``first``; their starts (the last ``n`` steps' host figures
        go to ``diag``)."""
        starts, cpu, main_cpu, bwd, fwd = [], [], [], [], []
        for step in range(first, first + w + n + 1):
            if step == first + w:
                clock.start()
                if trace is not None:
                    trace.clear()
            elif step == first + w + n:
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
        diag["cpu_ms"] += [(b - a) * 1e3 for a, b in itertools.pairwise(cpu)][w:]
        diag["main_thread_cpu_ms"] += [(b - a) * 1e3 for a, b in itertools.pairwise(main_cpu)][w:]
        diag["backward_ms"] += bwd[w:-1]
        diag["forward_ms"] += fwd[w:-1]
        return starts

    extra: dict[str, Any] = {}
    if plain_net is not None:  # the measured steps alternate with the plain loop (``dp_worker.interleaved``)
        step_ms, extra["corun_marks"] = interleaved(segment, plain_net, batch, loss_fn, 0.01, steps=steps,
                                                    warmup=warmup)  # fmt: skip
    else:
        starts = segment(warmup, steps, 0)
        step_ms = [(b - a) * 1e3 for a, b in itertools.pairwise(starts)][warmup:]
        if trace is not None:  # relative to the first measured step's start, ms
            t_ref = starts[warmup]
            diag["buckets"] = [(b, *(round((t - t_ref) * 1e3, 3) for t in ts)) for b, *ts in trace]
            diag["step_starts_ms"] = [round((t - t_ref) * 1e3, 3) for t in starts[warmup:]]
            diag["t_ref_s"] = [t_ref]  # time.perf_counter (CLOCK_MONOTONIC: one clock for every rank on a host)
    t = torch.tensor(step_ms, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check = torch.tensor(
        [sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64
    )
    both = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(both, check)
    in_sync = all(abs(float(b) - float(check)) <= 1e-6 * max(1.0, abs(float(check))) for b in both)
    threads: list[Any] = [None] * dist.get_world_size()  # per rank, by thread name: run and wait ms per step
    dist.all_gather_object(threads, clock.per_step(steps))
    if rank == 0 or trace is not None:  # traced: every rank's timeline (its own stdout)
        print(json.dumps({"step_ms": t.tolist(), "params_in_sync": in_sync, "rank0": diag, "pin_error": pin_error,
                          "cores": sorted(os.sched_getaffinity(0)), "threads": threads, **extra}), flush=True)  # fmt: skip
    dist.barrier()


if __name__ == "__main__":
    if len(sys.argv) != 2 or "RANK" not in os.environ:
        print(
            "usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python -m trainsim.validate.compress JSON"
        )
        sys.exit(2)
    worker(json.loads(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # skip gloo teardown (its threads can abort at exit on torch 2.13)
