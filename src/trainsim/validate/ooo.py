"""``trainsim validate ooo-dp``: reverse-first-k data parallelism, predicted and measured on shaped links.

    $ trainsim validate ooo-dp --quick
    $ trainsim validate ooo-dp --model transformer --blocks 4 --rate 1000 --k 3 --json

Per configuration ``(model, link rate, added latency)``:

1. **profile** one process alone: per-layer F/B/W/update times (``trainsim.capture.layerprofile``);
2. **emulate the network**: 2 namespaces, veth links shaped with tc (``trainsim.validate.netns``);
   **calibrate** gloo's all-reduce on them (``trainsim.cluster.calibrate``);
3. **predict** the step time of k = 0 (DDP order, one bucket per layer) and of ``k`` (given, or the
   simulator's best: ``trainsim.transform.ooo.search_k``);
4. **measure** both with ``trainsim.run.ooo_dp`` (one gloo process per namespace; time per step over
   the measured window, ``trainsim.run.ranks.window_step_ms``), and
   torch's own DDP as a reference line;
5. print predictions, measurements, errors and the speed-up. Without namespaces it says so and runs on
   unshaped loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import click

from trainsim.errors import UserError
from trainsim.run.ranks import free_port, free_ports
from trainsim.validate import progress_log

if TYPE_CHECKING:
    from trainsim.transform.ooo import HostTerms


@dataclass(frozen=True, kw_only=True, slots=True)
class OooCase:
    """One link and model; both k = 0 and the chosen k run on it."""

    model: str = "transformer"
    blocks: int = 4
    """transformer blocks / mlp depth"""
    batch_size: int = 32
    rate_mbit: float | None = 1000.0
    delay_ms: float = 0.0
    k: int | None = None
    """None: the simulator's best k"""

    def zoo(self) -> dict[str, int]:
        return (
            {"blocks": self.blocks}
            if self.model == "transformer"
            else ({"depth": self.blocks} if self.model == "mlp" else {})
        )


QUICK = (OooCase(model="transformer", blocks=4, rate_mbit=1000.0),)
FULL = (
    OooCase(model="transformer", blocks=4, rate_mbit=1000.0),
    OooCase(model="transformer", blocks=4, rate_mbit=500.0),
    OooCase(model="cnn", rate_mbit=100.0),
)


def link_label(rate: float | None, delay: float) -> str:
    return ("unshaped" if rate is None else f"{rate:g} Mbit/s") + (f" +{delay:g} ms" if delay else "")


@contextlib.contextmanager
def emulated_link(
    rate_mbit: float | None, delay_ms: float, notes: list[str]
) -> Iterator[tuple[Any, Any, str]]:
    """``(net or None, popen, master address)``: two shaped namespaces, or loopback with a note."""
    from trainsim.run.ranks import local_popen
    from trainsim.validate.netns import Netns, netns_unavailable

    reason = netns_unavailable()
    if reason is not None:
        notes.append(f"network namespaces unavailable ({reason}); ran on unshaped loopback")
        yield None, local_popen, "127.0.0.1"
        return
    with Netns(2, rate_mbit=rate_mbit, delay_ms=delay_ms) as net:

        def popen(rank: int, argv: list[str], **kw: Any) -> Any:
            env = dict(os.environ, GLOO_SOCKET_IFNAME=net.ifname, OMP_NUM_THREADS="1")
            return net.popen(rank, argv, env=env, **kw)

        yield net, popen, net.addr(0)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["error_pct"]) for r in runs]
    return {
        "runs": runs,
        "mean_abs_error_pct": round(sum(errs) / len(errs), 2) if errs else None,
        "max_abs_error_pct": round(max(errs), 2) if errs else None,
    }


def _row(config: dict[str, Any], pred: float, meas: float, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "config": config,
        "predicted_ms": round(pred, 3),
        "measured_ms": round(meas, 3),
        "error_pct": round(100 * (pred - meas) / meas, 2),
        **extra,
    }


