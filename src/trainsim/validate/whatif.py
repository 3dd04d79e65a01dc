"""``trainsim validate whatif``: pairs of real runs, the second predicted from the first one's trace.

    $ trainsim validate whatif --quick
    $ trainsim validate whatif --seed 7 --json --out whatif.json

A *pair* is one program run twice with one thing changed, both runs real and traced
(``trainsim.run.traced``): the link rate of gloo DDP (``network``), the optimizer (``fused-adam``:
Adam's per-parameter loop -> torch's fused Adam, one rank) or the batch size (``batch``, one rank).
Per pair:

1. run the first configuration; its trace (every rank's) is the only input of the prediction;
2. predict the second one's step with the built-in what-if on that trace
   (``network_change``: each collective's transfer, from the machine calibration's link model and at most
   its traced time, re-timed for the new rate, its wait kept; ``whatifs.fused_optimizer`` with the fused
   kernel at the rate the machine calibration measured for it, ``testbed.machine.fused_kernel_gbps``,
   ``whatifs.batch_scale``) and the simulator, anchored on the first run's timed step so that the
   profiler's own overhead, which the untimed run does not pay, cancels (``ANCHOR``): for a link rate
   ``first step + simulated change``, for the optimizer and the batch ``first step x simulated ratio``
   (per rank, the median over the traced steps of ``what-if step - replayed step`` or of their ratio;
   the slowest rank); ``simulated_ms`` is the what-if's absolute step from the trace alone, beside it;
3. once every prediction is written to the result file with its time (``predicted_at``), run the
   second configurations (``passes`` times, interleaved) and add ``measured_ms`` (the slowest rank's
   median step, the median over passes) and ``measured_at``. A prediction is never changed after it
   is written.

Besides the fixed pairs, every invocation draws pairs at random from a seed (printed and stored;
``--seed`` repeats a draw): link rates 0.25x-5x the base, batch factors, MLP widths, so that some pairs
use values no rule was tuned on. ``spread`` re-runs some first configurations: the run-to-run noise of
this host, to read the errors against.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from trainsim.errors import UserError
from trainsim.run.traced import TracedRunConfig
from trainsim.validate import progress_log
from trainsim.validate.protocol import ResultFile, interleave, now_iso, write_json

PAIR_KINDS = ("batch", "fused-adam", "network")
"""the changes a pair can make (``--pair``)"""

BASE_RATE_MBIT = {"mlp": 400.0, "cnn": 50.0}
"""link rate of the first run of a network pair: communication near the compute time (mlp: 2.4 M
parameters, ~9.5 MB of gradients; cnn: 0.13 M, ~0.5 MB)"""

RATE_RANGE = (0.25, 5.0)
"""random network pairs: new rate / base rate, log-uniform"""

BATCH_FACTORS = (0.25, 0.5, 0.75, 1.5, 2.0, 3.0)
"""random batch pairs: new batch / base batch"""

WIDTHS = (512, 768, 1024, 1536)
"""random MLP widths"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Pair:
    """Two real runs that differ in one thing."""

    kind: str
    """one of ``PAIR_KINDS``"""
    first: TracedRunConfig
    """the run whose trace feeds the prediction"""
    second: TracedRunConfig
    """the run that is predicted, then measured"""
    drawn: bool = False
    """drawn from the seed (True) or one of the fixed pairs"""

    def __post_init__(self) -> None:
        if self.kind not in PAIR_KINDS:
            raise UserError(f"pair kind {self.kind!r}; expected one of {', '.join(PAIR_KINDS)}")

    def change(self) -> dict[str, list[Any]]:
        """The fields that differ: ``{field: [first, second]}``."""
        a, b = asdict(self.first), asdict(self.second)
        return {k: [a[k], b[k]] for k in a if a[k] != b[k]}

    def label(self) -> str:
        f = self.first
        what = f"{f.model}" + (f" w{f.width}" if f.model == "mlp" else "") + f" x{f.world}"
        ch = ", ".join(f"{k} {_fmt(v[0])}->{_fmt(v[1])}" for k, v in self.change().items())
        return (
            f"{self.kind}{'*' if self.drawn else ''}: {what} b{f.batch_size} {f.optimizer}"
            + (f" @{_fmt(f.rate_mbit)} Mbit/s" if f.rate_mbit and "rate_mbit" not in self.change() else "")
            + f"; {ch}"
        )

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "drawn": self.drawn, "first": asdict(self.first), "change": self.change()}


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _run(model: str, world: int, *, steps: int, profiled: int, **kw: Any) -> TracedRunConfig:
    return TracedRunConfig(model=model, world=world, steps=steps, profiled=profiled, warmup=3, **kw)


