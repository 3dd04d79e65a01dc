"""``trainsim validate pipeline``: pipeline schedules on 2 processes, predicted before they are measured.

    $ trainsim validate calibrate                  # once per machine (``testbed.machine``)
    $ trainsim validate pipeline --quick
    $ trainsim validate pipeline --microbatches 4 --microbatches 8 --seed 7 --json --out pipe.json

The protocol of ``trainsim.validate.protocol``, per configuration ``(schedule, stages per rank,
microbatches, model, link)``:

1. **profile** the model in one process, as a user would: the per-layer profile at every microbatch
   size (``capture.layerprofile.profile_layers``) and torch's pipeline runtime's own time per compute
   action outside the stage's compute calls, on one stage without communication (``runtime_dispatch_us``),
   and per SEND or RECV action outside posting it, on a generic two-rank exchange of the model's
   activation size over loopback (``runtime_p2p_us``); no schedule runs;
2. **predict** each configuration by replaying the lowered action order of the schedule
   (``transform.pipeline.predict_pipeline``; the stage split is the plan's, ``choose_split``) with a
   link taken from the machine calibration alone (``pipe_link``): the host work of one message,
   the calibration's one-way send line over loopback (``MachineCalibration.p2p_line``) plus, on a
   shaped link, the computation lost per byte sent (``MachineCalibration.wire_cpu_us_per_byte``), half
   on the sender's thread and half on the receiver's; the bytes at the link's rate times the delivered
   fraction of a shaped link (``efficiency``, at 1 MB) and the link's latency in flight; and the two ranks
   that share this host computing ``MachineCalibration.slowdown(2)`` slower while both compute;
3. **freeze** every prediction in the result file (``predictions_frozen_at``);
4. **measure** each configuration with ``trainsim.run.pipeline`` (torch's own runtime, the same action
   order; each rank and its gloo threads on a core of their own, ``PIN_RANKS``), once per pass,
   interleaved, ``--passes`` passes. What a run reads about itself (its step
   median and minimum, how long its threads waited for a core, the wall time of posting a send or a
   receive) goes to that pass's ``diagnostics``, never into a prediction.

The result holds ``protocol.ranking`` over every pair of configurations, and the same restricted to
pairs of one model and link at one microbatch count (``ranking_same_m``). Besides the fixed
configurations every invocation draws a held-out case from a seed it prints and stores
(``draw_case``; ``--seed`` repeats it): transformer depth, link rate and latency, schedules and
microbatch counts.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trainsim.cli.options import us_to_ms
from trainsim.errors import UserError
from trainsim.validate import progress_log
from trainsim.validate.protocol import ConfigRunner, link_label, protocol_options

if TYPE_CHECKING:
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.graph.ir import TaskGraph
    from trainsim.run.pipeline import PipeRunConfig
    from trainsim.simulate.engine import SimResult
    from trainsim.testbed.machine import MachineCalibration
    from trainsim.transform.pipeline import P2PLink

SCHEDULE_SET: tuple[tuple[str, int], ...] = (
    ("GPipe", 1),
    ("1F1B", 1),
    ("InterleavedZeroBubble", 1),
    ("Interleaved1F1B", 2),
    ("ZBVZeroBubble", 2),
    ("DualPipeV", 2),
)
"""(schedule, stages per rank) measured by default: single-stage and two-stage (interleaved, V) ones."""

DRAW_BLOCKS = (3, 4, 5, 6, 8)
"""drawn transformer depths"""
DRAW_MICROBATCHES = (2, 4, 8, 16)
"""drawn microbatch counts (each divides the batch of 32)"""
RANKS = 2
PIN_RANKS = True
"""the real runs keep each rank on a core of its own (``run.ranks.pin_to_core``): unpinned, the two
ranks' threads migrate between this host's two cores and the runs of one configuration spread wider
(figures in docs/log/validate.md)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipeCase:
    """One model and link, and the (schedule, microbatches) configurations run on it."""

    model: str = "transformer"
    blocks: int = 6
    batch_size: int = 32
    microbatches: tuple[int, ...] = (4, 8, 16)
    schedules: tuple[tuple[str, int], ...] = SCHEDULE_SET
    pairs: tuple[tuple[str, int, int], ...] = ()
    """(schedule, stages per rank, microbatches) to run instead of every schedule at every count"""
    rate_mbit: float | None = 1000.0
    """None: unshaped"""
    delay_ms: float = 0.0
    drawn: bool = False
    """drawn from the seed (held-out configurations)"""

    def zoo(self) -> dict[str, int]:
        return {"blocks": self.blocks} if self.model == "transformer" else ({"depth": self.blocks} if self.model == "mlp" else {})

    def configs(self) -> list[tuple[str, int, int]]:
        """``(schedule, stages per rank, microbatches)`` of every configuration, microbatches outermost."""
        return list(self.pairs) or [(n, s, m) for m in self.microbatches for n, s in self.schedules]