CORUN_START_S = 8.0
"""the copies in ``side_by_side_terms`` start their loops this long after launch (all have set up and
warmed up every order by then)"""


def alt_steps(res: dict[str, Any]) -> dict[int, list[tuple[float, float]]]:
    """Per order, the (start, end) of its counted steps in a ``DpRunConfig.alternate`` run."""
    return {int(k): [(float(a), float(b)) for a, b in v] for k, v in res["ranks"][0]["alt"].items()}


def overlapping_alt(copies: list[dict[int, list[tuple[float, float]]]], min_steps: int = 5) -> dict[int, list[list[float]]]:
    """Per order, per copy, the step times (ms) of the steps that ran while every copy ran its loop
    (as ``validate.dp.overlapping_steps``: the copies come up a second apart); a copy with fewer than
    ``min_steps`` of an order's steps inside that window keeps all of them."""
    lo = max(min(a for v in c.values() for a, _ in v) for c in copies)
    hi = min(max(b for v in c.values() for _, b in v) for c in copies)
    out: dict[int, list[list[float]]] = {}
    for k in copies[0]:
        out[k] = []
        for c in copies:
            every = [(b - a) * 1e3 for a, b in c[k]]
            inside = [(b - a) * 1e3 for a, b in c[k] if a >= lo and b <= hi]
            out[k].append(inside if len(inside) >= min_steps else every)
    return out


def side_by_side_terms(
    case: OooCase, prof: Any, ks: tuple[int, ...], steps: int, warmup: int, copies: int = 2
) -> dict[int, HostTerms]:
    """``HostTerms`` of each order in ``ks`` on this host, from the real runtime in one-rank groups (no
    communication), the orders side by side in each process (``run.ooo_dp.alternate_orders``): one
    process alone, ``copies`` at once (as the ranks share this host; their loops start together,
    ``start_at``, and only the steps that ran while every copy ran count), one alone again. The
    co-run factor is together / alone, the median over the orders (the host's and the model's, not
    the order's); each order's ``extra_us`` is what the runtime alone spends beyond the per-layer
    profile's prediction of the same loop (``predict_dp`` without communication), at co-run speed,
    plus the expected wait for the slowest rank (``validate.dp.straggler_ms``) from the co-run
    copies. Read one order at a time, runs a minute apart, two orders' terms differed by more than
    the orders do (see ``alternate_orders``)."""
    from concurrent.futures import ThreadPoolExecutor

    from trainsim.run.ooo_dp import DpRunConfig, run_dp
    from trainsim.transform.ooo import HostTerms, predict_dp
    from trainsim.validate.dp import straggler_ms

    cfg = DpRunConfig(mode="ooo", world_size=1, alternate=tuple(sorted(set(ks))), model=case.model,
                      batch_size=case.batch_size, steps=steps, warmup=warmup, **_zoo_fields(case))  # fmt: skip

    def alone() -> dict[int, list[tuple[float, float]]]:
        return alt_steps(run_dp(cfg, port=free_port()))

    before = alone()
    together = replace(cfg, start_at=time.time() + CORUN_START_S)
    with ThreadPoolExecutor(copies) as pool:
        futures = [pool.submit(run_dp, together, port=p) for p in free_ports(copies)]
        both = overlapping_alt([alt_steps(f.result()) for f in futures])
    after = alone()
    alone_ms = {k: statistics.median([(b - a) * 1e3 for a, b in before[k] + after[k]]) for k in before}
    factors = [max(1.0, statistics.median([x for c in both[k] for x in c]) / alone_ms[k]) for k in before]
    factor = statistics.median(factors)
    terms = {}
    for k in before:
        model_ms = predict_dp(prof, case.batch_size, k, lambda size: 0.0)
        extra_ms = max(0.0, alone_ms[k] - model_ms) * factor + straggler_ms(both[k])
        terms[k] = HostTerms(factor=factor, extra_us=1e3 * extra_ms)
    return terms


HOST_ROUNDS = 2
"""readings of the host's speed per measured run (``DpRunConfig.host_rounds``)"""