def _steps(quick: bool) -> dict[str, Any]:
    """Timed and profiled steps of every run: at least 6 (10) timed steps and 1 s (2 s) of them."""
    if quick:
        return {"steps": 6, "profiled": 3, "min_timed_s": 1.0}
    return {"steps": 10, "profiled": 4, "min_timed_s": 2.0}


def _network(
    model: str, world: int, factor: float, drawn: bool, steps: int, profiled: int, **kw: Any
) -> Pair:
    base = BASE_RATE_MBIT[model]
    first = _run(model, world, steps=steps, profiled=profiled, rate_mbit=base, **kw)
    return Pair(
        kind="network", first=first, second=replace(first, rate_mbit=round(base * factor, 1)), drawn=drawn
    )


def _fused(model: str, drawn: bool, steps: int, profiled: int, **kw: Any) -> Pair:
    first = _run(model, 1, steps=steps, profiled=profiled, optimizer="adam-loop", **kw)
    return Pair(kind="fused-adam", first=first, second=replace(first, optimizer="adam-fused"), drawn=drawn)


def _batch(model: str, batch: int, new_batch: int, drawn: bool, steps: int, profiled: int, **kw: Any) -> Pair:
    first = _run(model, 1, steps=steps, profiled=profiled, batch_size=batch, optimizer="adam-loop", **kw)
    return Pair(kind="batch", first=first, second=replace(first, batch_size=new_batch), drawn=drawn)


def fixed_pairs(quick: bool) -> list[Pair]:
    """The pairs every run measures (``quick``: one per kind, no 4-rank pair)."""
    s = _steps(quick)
    if quick:
        return [
            _network("mlp", 2, 2.5, False, **s),
            _fused("mlp", False, **s),
            _batch("cnn", 32, 64, False, **s),
        ]
    return [
        _network("mlp", 2, 2.5, False, **s),
        _network("mlp", 2, 0.5, False, **s),
        _network("cnn", 2, 4.0, False, **s),
        _network("mlp", 4, 2.0, False, **s),
        _fused("mlp", False, **s),
        _fused("cnn", False, **s),
        _batch("mlp", 32, 64, False, **s),
        _batch("cnn", 32, 16, False, **s),
    ]


def draw_pairs(seed: int, quick: bool) -> list[Pair]:
    """Pairs drawn from ``seed`` (the same seed, the same pairs): one per kind (``quick``), else two
    network pairs, one fused-Adam and two batch pairs."""
    rng = random.Random(seed)
    s = _steps(quick)
    lo, hi = (math.log(x) for x in RATE_RANGE)
    out: list[Pair] = []
    for _ in range(1 if quick else 2):
        model = rng.choice(("mlp", "cnn"))
        width = {"width": rng.choice(WIDTHS)} if model == "mlp" else {}
        factor = round(math.exp(rng.uniform(lo, hi)), 3)
        out.append(_network(model, 2, factor, True, **s, **width))
    out.append(_fused("mlp", True, **s, width=rng.choice(WIDTHS)))
    for _ in range(1 if quick else 2):
        model = rng.choice(("mlp", "cnn"))
        width = {"width": rng.choice(WIDTHS)} if model == "mlp" else {}
        batch = rng.choice((16, 32, 48))
        new = max(1, round(batch * rng.choice(BATCH_FACTORS)))
        out.append(_batch(model, batch, new, True, **s, **width))
    return out


