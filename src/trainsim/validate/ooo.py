"""``trainsim validate ooo-dp``: reverse-first-k data parallelism, predicted before it is measured.

    $ trainsim validate calibrate                  # once per machine (``testbed.machine``)
    $ trainsim validate ooo-dp --quick
    $ trainsim validate ooo-dp --seed 7 --passes 3 --json --out ooo.json

The protocol of ``trainsim.validate.protocol``, per configuration ``(model, link rate, latency, k)``:

1. **profile** the model in one process, as a user would (``trainsim ooo profile``:
   ``capture.layerprofile.profile_layers``), before any real run;
2. **predict** k = 0 (DDP order, one bucket per layer) and k (given, drawn, or the simulator's best,
   ``transform.ooo.search_k``) with ``transform.ooo.predict_dp`` from that profile and the machine
   calibration only (``testbed.machine``; ``predict_case``): every all-reduce costs
   ``MachineCalibration.allreduce_us`` at the link's rate and latency, its host work
   (``MachineCalibration.host_us``, and a shaped link's cost per byte sent, ``wire_cpu_us``) is taken from the rank's computation while they overlap, and the
   computation of the two ranks that share this host runs ``MachineCalibration.slowdown(2)`` slower;
3. **freeze** every prediction in the result file (``predictions_frozen_at``);
4. **measure** with ``trainsim.run.ooo_dp`` (one gloo process per network namespace, the link shaped
   with tc: ``testbed.netns``; unshaped loopback, predicted as such, where namespaces are unavailable),
   every configuration once per pass, interleaved, ``--passes`` passes. The slowest rank's step median
   and minimum go to each pass's ``diagnostics``, never into a prediction.

Besides the fixed configurations every invocation draws some from a seed it prints and stores
(``draw_cases``; ``--seed`` repeats a draw): model family, width and depth, link rate and latency, k.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trainsim.cli.options import us_to_ms
from trainsim.errors import UserError
from trainsim.validate import progress_log
from trainsim.validate.protocol import ConfigRunner, link_label, protocol_options

if TYPE_CHECKING:
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.testbed.machine import MachineCalibration

RATE_RANGE_MBIT = (100.0, 1000.0)
"""drawn link rates (Mbit/s), log-uniform: the range the shaped veth links are used in"""
DELAYS_MS = (0.0, 0.0, 0.5, 1.0, 2.0)
"""drawn one-way latencies (ms): half the draws without added latency"""
MLP_WIDTHS = (512, 768, 1024, 1536)
MLP_DEPTHS = (3, 4, 5, 6)
TRANSFORMER_BLOCKS = (2, 3, 4, 5, 6)
RANKS = 2
"""ranks of every run (one namespace each, all on this host)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class OooCase:
    """One model and link; both k = 0 and the case's k run on it."""

    model: str = "transformer"
    blocks: int = 4
    """transformer blocks / mlp depth"""
    width: int = 0
    """mlp hidden width (0: the zoo's default)"""
    batch_size: int = 32
    rate_mbit: float | None = 1000.0
    """None: unshaped"""
    delay_ms: float = 0.0
    """added one-way latency"""
    k: int | None = None
    """None: the simulator's best k"""
    drawn: bool = False
    """drawn from the seed (a held-out configuration)"""

    def __post_init__(self) -> None:
        if self.model not in ("mlp", "cnn", "transformer"):
            raise UserError(f"validate ooo-dp: model {self.model!r}; expected mlp, cnn or transformer")
        if self.blocks < 1 or self.width < 0 or self.batch_size < 1 or self.delay_ms < 0:
            raise UserError(f"validate ooo-dp: {self}; expected blocks >= 1, width >= 0, batch_size >= 1, delay >= 0")
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise UserError(f"validate ooo-dp: rate {self.rate_mbit} Mbit/s; expected > 0")

    def zoo(self) -> dict[str, int]:
        """The ``ZooSpec`` fields of the model (besides the batch size)."""
        if self.model == "transformer":
            return {"blocks": self.blocks}
        if self.model == "mlp":
            return {"depth": self.blocks, **({"width": self.width} if self.width else {})}
        return {}

    def model_label(self) -> str:
        if self.model == "transformer":
            return f"transformer x{self.blocks}"
        if self.model == "mlp":
            return f"mlp {self.blocks}x{self.width or 1024}"
        return self.model