PROBE_S = 1.5
"""seconds of all-reduces per size in the load probe"""


def load_terms(
    case: OooCase, sizes: list[int], cal: Any, popen: Any, master: str, steps: int, warmup: int
) -> tuple[Callable[[float], float], Callable[[float], float], dict[str, Any]]:
    """``(cpu_us, slowdown, raw)`` per all-reduce size, measured with the ranks training
    (``trainsim.run.ooo_dp.load_probe``, mode ``load``, on the case's link): the training lost per
    all-reduce, and the all-reduce time under load over the calibrated idle time (>= 1). Between the
    probed sizes (the model's layers) linear in log size, constant beyond them."""
    import math

    import numpy as np

    from trainsim.run.ooo_dp import DpRunConfig, run_dp

    reps = [max(3, min(200, math.ceil(PROBE_S * 1e6 / max(cal.predict_us(s), 1.0)))) for s in sizes]
    res = run_dp(
        DpRunConfig(mode="load", model=case.model, batch_size=case.batch_size, steps=steps, warmup=warmup,
                    probe_sizes=tuple(sizes), probe_reps=tuple(reps), **_zoo_fields(case)),
        popen=popen, master=master, port=free_port(),
    )  # fmt: skip
    x = np.log(np.asarray(sizes, float))
    lost = np.asarray(res["lost_us"], float)
    sigma = np.maximum(
        1.0, np.asarray(res["allreduce_us"], float) / np.array([cal.predict_us(s) for s in sizes])
    )

    def cpu_us(size: float) -> float:
        return float(np.interp(math.log(max(size, 1.0)), x, lost))

    def slowdown(size: float) -> float:
        return float(np.interp(math.log(max(size, 1.0)), x, sigma))

    raw = {"sizes": sizes, "allreduce_us": [round(v, 1) for v in res["allreduce_us"]],
           "idle_model_us": [round(cal.predict_us(s), 1) for s in sizes],
           "lost_us": [round(v, 1) for v in res["lost_us"]]}  # fmt: skip
    return cpu_us, slowdown, raw