# --------------------------------------------------------------------------- prediction
def rank_median_ms(res: dict[str, Any]) -> list[float]:
    """Each rank's median timed step (ms) of a ``traced_run`` result."""
    return [float(statistics.median(s)) for s in res["rank_step_ms"]]


def whatif_graph(pair: Pair, trace: str, *, fused_gbps: Any = None, machine: Any = None) -> tuple[Any, Any]:
    """``(replayed graph, what-if graph)`` of one rank's trace of ``pair.first``; ``fused_gbps``: the
    fused kernel's rate for ``whatifs.fused_optimizer`` (its ``kernel_gbps``: GB/s, or a function of the
    parameter bytes, such as the machine calibration's ``fused_kernel_gbps``); ``machine``: the machine
    calibration (``testbed.machine.MachineCalibration``) whose links price a network pair's collectives
    (``network_change``); without it, the transfer rate is fitted on the trace."""
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph
    from trainsim.transform import whatifs

    tr = read_trace(trace)
    g = build_graph(tr)
    if pair.kind == "batch":
        _, batch, shapes = whatifs.batch_context(trace, tr)
        factor = pair.second.batch_size / batch
        return g, whatifs.batch_scale(g, factor, trace=tr, batch_size=batch, param_shapes=shapes)
    if pair.kind == "fused-adam":
        return g, whatifs.fused_optimizer(g, tr, kernel_gbps=fused_gbps)
    return g, network_change(g, pair, machine)


def network_change(g: Any, pair: Pair, machine: Any = None) -> Any:
    """The what-if of a network pair on one rank's graph ``g``: only the transfer part of a collective
    changes with the link, its wait for the peers is kept (``transform.network.split_collectives``).

    With ``machine`` (the machine calibration), the transfer is what the calibrated link model
    (``MachineCalibration.cost``: the host's loopback line plus the bytes at the delivered rate) gives
    for the collective's size, ranks and the first run's rate, at most the traced time; the rest of a
    traced collective is kept as waiting, and the transfer is scaled by the model's new / old time.
    Why: ranks that share a busy host's cores stretch some profiled all-reduces, and a rate fitted on
    them takes that excess for transfer (``benchmarks/probe_ring_ranks.py``; figures in
    docs/log/whatif.md); the host's own part of an all-reduce does not scale with the link either.
    Without ``machine``: as ``trainsim whatif --network-bw`` does, a rate fitted on the trace's busy
    periods, every transfer divided by the rate ratio."""
    import numpy as np

    from trainsim.graph.ir import TaskKind
    from trainsim.transform.network import retime_collectives, scale_network, split_collectives

    a, b = pair.first, pair.second
    assert a.rate_mbit is not None and b.rate_mbit is not None
    sized = bool(np.any((g.kind == TaskKind.COMM) & (g.size_bytes >= 0)))
    if machine is not None and sized:
        old = HostLinks(machine.cost(rate_mbit=a.rate_mbit, delay_ms=a.delay_ms))
        new = HostLinks(machine.cost(rate_mbit=b.rate_mbit, delay_ms=b.delay_ms))
        modelled = split_collectives(g, old=old, ranks=a.world)
        return retime_collectives(g, new=new, old=old, ranks=a.world, split=modelled)
    fitted = split_collectives(g, ranks=a.world) if sized else None
    return scale_network(g, bw_factor=b.rate_mbit / a.rate_mbit, split=fitted)