QUICK = (OooCase(model="transformer", blocks=4, rate_mbit=1000.0),)
FULL = (
    OooCase(model="transformer", blocks=4, rate_mbit=1000.0),
    OooCase(model="transformer", blocks=4, rate_mbit=500.0),
    OooCase(model="cnn", rate_mbit=100.0),
)


def draw_cases(seed: int, quick: bool) -> list[OooCase]:
    """Held-out cases drawn from ``seed`` (the same seed, the same cases): one (``quick``) or three, each
    a zoo model of a drawn family, width and depth, a drawn link and a drawn k in 1..layers."""
    from trainsim.run.ooo_dp import zoo_layer_count

    rng = random.Random(seed)
    lo, hi = (math.log(x) for x in RATE_RANGE_MBIT)
    out = []
    for _ in range(1 if quick else 3):
        model = rng.choice(("mlp", "transformer"))
        if model == "mlp":
            case = OooCase(model="mlp", blocks=rng.choice(MLP_DEPTHS), width=rng.choice(MLP_WIDTHS))
        else:
            case = OooCase(model="transformer", blocks=rng.choice(TRANSFORMER_BLOCKS))
        rate = round(math.exp(rng.uniform(lo, hi)), -1)
        delay = rng.choice(DELAYS_MS)
        n = zoo_layer_count(case.model, case.batch_size, case.zoo())
        out.append(OooCase(model=case.model, blocks=case.blocks, width=case.width, rate_mbit=rate, delay_ms=delay,
                           k=rng.randint(1, n), drawn=True))  # fmt: skip
    return out


# --------------------------------------------------------------------------- prediction
def profile_case(case: OooCase) -> LayerProfile:
    """The one-process per-layer profile a user would take (``trainsim ooo profile``)."""
    from trainsim.capture.layerprofile import profile_layers

    return profile_layers(case.model, batch_sizes=(case.batch_size,), reps=20, zoo=case.zoo())


def _wire_cpu(mc: MachineCalibration, rate_mbit: float | None, size_bytes: float) -> float:
    return mc.wire_cpu_us(size_bytes, rate_mbit=rate_mbit, world=RANKS)


def predict_case(case: OooCase, prof: LayerProfile, mc: MachineCalibration) -> list[dict[str, Any]]:
    """The frozen rows of ``case``: k = 0 and the case's k (the simulator's best when None; one row when
    that is 0), each ``{"k", "predicted_ms"}`` plus the model's terms. Reads nothing but the profile,
    the machine calibration and the case (module docstring, step 2)."""
    from functools import partial

    from trainsim.testbed.contention import simulate_contended
    from trainsim.transform.ooo import HostTerms, predict_dp, search_k

    comm = mc.cost(rate_mbit=case.rate_mbit, delay_ms=case.delay_ms)
    host = HostTerms(factor=mc.slowdown(RANKS))
    # the all-reduces' host CPU (loopback line + the shaped link's cost per byte), taken from compute
    replay = partial(simulate_contended, cpu_us=mc.host_us, wire_cpu_us=partial(_wire_cpu, mc, case.rate_mbit))
    bs = case.batch_size
    if case.k is None:
        k, _ = search_k(prof, bs, comm, replay, host, world=RANKS)
    else:
        from trainsim.run.ooo_dp import check_k

        check_k(case.k, len(prof.table(bs)), case.model)
        k = case.k
    terms = {"corun_slowdown": round(host.factor, 4), "host_a_us": mc.host_a_us, "link_efficiency": mc.link_efficiency}
    return [
        {"k": kk, "predicted_ms": round(predict_dp(prof, bs, kk, comm, world=RANKS, replay=replay, host=host), 3),
         "k_chosen_by": "given" if case.k is not None else "search", "model_terms": terms}
        for kk in sorted({0, k})
    ]  # fmt: skip