def run_ooo_validation(
    cases: tuple[OooCase, ...] | list[OooCase],
    *,
    steps: int = 12,
    warmup: int = 3,
    log: Callable[[str], None] = lambda s: None,
    passes: int = 1,
) -> dict[str, Any]:
    """Profile, calibrate, predict and measure each case: DDP order and reverse first-k with the
    ``trainsim.run.ooo_dp`` runtime, torch DDP beside them; ``passes``: every run once per pass, the
    medians over the passes reported (the speed-ups: the median of each pass's ratio)."""
    from trainsim.cluster.calibrate import calibrate
    from trainsim.run.ooo_dp import DpRunConfig, check_k, run_dp
    from trainsim.transform.ooo import interpolated_terms, search_k
    from trainsim.validate.pipeline import host_reading, profile_with_reference

    if passes < 1:
        raise UserError(f"validate ooo-dp: passes={passes}; expected >= 1")
    notes: list[str] = []
    runs: list[dict[str, Any]] = []
    speedups: list[dict[str, Any]] = []
    for case in cases:
        # the plain loop's speed at the time of the profile: timed in step with the profile's own steps
        # (``validate.pipeline.profile_with_reference``), as ``validate pipeline`` does; until 2026-11-27
        # the fastest of three readings, before the profile, after it and after the link's calibration
        log(f"profiling {case.model} (one process, one thread), the plain loop timed in step with it")
        prof, ref_steps = profile_with_reference(case.model, case.blocks, (case.batch_size,), reps=20, zoo=case.zoo())
        alone_ref = statistics.median(ref_steps[case.batch_size])
        log(f"  the plain loop alone, at profile time: {alone_ref:.1f} ms (median of {len(ref_steps[case.batch_size])} "
            f"steps, {min(ref_steps[case.batch_size]):.1f}-{max(ref_steps[case.batch_size]):.1f})")  # fmt: skip
        rows = prof.table(case.batch_size)
        if case.k is not None:
            check_k(case.k, len(rows), case.model)
        sizes = sorted({int(r["param_bytes"]) for r in rows if r["param_bytes"] > 0} | {1024})
        with emulated_link(case.rate_mbit, case.delay_ms, notes) as (net, popen, master):
            log(f"calibrating gloo all-reduce on {link_label(case.rate_mbit, case.delay_ms)}")
            cal = calibrate(
                world=2, rate_mbit=case.rate_mbit, delay_ms=case.delay_ms, sizes=sizes, reps=5, net=net
            )
            psizes = sorted({int(r["param_bytes"]) for r in rows if r["param_bytes"] > 0})
            log(f"timing all-reduces of {len(psizes)} sizes while both ranks train (load probe)")
            cpu_us, slowdown, probe = load_terms(case, psizes, cal, popen, master, steps=8, warmup=2)
            log("  all-reduce under load / idle model: " + ", ".join(
                f"{s / 1e3:.0f} KB {t / 1e3:.1f}/{i / 1e3:.1f} ms (training lost {c / 1e3:.1f} ms)"
                for s, t, i, c in zip(probe["sizes"], probe["allreduce_us"], probe["idle_model_us"], probe["lost_us"],
                                      strict=True)))  # fmt: skip
            n = len(rows)
            terms: dict[int, HostTerms] = {}
            if case.k is None:  # the search: host terms at k = 0 and k = n side by side, linear between
                log(f"timing the runtime in one-rank groups, k = 0 and {n} side by side (alone, then two at once)")
                terms = side_by_side_terms(case, prof, (0, n), steps, warmup)
                k, _ = search_k(prof, case.batch_size, cal.predict_us, cpu_us, slowdown,
                                host=interpolated_terms(terms[0], terms[n], n))  # fmt: skip
            else:
                k = case.k
            if k not in terms:  # the chosen order beside the DDP order
                log(f"timing the runtime in one-rank groups, k = 0 and {k} side by side (alone, then two at once)")
                terms = side_by_side_terms(case, prof, (0, k), steps, warmup)
            base = dict(model=case.model, batch_size=case.batch_size, steps=steps, warmup=warmup, host_rounds=HOST_ROUNDS)
            orders = (("ddp-order", 0), ("reverse-first-k", k))
            link = (cal.predict_us, cpu_us, slowdown)

            # the host terms read before the runs chose k; the prediction from them alone is reported
            preds = {label: _predict(prof, case.batch_size, kk, link, terms[kk]) for label, kk in orders}
            # both orders and torch DDP once per pass, the passes one after the other: a burst of load
            # on the shared host disturbs one pass, and the medians over the passes drop it; the
            # speed-up is the median of each pass's side-by-side ratio. Each run also reads the host's
            # speed between its segments of measured steps (as ``validate dp`` and ``validate pipeline``
            # do), and the prediction of each pass comes from the readings of its three runs, pooled:
            # the profile scaled by the plain loop alone now over the same loop timed after profiling,
            # the co-run factor together / alone, the runtime's extra work per order as read before.
            # Until 2026-11-24 22:50 the terms read before the runs were the prediction and this one
            # was reported beside it (it did better only where the host slowed during the passes), while
            # the extra work sat in one task after the last all-reduce's issue, where the transfers
            # still in flight hid it; spread over the step (``transform.ooo.dp_graph``), the readings
            # in the runs gave 2.1 % / 7.4 % against 6.2 % / 10.2 % from the terms read before (22:45).
            got: dict[str, list[dict[str, Any]]] = {"ddp-order": [], "reverse-first-k": [], "ddp": []}
            per_pass: dict[str, list[float]] = {"ddp-order": [], "reverse-first-k": []}
            readings: list[dict[str, float]] = []
            for i in range(passes):
                tag = f" (pass {i + 1}/{passes})" if passes > 1 else ""
                for label, kk in (*orders, ("ddp", 0)):
                    if label == "ddp":
                        log(f"running torch DDP{tag} (reference, not predicted)")
                        run_cfg = DpRunConfig(mode="ddp", **_zoo_fields(case), **base)  # type: ignore[arg-type]
                    else:
                        log(f"running {case.model} k={kk} ({label}){tag}, predicted before the runs {preds[label]:.1f} ms")
                        run_cfg = DpRunConfig(mode="ooo", k=kk, **_zoo_fields(case), **base)  # type: ignore[arg-type]
                    res = run_dp(run_cfg, popen=popen, master=master, port=free_port())
                    got[label].append(res)
                    log(f"  measured {res['step_ms']:.1f} ms")
                alone, together = host_reading([got[label][-1]["ranks"] for label in got])
                speed, factor = alone / alone_ref, max(1.0, together / alone)
                readings.append({"host_speed": round(speed, 4), "corun_factor": round(factor, 4)})
                for label, kk in orders:
                    per_pass[label].append(_predict(prof, case.batch_size, kk, link, replace(terms[kk], factor=factor), speed))
                log(f"  the loop alone x{speed:.3f} of its speed at profile time, co-run factor {factor:.3f}; "
                    "predicted from these: "
                    + ", ".join(f"{label} {per_pass[label][-1]:.1f} ms" for label, _ in orders))  # fmt: skip
            measured = {label: statistics.median(r["step_ms"] for r in rs) for label, rs in got.items()}
            for label, kk in orders:
                rs = got[label]
                cfg = {
                    "model": case.model,
                    "rate_mbit": case.rate_mbit,
                    "delay_ms": case.delay_ms,
                    "k": kk,
                    "mode": label,
                    "batch_size": case.batch_size,
                }
                runs.append(
                    _row(
                        cfg,
                        statistics.median(per_pass[label]),
                        measured[label],
                        {
                            "predicted_before_runs_ms": round(preds[label], 3),
                            "passes_predicted_ms": [round(v, 3) for v in per_pass[label]],
                            "passes_host_reading": readings,
                            "profile_time_loop_ms": round(alone_ref, 3),
                            "profile_time_loop_steps_ms": [round(r, 3) for r in ref_steps[case.batch_size]],
                            "host_factor": round(terms[kk].factor, 3),
                            "host_extra_ms": round(terms[kk].extra_us / 1e3, 3),
                            "measured_median_ms": round(statistics.median(r["step_median_ms"] for r in rs), 3),
                            "measured_min_ms": round(min(r["step_min_ms"] for r in rs), 3),
                            "passes_ms": [round(r["step_ms"], 3) for r in rs],
                            "calibrated_a_us": round(cal.a_us, 1),
                            "calibrated_b_us_per_byte": cal.b_us_per_byte,
                            "load_probe": probe,
                        },
                    )
                )
            ratios = [a["step_ms"] / b["step_ms"] for a, b in zip(got["ddp-order"], got["reverse-first-k"], strict=True)]
            vs_ddp = [a["step_ms"] / b["step_ms"] for a, b in zip(got["ddp"], got["reverse-first-k"], strict=True)]
            speedups.append(
                {
                    "model": case.model,
                    "rate_mbit": case.rate_mbit,
                    "delay_ms": case.delay_ms,
                    "k": k,
                    "predicted_speedup": round(statistics.median(
                        a / b for a, b in zip(per_pass["ddp-order"], per_pass["reverse-first-k"], strict=True)), 3),
                    "predicted_speedup_before_runs": round(preds["ddp-order"] / preds["reverse-first-k"], 3),
                    "measured_speedup": round(statistics.median(ratios), 3),
                    "measured_speedup_vs_torch_ddp": round(statistics.median(vs_ddp), 3),
                    "torch_ddp_ms": round(measured["ddp"], 3),
                    "passes": passes,
                }
            )
    return {**summary(runs), "speedups": speedups, "notes": notes}