@dataclass(frozen=True, slots=True)
class HostLinks:
    """The machine calibration's links (``MachineCalibration.cost``) as a ``CollectiveCost`` for every
    collective a DDP trace holds: a broadcast (DDP's buffers, each forward of a model with batch norm)
    is ``ceil(log2 p)`` sends of the full size (a binomial tree, ``cluster.collectives.broadcast_us``);
    the rest as the calibration prices them."""

    cost: Any
    """``testbed.machine.MachineCost``"""

    def time_us(self, kind: str, size_bytes: float, group: int) -> float:
        if kind == "broadcast":
            return math.ceil(math.log2(max(group, 2))) * float(self.cost.time_us("p2p", size_bytes, group))
        return float(self.cost.time_us(kind, size_bytes, group))


ANCHOR = {"network": "add", "fused-adam": "scale", "batch": "scale"}
"""How the simulated change is carried over to the first run's timed (unprofiled) step, by pair kind.

The profiler lengthens every traced operator (its per-call overhead): the one-rank pairs' timed steps
measured 0.6-1.04x their replayed traced steps (2026-11-29 rounds, docs/log/whatif.md).

* ``scale``: the what-if graph is made of the traced operators' own times (the batch what-if
  multiplies them by the op-cost model's ratios; the fused optimizer keeps the traced calls and Python
  in proportion and adds its kernel's bytes at the calibrated rate), so its change is inflated with
  them and carries over as a ratio: ``predicted = first step x what-if step / replayed step``.
* ``add``: a link-rate change moves transfer time, which the profiler does not lengthen:
  ``predicted = first step + (what-if step - replayed step)``.
"""


def predict_pair(pair: Pair, first: dict[str, Any], *, fused_gbps: Any = None, machine: Any = None) -> dict[str, Any]:
    """The prediction of ``pair.second`` from the first run's result (traces and timed steps only);
    ``fused_gbps`` and ``machine`` as ``whatif_graph`` takes them (the command passes the machine
    calibration's)."""
    import numpy as np

    from trainsim.simulate.engine import simulate

    base = rank_median_ms(first)
    scale = ANCHOR[pair.kind] == "scale"
    predicted, simulated, deltas, ratios = [], [], [], []
    for r, trace in enumerate(first["traces"]):
        g, g2 = whatif_graph(pair, trace, fused_gbps=fused_gbps, machine=machine)
        s1, s2 = simulate(g).step_ms, simulate(g2).step_ms
        ok = np.isfinite(s1) & np.isfinite(s2) & (s1 > 0)
        if not ok.any():
            raise UserError(f"{trace}: no step could be replayed; cannot predict {pair.label()}")
        deltas.append(float(np.median(s2[ok] - s1[ok])))
        ratios.append(float(np.median(s2[ok] / s1[ok])))
        predicted.append(base[r] * ratios[-1] if scale else base[r] + deltas[-1])
        simulated.append(float(np.median(s2[ok])))
    return {
        "predicted_ms": round(max(predicted), 3),
        "simulated_ms": round(max(simulated), 3),
        "first_measured_ms": round(max(base), 3),
        "anchor": ANCHOR[pair.kind],
        "simulated_change_ms": [round(d, 3) for d in deltas],
        "simulated_ratio": [round(x, 4) for x in ratios],
    }


# --------------------------------------------------------------------------- the harness
Runner = Callable[[TracedRunConfig, Path], dict[str, Any]]
Predictor = Callable[[Pair, dict[str, Any]], dict[str, Any]]