QUICK = PipeCase(microbatches=(4,), schedules=(("GPipe", 1), ("1F1B", 1), ("ZBVZeroBubble", 2)))
FULL = PipeCase()


def check_case(case: PipeCase) -> None:
    """Refuse bad input before any process starts."""
    from trainsim.run.pipeline import PipeRunConfig

    for name, spr, m in case.configs():
        PipeRunConfig(model=case.model, schedule=name, stages_per_rank=spr, microbatches=m, batch_size=case.batch_size,
                      blocks=case.blocks)  # fmt: skip


def draw_case(seed: int, quick: bool) -> PipeCase:
    """A held-out case from ``seed`` (the same seed, the same case): a transformer of a drawn depth on a
    link of a drawn rate and latency, with 2 (``quick``) or 4 drawn (schedule, microbatches) pairs."""
    from trainsim.validate.ooo import DELAYS_MS, RATE_RANGE_MBIT

    rng = random.Random(seed)
    lo, hi = (math.log(x) for x in RATE_RANGE_MBIT)
    blocks = rng.choice(DRAW_BLOCKS)
    rate = round(math.exp(rng.uniform(lo, hi)), -1)
    delay = rng.choice(DELAYS_MS)
    pairs: list[tuple[str, int, int]] = []
    for name, spr in rng.sample(SCHEDULE_SET, 2 if quick else 4):
        ms = [m for m in DRAW_MICROBATCHES if not (name == "DualPipeV" and m < RANKS * spr)]
        pairs.append((name, spr, rng.choice(ms)))
    case = PipeCase(blocks=blocks, pairs=tuple(pairs), rate_mbit=rate, delay_ms=delay, drawn=True)
    check_case(case)
    return case


# --------------------------------------------------------------------------- prediction
def pipe_link(mc: MachineCalibration, rate_mbit: float | None, delay_ms: float) -> P2PLink:
    """A point-to-point link from the machine calibration alone (module docstring, step 2): per message
    the one-way send line's host work and, on a shaped link, the computation lost per byte sent
    (``MachineCalibration.wire_cpu_us_per_byte``), half on each end's thread; latency and bytes on the wire."""
    from trainsim.cluster.catalog import Link
    from trainsim.transform.pipeline import P2PLink

    a, b = mc.p2p_line
    us_per_byte = 8 / (rate_mbit * mc.efficiency(rate_mbit, delay_ms=delay_ms)) if rate_mbit else 0.0
    bw = 1 / (us_per_byte * 1e3) if us_per_byte > 0 else 1e6 / 8  # GB/s; unshaped: the host's work is the cost
    wire = Link(name="machine-calibration", bw_gbyte_s=bw, latency_us=delay_ms * 1e3, source="testbed.machine")
    lost = mc.wire_cpu_us_per_byte(rate_mbit)
    return P2PLink(wire=wire, cpu_us=a / 2, cpu_us_per_byte=(b + lost) / 2)


@dataclass(frozen=True, slots=True)
class CaseProfile:
    """What step 1 measured for one case: the per-layer profile at every microbatch size, and the
    runtime's cost per compute action at every microbatch count."""

    prof: LayerProfile
    action_overhead_us: dict[int, float]
    p2p_action_us: float = 0.0
    """the runtime's own work per SEND or RECV action outside posting it (``runtime_p2p_us``)"""