def _predict(
    prof: Any, batch_size: int, k: int, link: tuple[Any, Any, Any], host: HostTerms, speed: float = 1.0
) -> float:
    """``predict_dp`` of order ``k`` with ``link`` = (all-reduce time, host CPU, slowdown) per size, the
    profile scaled by ``speed``."""
    from trainsim.transform.ooo import predict_dp

    comm, cpu_us, slowdown = link
    return predict_dp(prof.scaled(speed), batch_size, k, comm, cpu_us=cpu_us, slowdown=slowdown, host=host)


def _zoo_fields(case: OooCase) -> dict[str, Any]:
    return {"zoo_blocks": case.blocks} if case.model in ("transformer", "mlp") else {}


@click.command("ooo-dp")
@click.option("--quick", is_flag=True, help="one configuration, short runs")
@click.option("--model", type=click.Choice(["mlp", "cnn", "transformer"]), help="zoo model for a custom case")
@click.option("--blocks", type=click.IntRange(min=1), default=None,
              help="transformer blocks / mlp depth (custom case; default 4)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="link rate, Mbit/s (custom case)")
@click.option("--delay", type=click.FloatRange(min=0), default=None, help="added one-way latency, ms (custom case; default 0)")
@click.option("--k", type=int, help="layers reordered (default: the simulator's best k)")
@click.option("--steps", type=int, default=12, show_default=True)
@click.option("--passes", type=int, default=1, show_default=True,
              help="runs per order, all runs once per pass; the medians are reported")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def ooo_dp_command(
    quick: bool,
    model: str | None,
    blocks: int | None,
    rate: float | None,
    delay: float | None,
    k: int | None,
    steps: int,
    passes: int,
    as_json: bool,
) -> None:
    """Predict and measure reverse-first-k data parallelism against the DDP order on shaped links."""
    from rich.console import Console
    from rich.table import Table

    if steps < 1:
        raise UserError(f"validate ooo-dp: --steps {steps}; expected >= 1")
    if passes < 1:
        raise UserError(f"validate ooo-dp: --passes {passes}; expected >= 1")
    if k is not None and k < 0:
        raise UserError(f"validate ooo-dp: --k {k}; expected >= 0")
    if model or any(v is not None for v in (rate, k, blocks, delay)):
        cases: tuple[OooCase, ...] = (
            OooCase(
                model=model or "transformer", blocks=4 if blocks is None else blocks,
                rate_mbit=1000.0 if rate is None else rate, delay_ms=delay or 0.0, k=k,
            ),
        )
    else:
        cases = QUICK if quick else FULL
    if any(c.k is not None for c in cases):  # bad k: refuse before anything starts
        from trainsim.run.ooo_dp import check_k, zoo_layer_count

        for c in cases:
            if c.k is not None:
                check_k(c.k, zoo_layer_count(c.model, c.batch_size, c.zoo()), c.model)
    err = Console(stderr=True)
    out = run_ooo_validation(
        cases,
        steps=6 if quick else steps,
        warmup=2 if quick else 3,
        passes=passes,
        log=progress_log(err),
    )
    if as_json:
        click.echo(json.dumps(out))
        return
    for n in out["notes"]:
        err.print(f"[yellow]note:[/] {n}")
    table = Table(title="validate ooo-dp: predicted vs measured step time")
    for col in ("model", "link", "order", "k", "predicted ms", "measured ms", "error"):
        table.add_column(col)
    for r in out["runs"]:
        c = r["config"]
        table.add_row(
            c["model"],
            link_label(c["rate_mbit"], c["delay_ms"]),
            c["mode"],
            str(c["k"]),
            f"{r['predicted_ms']:.1f}",
            f"{r['measured_ms']:.1f}",
            f"{r['error_pct']:+.1f}%",
        )
    Console().print(table)
    for s in out["speedups"]:
        click.echo(
            f"{s['model']} {link_label(s['rate_mbit'], s['delay_ms'])} k={s['k']}: speed-up over DDP order "
            f"predicted {s['predicted_speedup']}x, measured {s['measured_speedup']}x "
            f"(vs torch DDP {s['measured_speedup_vs_torch_ddp']}x)"
        )
    click.echo(f"mean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}%")