# --------------------------------------------------------------------------- the harness
Runner = ConfigRunner
"""``runner(config, pass_index)`` (``validate.protocol.ConfigRunner``)"""
Profiler = Callable[[OooCase], "LayerProfile"]


def run_ooo_validation(
    cases: list[OooCase] | tuple[OooCase, ...],
    out: Path,
    *,
    seed: int,
    mc: MachineCalibration,
    calibration: dict[str, Any] | None = None,
    passes: int = 3,
    steps: int = 12,
    warmup: int = 3,
    runner: Runner | None = None,
    profiler: Profiler = profile_case,
    shaped: bool | None = None,
    log: Callable[[str], None] = lambda s: None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Profile and predict every case (frozen in ``out`` before the first real run), then run them
    ``passes`` times, interleaved; return the finished document. ``runner``/``profiler``: stand-ins
    for tests (default: real runs on an emulated link, ``profile_case``). ``shaped``: whether the
    links can be shaped (default: whether network namespaces work here); when not, every case is
    predicted and run on unshaped loopback, with a note."""
    from trainsim.validate.protocol import ResultFile, freeze_and_run, now_iso, shaping, write_json

    if passes < 1:
        raise UserError(f"validate ooo-dp: passes={passes}; expected >= 1")
    shaped, notes = shaping(shaped)
    meta = dict(meta or {})
    res = ResultFile(out, command=meta.pop("command", "run_ooo_validation"), seed=seed, calibration=calibration,
                     passes=passes, steps=steps, warmup=warmup, notes=notes, **meta)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for case in cases:
        if not shaped:
            case = OooCase(**{**asdict(case), "rate_mbit": None, "delay_ms": 0.0})
        log(f"profiling {case.model_label()} (one process, one thread, batch {case.batch_size})")
        prof = profiler(case)
        for pred in predict_case(case, prof, mc):
            cfg = {"model": case.model, "blocks": case.blocks, "width": case.width, "batch_size": case.batch_size,
                   "rate_mbit": case.rate_mbit, "delay_ms": case.delay_ms, "k": pred["k"],
                   "mode": "ddp-order" if pred["k"] == 0 else "reverse-first-k"}  # fmt: skip
            label = (f"{case.model_label()} {link_label(case.rate_mbit, case.delay_ms)} k={pred['k']}"
                     + (" *" if case.drawn else ""))  # fmt: skip
            rows.append({"label": label, "config": cfg, "held_out": case.drawn, **pred, "predicted_at": now_iso()})
            log(f"  {label}: predicted {pred['predicted_ms']:.2f} ms")
    doc = freeze_and_run(res, rows, runner=runner, passes=passes, log=log,
                         real_runner=lambda: real_runner(steps=steps, warmup=warmup, shaped=bool(shaped)))  # fmt: skip
    doc["speedups"] = speedups(doc["runs"])
    write_json(out, doc)
    return doc


def speedups(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case with a reordered row: the speed-up of k over the DDP order, predicted and measured
    (ratios of the frozen predictions and of the measured medians)."""
    out = []
    base = {_case_key(r): r for r in runs if r["config"]["k"] == 0}
    for r in runs:
        b = base.get(_case_key(r))
        if r["config"]["k"] == 0 or b is None:
            continue
        meas = (b["measured_ms"] / r["measured_ms"]) if b.get("measured_ms") and r.get("measured_ms") else None
        out.append({"label": r["label"], "k": r["config"]["k"],
                    "predicted_speedup": round(b["predicted_ms"] / r["predicted_ms"], 3),
                    "measured_speedup": None if meas is None else round(meas, 3)})  # fmt: skip
    return out


def _case_key(r: dict[str, Any]) -> tuple[Any, ...]:
    c = r["config"]
    return (c["model"], c["blocks"], c["width"], c["batch_size"], c["rate_mbit"], c["delay_ms"], r["held_out"])


@contextlib.contextmanager
def emulated_links(shaped: bool) -> Iterator[Callable[[float | None, float], tuple[Any, str]]]:
    """``link(rate_mbit, delay_ms) -> (popen, master address)``: a 2-node emulated network of that
    rate and latency (``testbed.netns``), made on first use and kept until the block ends (torn down
    on Ctrl-C too), one per distinct link: a network reshaped in place from no latency to some kept
    the MTU and qdisc choice of the first shape. Unshaped loopback when not ``shaped``."""
    import os

    from trainsim.run.ranks import local_popen

    if not shaped:
        yield lambda rate, delay: (local_popen, "127.0.0.1")
        return
    from trainsim.testbed.netns import Netns

    with contextlib.ExitStack() as stack:
        nets: dict[tuple[float | None, float], Any] = {}

        def link(rate: float | None, delay: float) -> tuple[Any, str]:
            if (rate, delay) not in nets:
                nets[(rate, delay)] = stack.enter_context(Netns(RANKS, rate_mbit=rate, delay_ms=delay))
            net = nets[(rate, delay)]

            def popen(rank: int, argv: list[str], **kw: Any) -> Any:
                env = dict(os.environ, GLOO_SOCKET_IFNAME=net.ifname, OMP_NUM_THREADS="1")
                return net.popen(rank, argv, env=env, **kw)

            return popen, net.addr(0)

        yield link


@contextlib.contextmanager
def real_runner(*, steps: int, warmup: int, shaped: bool) -> Iterator[Runner]:
    """A runner of real ``run.ooo_dp`` jobs, one gloo process per namespace of an emulated network of
    each configuration's link (``emulated_links``)."""
    from trainsim.run.ooo_dp import DpRunConfig, run_dp
    from trainsim.run.ranks import free_port

    with emulated_links(shaped) as link:

        def run(cfg: dict[str, Any], p: int) -> tuple[float, dict[str, Any]]:
            popen, master = link(cfg["rate_mbit"], cfg["delay_ms"])
            job = DpRunConfig(mode="ooo", k=cfg["k"], model=cfg["model"], batch_size=cfg["batch_size"], steps=steps,
                              warmup=warmup, zoo_blocks=cfg["blocks"] if cfg["model"] != "cnn" else 0,
                              zoo_width=cfg["width"])  # fmt: skip
            got = run_dp(job, popen=popen, master=master, port=free_port())
            return got["step_ms"], {"step_median_ms": round(got["step_median_ms"], 3),
                                    "step_min_ms": round(got["step_min_ms"], 3)}  # fmt: skip

        yield run


# --------------------------------------------------------------------------- the command
@click.command("ooo-dp")
@click.option("--quick", is_flag=True, help="one fixed and one drawn configuration, short runs (< 3 min)")
@click.option("--model", type=click.Choice(["mlp", "cnn", "transformer"]), help="zoo model of a custom case")
@click.option("--blocks", type=click.IntRange(min=1), default=None,
              help="transformer blocks / mlp depth (custom case; default 4)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="link rate, Mbit/s (custom case)")
@click.option("--latency-us", "delay", type=click.FloatRange(min=0), default=None, callback=us_to_ms,
              help="added one-way latency, us (custom case; default 0)")
@click.option("--k", type=int, help="layers reordered (custom case; default: the simulator's best k)")
@click.option("--steps", type=click.IntRange(min=1), default=12, show_default=True, help="measured steps per run")
@protocol_options("ooo-dp")
def ooo_dp_command(
    quick: bool, model: str | None, blocks: int | None, rate: float | None, delay: float | None, k: int | None,
    steps: int, seed: int | None, passes: int, calibration: str | None, recalibrate: bool, out: str | None, force: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Predict reverse-first-k data parallelism and the DDP order from a profile and the machine
    calibration, freeze the predictions, then measure them on shaped links."""
    from rich.console import Console

    from trainsim.testbed.machine import load_machine
    from trainsim.validate.protocol import check_result_path, draw_seed

    if passes < 1:
        raise UserError(f"validate ooo-dp: --passes {passes}; expected >= 1")
    if k is not None and k < 0:
        raise UserError(f"validate ooo-dp: --k {k}; expected >= 0")
    custom = bool(model) or any(v is not None for v in (rate, k, blocks, delay))
    if custom:
        fixed: tuple[OooCase, ...] = (OooCase(model=model or "transformer", blocks=4 if blocks is None else blocks,
                                              rate_mbit=1000.0 if rate is None else rate, delay_ms=delay or 0.0, k=k),)  # fmt: skip
    else:
        fixed = QUICK if quick else FULL
    for c in fixed:  # a bad k: refused before anything starts
        if c.k is not None:
            from trainsim.run.ooo_dp import check_k, zoo_layer_count

            check_k(c.k, zoo_layer_count(c.model, c.batch_size, c.zoo()), c.model)
    seed = draw_seed(seed)
    path = check_result_path(out, force, f"ooo-dp-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    err = Console(stderr=True)
    log = progress_log(err)
    mc, cal_path = load_machine(Path(calibration) if calibration else None, recalibrate=recalibrate, log=log)
    cases = [*fixed, *draw_cases(seed, quick)]
    log(f"seed {seed} (repeat this draw with --seed {seed}); {len(cases)} cases; results -> {path}")
    opts = "".join(f" --{n} {v}" for n, v in (("model", model), ("blocks", blocks), ("rate", rate), ("delay", delay),
                                                ("k", k)) if v is not None)  # fmt: skip
    command = f"trainsim validate ooo-dp{' --quick' if quick else ''}{opts} --seed {seed} --passes {passes}"
    steps_, warmup = (6, 2) if quick else (steps, 3)
    from trainsim.validate.whatif import machine

    try:
        doc = run_ooo_validation(cases, path, seed=seed, mc=mc, calibration=mc.describe(cal_path), passes=passes,
                                 steps=steps_, warmup=warmup, log=log,
                                 meta={"command": command, "quick": quick, "machine": machine()})  # fmt: skip
    except KeyboardInterrupt:
        raise UserError(f"validate ooo-dp: interrupted; what was measured is in {path}, marked partial") from None
    if as_json:
        click.echo(json.dumps(doc))
        return
    for n in doc["notes"]:
        err.print(f"[yellow]note:[/] {n}")
    print_table(doc, f"validate ooo-dp (seed {seed}; * drawn at random)")
    for s in doc["speedups"]:
        click.echo(f"{s['label']}: speed-up over the DDP order predicted {s['predicted_speedup']}x, "
                   f"measured {s['measured_speedup']}x")  # fmt: skip
    click.echo(headline(doc) + f"; written to {path}")


def print_table(doc: dict[str, Any], title: str) -> None:
    """The runs of a result document as a table on stdout (shared with ``validate pipeline``)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for h in ("configuration", "predicted ms", "measured ms", "spread %", "error %", "within"):
        t.add_column(h, justify="left" if h == "configuration" else "right")
    for r in doc["runs"]:
        meas = r.get("measured_ms")
        t.add_row(r["label"], f"{r['predicted_ms']:.2f}", "-" if meas is None else f"{meas:.2f}",
                  "-" if meas is None else f"{r['spread_pct']:.1f}", "-" if meas is None else f"{r['error_pct']:+.1f}",
                  str(r["within"] or "no"))  # fmt: skip
    Console().print(t)


def headline(doc: dict[str, Any]) -> str:
    """One line of the figures the protocol reports (``protocol.summary``)."""
    rk = doc["ranking"]
    return (f"mean |error| {doc['mean_abs_error_pct']} %, max {doc['max_abs_error_pct']} %; within 10 %: "
            f"{doc['within_10pct']}, within their spread: {doc['within_spread']}, outside both: {doc['outside']} "
            f"of {doc['measured']}; ranking right on {rk['pairs_checked'] - len(rk['misranked'])} of "
            f"{rk['pairs_checked']} pairs whose measured gap exceeds both spreads")  # fmt: skip