def run_pairs(
    pairs: list[Pair],
    out: Path,
    *,
    seed: int,
    runner: Runner | None = None,
    predictor: Predictor = predict_pair,
    passes: int = 3,
    workdir: Path | None = None,
    log: Callable[[str], None] = lambda s: None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every pair's first configuration and predict its second (``trainsim.validate.protocol``:
    frozen in ``out`` before any second run), then run the second configurations ``passes`` times,
    interleaved; return the document that ``out`` holds at the end."""
    if passes < 1:
        raise UserError(f"validate whatif: passes={passes}; expected >= 1")
    if runner is None:
        from functools import partial

        from trainsim.run.traced import traced_run
        from trainsim.testbed.netns import shaped_ranks

        runner = partial(traced_run, network=shaped_ranks)
    meta = dict(meta or {})
    res = ResultFile(out, command=meta.pop("command", "run_pairs"), seed=seed, calibration=meta.pop("calibration", None),
                     **meta)  # fmt: skip
    with _workdir(workdir) as work:
        rows = []
        for i, pair in enumerate(pairs):
            log(f"pair {i + 1}/{len(pairs)} first run (the profile): {pair.label()}")
            pred = predictor(pair, runner(pair.first, work / f"pair{i}-first"))
            rows.append({"label": pair.label(), "config": pair.config(), "held_out": pair.drawn, **pred,
                         "predicted_at": now_iso()})  # fmt: skip
            log(f"  first {pred['first_measured_ms']:.2f} ms; predicted {pred['predicted_ms']:.2f} ms")
        res.freeze(rows)  # every prediction is on disk before any second run starts
        log(f"predictions frozen in {out}")

        def run_one(i: int, p: int) -> float:
            return max(rank_median_ms(runner(pairs[i].second, work / f"pair{i}-second-{p}")))

        doc = interleave(res, run_one, passes=passes, log=log)
    for r in doc["runs"]:
        r["sim_error_pct"] = round(100 * (r["simulated_ms"] - r["measured_ms"]) / r["measured_ms"], 2)
    sims = [abs(r["sim_error_pct"]) for r in doc["runs"]]
    doc["sim_only_mean_abs_error_pct"] = round(sum(sims) / len(sims), 2) if sims else None
    write_json(out, doc)
    return doc


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    tmp = Path(tempfile.mkdtemp(prefix="trainsim-whatif-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def select_pairs(
    kinds: tuple[str, ...], seed: int, quick: bool, netns_ok: bool, notes: list[str]
) -> list[Pair]:
    """The fixed and drawn pairs of the chosen kinds (all when ``kinds`` is empty)."""
    bad = [k for k in kinds if k not in PAIR_KINDS]
    if bad:
        raise UserError(f"validate whatif: unknown pair {bad[0]!r}; expected one of {', '.join(PAIR_KINDS)}")
    pairs = [p for p in fixed_pairs(quick) + draw_pairs(seed, quick) if not kinds or p.kind in kinds]
    if not netns_ok and any(p.kind == "network" for p in pairs):
        notes.append("network namespaces unavailable: the network pairs (shaped links) were skipped")
        pairs = [p for p in pairs if p.kind != "network"]
    return pairs


@click.command("whatif")
@click.option(
    "--quick", is_flag=True, help="One fixed and one drawn pair per kind, no 4-rank run (a few minutes)."
)
@click.option(
    "--seed", type=int, default=None, help="Seed of the drawn pairs (default: a fresh one, printed)."
)
@click.option(
    "--pair", "kinds", multiple=True, metavar="KIND", help=f"Only these pairs: {', '.join(PAIR_KINDS)}."
)
@click.option("--passes", type=int, default=3, show_default=True, help="Second runs per pair (interleaved).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Result file (predictions are written here before the second runs); default out/whatif-<time>.json.",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
def whatif_command(quick: bool, seed: int | None, kinds: tuple[str, ...], passes: int, out: str | None, force: bool,
                   as_json: bool) -> None:  # fmt: skip
    """Pairs of real runs: predict the second from the first one's trace, write it down, then measure."""
    from rich.console import Console

    from trainsim.testbed.netns import netns_unavailable
    from trainsim.validate.protocol import check_result_path, draw_seed

    if passes < 1:
        raise UserError(f"validate whatif: --passes {passes}; expected >= 1")
    seed = draw_seed(seed)
    path = check_result_path(out, force, f"whatif-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    notes: list[str] = []
    reason = netns_unavailable()
    pairs = select_pairs(kinds, seed, quick, reason is None, notes)
    log = progress_log(Console(stderr=True))
    log(f"seed {seed} (repeat this draw with --seed {seed}); {len(pairs)} pairs; results -> {path}")
    for n in notes:
        log(n)
    kind_opts = "".join(f" --pair {k}" for k in kinds)
    predictor: Predictor = predict_pair
    calibration = _opcost_calibration()
    if any(p.kind in ("fused-adam", "network") for p in pairs):
        from functools import partial

        from trainsim.testbed.machine import load_machine, with_fused_kernel

        cal, cal_path = load_machine(log=log)
        fused = any(p.kind == "fused-adam" for p in pairs)
        if fused:
            cal = with_fused_kernel(cal, cal_path, log=log)
            calibration["fused_kernel"] = {"file": str(cal_path), "created_at": cal.created_at,
                                           "sizes_bytes": cal.fused_adam_sizes_bytes, "gbps": cal.fused_adam_gbps}  # fmt: skip
        if any(p.kind == "network" for p in pairs):
            calibration["network"] = {"file": str(cal_path), "created_at": cal.created_at,
                                      "host_us": [cal.host_a_us, cal.host_b_us_per_byte],
                                      "shaped_rates_mbit": cal.shaped_rates_mbit,
                                      "efficiency_grid": cal.efficiency_grid}  # fmt: skip
        predictor = partial(predict_pair, fused_gbps=cal.fused_kernel_gbps if fused else None, machine=cal)
    meta = {"command": f"trainsim validate whatif{' --quick' if quick else ''} --seed {seed}{kind_opts} --passes {passes}",
            "quick": quick, "passes": passes, "machine": machine(), "notes": notes, "calibration": calibration,
            "method": "predicted = first run's median step + simulated change (network: what-if minus replay) or x "
                      "simulated ratio (fused-adam, batch: what-if over replay), medians over the first trace's steps, "
                      "slowest rank; simulated_ms = the what-if's step from the trace alone; the fused kernel "
                      "at the machine calibration's rate (calibration.fused_kernel); a collective's transfer from "
                      "the machine calibration's link model (calibration.network), at most its traced time, "
                      "scaled by the model's new / old time, the rest of it kept as waiting"}  # fmt: skip
    try:
        doc = run_pairs(pairs, path, seed=seed, passes=passes, log=log, meta=meta, predictor=predictor)
    except KeyboardInterrupt:
        raise UserError(f"validate whatif: interrupted; what was measured is in {path}, marked partial") from None
    if as_json:
        click.echo(json.dumps(doc))
        return
    from rich.table import Table

    t = Table(title=f"what-if pairs (seed {seed}; * drawn at random)")
    for h in ("pair", "first ms", "predicted ms", "measured ms", "spread %", "error %", "within"):
        t.add_column(h, justify="left" if h == "pair" else "right")
    for r in doc["runs"]:
        t.add_row(r["label"], f"{r['first_measured_ms']:.2f}", f"{r['predicted_ms']:.2f}", f"{r['measured_ms']:.2f}",
                  f"{r['spread_pct']:.1f}", f"{r['error_pct']:+.1f}", str(r["within"] or "no"))  # fmt: skip
    Console().print(t)
    click.echo(f"mean |error| {doc['mean_abs_error_pct']} %, max {doc['max_abs_error_pct']} %; within 10 %: "
               f"{doc['within_10pct']}, within their spread: {doc['within_spread']}, outside both: {doc['outside']}; "
               f"written to {path}")  # fmt: skip


def _opcost_calibration() -> dict[str, Any]:
    """The op-cost calibration the batch what-if reads (measured on first use, generic operators)."""
    from trainsim.transform.opcost import default_path

    p = default_path()
    when = datetime.fromtimestamp(p.stat().st_mtime, timezone.utc).isoformat(timespec="seconds") if p.exists() else None
    return {"file": str(p), "created_at": when, "what": "per-machine operator costs (transform.opcost)"}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    from trainsim.transform.opcost import cpu_model

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "host": platform.node()}  # fmt: skip