def profile_case(case: PipeCase, *, p2p: bool = True) -> CaseProfile:
    """Step 1 of the module docstring (before any real run); ``p2p=False``: the one-process part alone
    (``CaseProfile.p2p_action_us`` 0)."""
    from trainsim.capture.layerprofile import profile_layers

    ms = sorted({m for _, _, m in case.configs()})
    micro = tuple(sorted({case.batch_size // m for m in ms}))
    prof = profile_layers(case.model, batch_sizes=micro, reps=20, zoo=case.zoo())
    over = {m: runtime_dispatch_us(prof, case.batch_size // m, microbatches=m, zoo=case.zoo()) for m in ms}
    return CaseProfile(prof, over, runtime_p2p_us(activation_bytes(prof, min(micro))) if p2p else 0.0)


def activation_bytes(prof: LayerProfile, micro_bs: int) -> int:
    """The message size of the generic exchange: the median output of the model's layers at ``micro_bs``."""
    import statistics

    return max(4, int(statistics.median(int(r["out_bytes"]) for r in prof.table(micro_bs))))


def runtime_p2p_us(size_bytes: int) -> float:
    """What torch's pipeline runtime spends per SEND or RECV action outside the posting call, which
    ``pipe_link`` charges from the machine calibration: two ranks on loopback, each a core of its own,
    exchanging ``size_bytes`` messages as the runtime posts them (``run.pipeline.run_exchange``: the
    action's profiler range, its operation list, keeping the work handles); the mean of the send's and
    the receive's medians. A generic exchange, not a validated schedule: no model, no link shaping."""
    from trainsim.run.pipeline import ExchangeConfig, run_exchange

    got = run_exchange(ExchangeConfig(size_bytes=size_bytes, pin=PIN_RANKS))
    return (got["send_book_us"] + got["recv_book_us"]) / 2


def dispatch_per_action_us(step_s: float, chunk_s: float, loss_us: float, microbatches: int) -> float:
    """The runtime's own time per compute action (µs) from one step of ``2 * microbatches`` actions (F
    then B per microbatch) on one stage: the step's wall time (``step_s``) less the time inside the
    stage's compute calls (``chunk_s``) and less the loss, which the profile already charges to the
    last stage's F (``loss_us`` per microbatch)."""
    if microbatches < 1 or step_s < 0 or chunk_s < 0:
        raise UserError(f"step_s={step_s}, chunk_s={chunk_s}, microbatches={microbatches}; expected >= 0 and >= 1")
    return max(0.0, (1e6 * (step_s - chunk_s) - microbatches * loss_us) / (2 * microbatches))


def runtime_dispatch_us(prof: LayerProfile, micro_bs: int, *, microbatches: int, zoo: dict[str, Any] | None = None,
                        reps: int = 6) -> float:  # fmt: skip
    """What torch's pipeline runtime spends per compute action outside the stage's compute calls,
    measured in one process as a user would (no schedule, no communication): the whole model as one
    ``PipelineStage`` in a 1-rank gloo group, ``microbatches`` forwards then as many full backwards per
    step, the stage's ``forward_one_chunk`` / ``backward_one_chunk`` timed inside the step
    (``run.pipeline._time_stage_calls``); the median over ``reps`` steps of ``dispatch_per_action_us``.

    The step and its parts are timed in the same call, so a slow spell of the host moves both (a
    reference loop timed beside the runtime, the earlier measure, read 0 per action: docs/log/validate.md)."""
    import datetime
    import statistics

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

    from trainsim.models.zoo import ZooSpec, build_with_batches
    from trainsim.run.pipeline import _time_stage_calls

    old = torch.get_num_threads()
    torch.set_num_threads(prof.threads)
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        model, batches = build_with_batches(prof.model, spec=ZooSpec(batch_size=micro_bs * microbatches, **(zoo or {})))
        stage = PipelineStage(model, 0, 1, torch.device("cpu"))
        inside = _time_stage_calls([stage])
        rt = _PipelineScheduleRuntime([stage], microbatches, loss_fn=nn.CrossEntropyLoss())
        kinds = (_ComputationType.FORWARD, _ComputationType.FULL_BACKWARD)
        order: Any = {0: [_Action(0, k, m) for k in kinds for m in range(microbatches)]}
        rt.pipeline_order = dict(order)
        rt._prepare_schedule_with_comms(order)
        per: list[float] = []
        for rep in range(reps + 2):
            x, y = batches(rep)
            inside.clear()
            t0 = time.perf_counter()
            rt.step(x, target=y, losses=[])
            step_s = time.perf_counter() - t0
            model.zero_grad(set_to_none=True)
            if rep >= 2:  # the first two steps warm the runtime up
                chunk_s = inside.get("F", 0.0) + inside.get("B", 0.0)
                per.append(dispatch_per_action_us(step_s, chunk_s, prof.loss_us(micro_bs), microbatches))
    finally:
        if own_group:
            dist.destroy_process_group()
        torch.set_num_threads(old)
    return float(statistics.median(per))


def predict_config(case: PipeCase, cp: CaseProfile, mc: MachineCalibration, name: str, spr: int, m: int) -> dict[str, Any]:
    """The frozen prediction of one configuration: ``predicted_ms``, the planned ``split`` and the
    model's terms. Reads nothing but the profile, the machine calibration and the case."""
    import numpy as np

    from trainsim.testbed.contention import simulate_with_host_cpu
    from trainsim.transform.pipeline import PipeSpec, predict_pipeline

    link = pipe_link(mc, case.rate_mbit, case.delay_ms)
    corun = max(1.0, mc.slowdown(RANKS))
    spec = PipeSpec(schedule=name, stages_per_rank=spr, microbatches=m)

    def replay(g: TaskGraph) -> SimResult:  # ranks sharing this host's cores compute slower beside each other
        return simulate_with_host_cpu(g, np.zeros(g.n_tasks), corun_factor=corun)

    pred = predict_pipeline(cp.prof, spec, batch_size=case.batch_size, link=link, overhead_us=cp.action_overhead_us[m],
                            replay=replay, p2p_overhead_us=cp.p2p_action_us)  # fmt: skip
    return {"predicted_ms": round(pred.step_ms, 3), "split": [len(s) for s in pred.split],
            "model_terms": {"action_overhead_us": round(cp.action_overhead_us[m], 1),
                            "p2p_action_us": round(cp.p2p_action_us, 1), "corun_slowdown": round(corun, 4),
                            "link": {"bw_gbit_s": round(link.wire.bw_gbyte_s * 8, 4), "latency_us": link.wire.latency_us,
                                     "cpu_us": round(link.cpu_us, 1), "cpu_us_per_byte": link.cpu_us_per_byte}}}  # fmt: skip


# --------------------------------------------------------------------------- the harness
Runner = ConfigRunner
"""``runner(config, pass_index)`` (``validate.protocol.ConfigRunner``)"""
Profiler = Callable[[PipeCase], CaseProfile]


def run_pipeline_validation(
    cases: list[PipeCase] | tuple[PipeCase, ...],
    out: Path,
    *,
    seed: int,
    mc: MachineCalibration,
    calibration: dict[str, Any] | None = None,
    passes: int = 3,
    steps: int = 8,
    warmup: int = 2,
    runner: Runner | None = None,
    profiler: Profiler = profile_case,
    shaped: bool | None = None,
    log: Callable[[str], None] = lambda s: None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Profile and predict every configuration of ``cases`` (frozen in ``out`` before the first real
    run), then run them ``passes`` times, interleaved; return the finished document. ``runner``,
    ``profiler``, ``shaped``: as in ``validate.ooo.run_ooo_validation``."""
    from trainsim.validate.protocol import ResultFile, freeze_and_run, now_iso, shaping, write_json

    if passes < 1:
        raise UserError(f"validate pipeline: passes={passes}; expected >= 1")
    for c in cases:
        check_case(c)
    shaped, notes = shaping(shaped)
    meta = dict(meta or {})
    res = ResultFile(out, command=meta.pop("command", "run_pipeline_validation"), seed=seed, calibration=calibration,
                     passes=passes, steps=steps, warmup=warmup, notes=notes, **meta)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for case in cases:
        if not shaped:
            case = replace(case, rate_mbit=None, delay_ms=0.0)
        link = link_label(case.rate_mbit, case.delay_ms)
        log(f"profiling {case.model} x{case.blocks} (one process, one thread) and the runtime's cost per action")
        cp = profiler(case)
        for name, spr, m in case.configs():
            pred = predict_config(case, cp, mc, name, spr, m)
            cfg = {"schedule": name, "stages_per_rank": spr, "microbatches": m, "split": pred.pop("split"),
                   "model": case.model, "blocks": case.blocks, "batch_size": case.batch_size,
                   "rate_mbit": case.rate_mbit, "delay_ms": case.delay_ms}  # fmt: skip
            label = f"{name}/{spr} M={m}, {case.model} x{case.blocks}, {link}" + (" *" if case.drawn else "")
            rows.append({"label": label, "config": cfg, "held_out": case.drawn, **pred, "predicted_at": now_iso()})
            log(f"  {label}: split {cfg['split']}, predicted {pred['predicted_ms']:.2f} ms")
    doc = freeze_and_run(res, rows, runner=runner, passes=passes, log=log,
                         real_runner=lambda: real_runner(steps=steps, warmup=warmup, shaped=bool(shaped)))  # fmt: skip
    doc["ranking_same_m"] = ranking_same_m(doc["runs"])
    write_json(out, doc)
    return doc


def ranking_same_m(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``protocol.ranking`` within each group of one model, link and microbatch count, summed."""
    from trainsim.validate.protocol import ranking

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        c = r["config"]
        groups.setdefault((c["model"], c["blocks"], c["rate_mbit"], c["delay_ms"], c["microbatches"]), []).append(r)
    parts = [ranking(g) for g in groups.values()]
    wrong = [p for part in parts for p in part["misranked"]]
    return {"pairs_checked": sum(p["pairs_checked"] for p in parts), "misranked": wrong, "right": not wrong}


@contextlib.contextmanager
def real_runner(*, steps: int, warmup: int, shaped: bool) -> Iterator[Runner]:
    """A runner of real ``run.pipeline`` jobs, one gloo process per namespace of an emulated network
    of each configuration's link (``validate.ooo.emulated_links``)."""
    from trainsim.run.pipeline import run_pipeline
    from trainsim.run.ranks import free_port, run_queue_ms
    from trainsim.validate.ooo import emulated_links

    with emulated_links(shaped) as link:

        def run(cfg: dict[str, Any], p: int) -> tuple[float, dict[str, Any]]:
            popen, master = link(cfg["rate_mbit"], cfg["delay_ms"])
            got = run_pipeline(run_config(cfg, steps=steps, warmup=warmup), popen=popen, master=master, port=free_port())
            waited = run_queue_ms([r.get("threads", {}) for r in got["ranks"]])
            return got["step_ms"], {"step_median_ms": round(got["step_median_ms"], 3),
                                    "step_min_ms": round(got["step_min_ms"], 3),
                                    "run_queue_ms": None if waited is None else round(waited, 3),
                                    "post_us": post_us_per_op(got["ranks"])}  # fmt: skip

        yield run


def run_config(cfg: dict[str, Any], *, steps: int, warmup: int) -> PipeRunConfig:
    """The real run of one configuration (a row's ``config``), ranks pinned as ``PIN_RANKS`` says."""
    from trainsim.run.pipeline import PipeRunConfig

    return PipeRunConfig(model=cfg["model"], schedule=cfg["schedule"], stages_per_rank=cfg["stages_per_rank"],
                         microbatches=cfg["microbatches"], batch_size=cfg["batch_size"], split=tuple(cfg["split"]),
                         blocks=cfg["blocks"], steps=steps, warmup=warmup, pin=PIN_RANKS)  # fmt: skip


def post_us_per_op(ranks: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per rank of a run (``run_pipeline``'s ``ranks``): the wall time of posting one operation (µs), by
    what the batch posted (``send``, ``recv``, ``send+recv``; ``trainsim.run.pipeline._time_p2p_calls``)."""
    out = []
    for r in ranks:
        ms, ops = r.get("p2p_ms_per_step", {}), r.get("p2p_ops_per_step", {})
        out.append({k: round(1e3 * ms["post:" + k] / n, 1) for k, n in ops.items() if n > 0})
    return out


# --------------------------------------------------------------------------- the command
@click.command("pipeline")
@click.option("--quick", is_flag=True, help="3 fixed schedules at 4 microbatches and 2 drawn configurations (< 3 min)")
@click.option("--microbatches", "mbs", type=click.IntRange(min=1), multiple=True, help="microbatch counts (default 4, 8, 16)")
@click.option("--schedule", "schedules", multiple=True, help="SCHEDULE or SCHEDULE/STAGES_PER_RANK (default: all)")
@click.option("--blocks", type=click.IntRange(min=1), default=6, show_default=True, help="transformer blocks")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1000.0, show_default=True, help="link rate, Mbit/s")
@click.option("--latency-us", "delay", type=click.FloatRange(min=0), default=0.0, show_default=True, callback=us_to_ms,
              help="added one-way latency, us")
@click.option("--steps", type=click.IntRange(min=1), default=8, show_default=True, help="measured steps per run")
@protocol_options("pipeline")
def pipeline_command(
    quick: bool, mbs: tuple[int, ...], schedules: tuple[str, ...], blocks: int, batch_size: int, rate: float,
    delay: float, steps: int, seed: int | None, passes: int, calibration: str | None, recalibrate: bool, out: str | None,
    force: bool, as_json: bool,
) -> None:  # fmt: skip
    """Predict GPipe, 1F1B, interleaved and zero-bubble schedules on 2 processes from a profile and the
    machine calibration, freeze the predictions, then measure them."""
    from rich.console import Console

    from trainsim.testbed.machine import load_machine
    from trainsim.validate.ooo import headline, print_table
    from trainsim.validate.protocol import check_result_path, draw_seed

    if passes < 1:
        raise UserError(f"validate pipeline: --passes {passes}; expected >= 1")
    base = QUICK if quick else FULL
    scheds = tuple(_parse_schedule(s) for s in schedules) or base.schedules
    case = PipeCase(model="transformer", blocks=blocks, batch_size=batch_size, microbatches=mbs or base.microbatches,
                    schedules=scheds, rate_mbit=rate, delay_ms=delay)  # fmt: skip
    check_case(case)
    seed = draw_seed(seed)
    path = check_result_path(out, force, f"pipeline-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    err = Console(stderr=True)
    log = progress_log(err)
    mc, cal_path = load_machine(Path(calibration) if calibration else None, recalibrate=recalibrate, log=log)
    cases = [case, draw_case(seed, quick)]
    log(f"seed {seed} (repeat this draw with --seed {seed}); "
        f"{sum(len(c.configs()) for c in cases)} configurations; results -> {path}")  # fmt: skip
    opts = "".join(f" --microbatches {m}" for m in mbs) + "".join(f" --schedule {s}" for s in schedules)
    opts += f" --blocks {blocks} --batch-size {batch_size} --rate {rate:g} --delay {delay:g}"
    command = f"trainsim validate pipeline{' --quick' if quick else ''}{opts} --seed {seed} --passes {passes}"
    from trainsim.validate.whatif import machine

    try:
        doc = run_pipeline_validation(cases, path, seed=seed, mc=mc, calibration=mc.describe(cal_path), passes=passes,
                                      steps=5 if quick else steps, warmup=2, log=log,
                                      meta={"command": command, "quick": quick, "machine": machine()})  # fmt: skip
    except KeyboardInterrupt:
        raise UserError(f"validate pipeline: interrupted; what was measured is in {path}, marked partial") from None
    if as_json:
        click.echo(json.dumps(doc))
        return
    for n in doc["notes"]:
        err.print(f"[yellow]note:[/] {n}")
    print_table(doc, f"validate pipeline (seed {seed}; * drawn at random)")
    same = doc["ranking_same_m"]
    click.echo(f"ranking within one model, link and microbatch count: {same['pairs_checked']} pairs checked, "
               f"misranked: {'; '.join(' vs '.join(p) for p in same['misranked']) or 'none'}")  # fmt: skip
    click.echo(headline(doc) + f"; written to {path}")


def _parse_schedule(text: str) -> tuple[str, int]:
    from trainsim.transform.pipeline import SCHEDULES

    name, _, spr = text.partition("/")
    if name not in SCHEDULES:
        raise UserError(f"--schedule {text!r}: unknown schedule; expected one of {', '.join(SCHEDULES)}")
    try:
        return name, int(spr) if spr else SCHEDULES[name].min_spr
    except ValueError as exc:
        raise UserError(f"--schedule {text!r}: expected SCHEDULE or SCHEDULE/STAGES_PER_RANK") from exc
