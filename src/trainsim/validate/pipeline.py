"""``trainsim validate pipeline``: every pipeline schedule on 2 processes, predicted and measured.

    $ trainsim validate pipeline --quick
    $ trainsim validate pipeline --microbatches 4 --microbatches 8 --json

1. **profile** the model in one process at each microbatch size (``trainsim.capture.layerprofile``),
   and the pipeline runtime's own cost per action, also in one process
   (``pipeline_action_overhead_us``: torch's runtime on one stage vs the per-layer calls, paired);
2. **plan** the stage split from that profile: the one with the shortest simulated step
   (``trainsim.transform.pipeline.choose_split``);
3. **emulate the network** (2 shaped namespaces) and **calibrate** gloo on it; a point-to-point
   transfer of S bytes costs the fitted line of measured one-way sends (``Calibration.p2p_line``);
4. **probe** the runtime's own cost per send or receive: the schedule with the most of them, run and
   predicted on the zoo's hollow transformer (same activations, almost no compute); the difference per
   SEND/RECV action is added to every transfer's host CPU (``_probe_p2p_overhead_us``; ``--no-probe``);
5. **measure** each schedule with ``trainsim.run.pipeline`` (the order of torch's own schedule
   object, executed by torch's runtime); its measured steps come in segments, each after a reading of
   the host's speed (``run.ranks.host_speed_round``: the plain loop of the whole model at the
   microbatch size on each rank alone, then on both at once);
6. **predict** it from the readings of the pass's runs at that microbatch count, by replaying the
   lowered form of the same action order: the profile scaled by the loop alone now over the same
   loop timed when the model was profiled (a shared host's speed drifts by 10-30 % within minutes),
   and the ranks' computation slowed while both compute by the co-run factor (``host_reading``:
   together / alone);
7. report errors, and whether the predicted ranking of schedules matches the measured one wherever
   the measured gap exceeds ``--rank-gap`` percent.

``--pin`` (``PipeCase.pin``) keeps each rank of the probe and of the measured runs on a core of its own
(``run.ranks.pin_to_core``); the calibration stays unpinned (docs/ooo.md, "One core per rank").
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from trainsim.errors import UserError
from trainsim.run.ranks import free_port, pin_refused_note, run_queue_ms
from trainsim.validate import progress_log

SCHEDULE_SET: tuple[tuple[str, int], ...] = (
    ("GPipe", 1),
    ("1F1B", 1),
    ("InterleavedZeroBubble", 1),
    ("Interleaved1F1B", 2),
    ("ZBVZeroBubble", 2),
    ("DualPipeV", 2),
)
"""(schedule, stages per rank) measured by default: single-stage and two-stage (interleaved, V) ones."""

PROBE_RUNS = 3
"""runs of the hollow model per microbatch count in the runtime probe (``_probe_p2p_overhead_us``)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipeCase:
    model: str = "transformer"
    blocks: int = 6
    batch_size: int = 32
    microbatches: tuple[int, ...] = (4, 8, 16)
    schedules: tuple[tuple[str, int], ...] = SCHEDULE_SET
    rate_mbit: float | None = 1000.0
    delay_ms: float = 0.0
    pin: bool = False
    """each rank on a core of its own in the runtime probe and the measured runs (``run.ranks.pin_to_core``;
    the calibration unpinned). Off by default: pinned, the predictions came out 4-6 % high on average
    and up to 15 % (docs/ooo.md, "One core per rank")."""
    comm_nice: int = 0
    """nice value of every rank's gloo socket-loop thread in the runtime probe and the measured runs
    (``PipeRunConfig.comm_nice``); 0: as gloo starts it (docs/ooo.md, "The socket loop's spin")"""

    def zoo(self) -> dict[str, int]:
        return (
            {"blocks": self.blocks}
            if self.model == "transformer"
            else ({"depth": self.blocks} if self.model == "mlp" else {})
        )


QUICK = PipeCase(microbatches=(4,), schedules=(("GPipe", 1), ("1F1B", 1), ("ZBVZeroBubble", 2)))
FULL = PipeCase()


def check_case(case: PipeCase) -> None:
    """Refuse bad input before any process starts."""
    from trainsim.run.pipeline import PipeRunConfig

    for m in case.microbatches:
        for name, spr in case.schedules:
            PipeRunConfig(
                model=case.model,
                schedule=name,
                stages_per_rank=spr,
                microbatches=m,
                batch_size=case.batch_size,
                blocks=case.blocks,
            )


def ranking_check(rows: list[dict[str, Any]], gap_pct: float) -> dict[str, Any]:
    """Pairs of schedules (same microbatches) whose measured gap > gap_pct: is the predicted order the same?
    Each misranked pair also gets its measured and predicted gaps (% of the faster) and, where the rows
    carry their passes (``passes_ms``, pass k of every row in the same sweep), in how many passes the
    measured order was the one of the medians (``misranked_detail``): how firmly the run ranks them."""
    pairs, wrong, detail = 0, [], []
    by_m: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_m.setdefault(r["config"]["microbatches"], []).append(r)
    for m, rs in by_m.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                lo, hi = sorted((a["measured_ms"], b["measured_ms"]))
                if 100 * (hi - lo) / lo <= gap_pct:
                    continue
                pairs += 1
                a_first = a["measured_ms"] < b["measured_ms"]
                if a_first != (a["predicted_ms"] < b["predicted_ms"]):
                    name = f"M={m}: {a['config']['label']} vs {b['config']['label']}"
                    wrong.append(name)
                    pa, pb = a.get("passes_ms", []), b.get("passes_ms", [])
                    same = sum((x < y) == a_first for x, y in zip(pa, pb, strict=False))
                    p_lo, p_hi = sorted((a["predicted_ms"], b["predicted_ms"]))
                    detail.append({"pair": name, "measured_gap_pct": round(100 * (hi - lo) / lo, 2),
                                   "predicted_gap_pct": round(100 * (p_hi - p_lo) / p_lo, 2),
                                   "passes_in_measured_order": f"{same}/{min(len(pa), len(pb))}"})  # fmt: skip
    return {"gap_pct": gap_pct, "pairs_checked": pairs, "pairs_misranked": wrong, "misranked_detail": detail,
            "ranking_ok": not wrong}  # fmt: skip


def misranked_lines(ranking: dict[str, Any]) -> list[str]:
    """``ranking_check``'s misranked pairs, each with its measured and predicted gaps and how many
    passes measured it in the medians' order (the bare names where the detail is missing)."""
    return [f"{d['pair']} (measured {d['measured_gap_pct']:.1f} % apart, in that order in "
            f"{d['passes_in_measured_order']} passes; predicted {d['predicted_gap_pct']:.1f} % the other way)"
            for d in ranking.get("misranked_detail", [])] or list(ranking["pairs_misranked"])  # fmt: skip


def run_pipeline_validation(
    case: PipeCase,
    *,
    steps: int = 8,
    warmup: int = 2,
    rank_gap_pct: float = 5.0,
    log: Callable[[str], None] = lambda s: None,
    probe: bool = True,
    passes: int = 1,
) -> dict[str, Any]:
    """Predict and measure every schedule of ``case``; each configuration is predicted (with the co-run
    factor measured again in each pass) and measured ``passes`` times, all configurations once per
    pass; its prediction and its measurement are the medians over its passes."""
    import statistics

    from trainsim.capture.layerprofile import pipeline_action_overhead_us
    from trainsim.cluster.calibrate import calibrate
    from trainsim.run.pipeline import PipeRunConfig, run_pipeline
    from trainsim.transform.pipeline import Link, PipeSpec, predict_pipeline
    from trainsim.validate.ooo import emulated_link, link_label, summary

    check_case(case)
    if passes < 1:
        raise UserError(f"passes={passes}; expected >= 1")
    micro = sorted({case.batch_size // m for m in case.microbatches})
    # the plain loop's speed at the time of the profile: timed in step with the profile's own steps, the
    # median of 40 single steps at each microbatch size (``profile_with_reference``). Until 2026-11-27
    # the fastest of three readings, before the profile, after it and after the runtime-overhead
    # calibration, which could land on another speed than the profile's (2026-11-27 17:42: 14.3, 13.9
    # and 12.5 ms for microbatches of 2; every M = 16 run predicted 2-17 % high)
    log(f"profiling {case.model} at microbatch sizes {micro} (one process, one thread), the plain loop "
        "timed in step with it")  # fmt: skip
    prof, ref_steps = profile_with_reference(case.model, case.blocks, tuple(micro), reps=20, zoo=case.zoo())
    alone_ref = {b: statistics.median(v) for b, v in ref_steps.items()}
    overhead = {
        m: pipeline_action_overhead_us(prof, case.batch_size // m, microbatches=m, zoo=case.zoo())
        for m in case.microbatches
    }
    log("runtime overhead per action (us): " + ", ".join(f"M={m}: {v:.0f}" for m, v in overhead.items()))
    log("the plain loop alone, at profile time: " + ", ".join(
        f"microbatch {b}: {v:.1f} ms (median of {len(ref_steps[b])} steps, {min(ref_steps[b]):.1f}-{max(ref_steps[b]):.1f})"
        for b, v in alone_ref.items()))  # fmt: skip
    notes: list[str] = []
    runs: list[dict[str, Any]] = []
    with emulated_link(case.rate_mbit, case.delay_ms, notes) as (net, popen, master):
        # the activations' sizes, and sizes up to 1 MiB: on a fast link small messages are all fixed
        # cost, and a fit on them alone leaves the per-byte cost undetermined (it came out 0)
        out_bytes = sorted({int(r["out_bytes"]) for b in micro for r in prof.table(b)} | {1024, 256 << 10, 1 << 20})
        log(f"calibrating gloo on {link_label(case.rate_mbit, case.delay_ms)}")
        # not pinned: pinned, its point-to-point line read 1.27-1.63 ms per message against 0.20-0.46
        # unpinned (2026-11-27); the runtime probe, run as the measured runs are, corrects the charge per message
        cal = calibrate(
            world=2, rate_mbit=case.rate_mbit, delay_ms=case.delay_ms, sizes=out_bytes, reps=5, net=net,
            p2p_sizes=out_bytes,
        )
        # a transfer of S bytes: the measured one-way point-to-point line (see module docstring)
        c0, c1 = cal.cpu_line(p2p=True)
        latency_us, us_per_byte = cal.p2p_line()
        link = Link(bw_gbps=8 / (us_per_byte * 1e3), latency_us=latency_us, cpu_us=c0, cpu_us_per_byte=c1)
        log(f"host CPU per send or receive: {c0:.0f} us + {c1 * 1e3:.3f} us/KB")
        step_us = 0.0
        if probe and case.model == "transformer":
            extra_us, step_us = _probe_p2p_overhead_us(case, prof, link, cal.slowdown, steps, warmup, popen, master, log)
            link = dataclasses.replace(link, cpu_us=link.cpu_us + extra_us)
            probe_us = round(extra_us, 1)
        else:
            probe_us = 0.0
        # a post on a busy host waits now and then for gloo's network thread, itself waiting for a
        # core: the hollow probe's idle host does not show it (``Calibration.busy_post_us``)
        busy_us = cal.busy_post_us()
        log(f"posting a send or receive while the ranks compute: +{busy_us:.0f} us over an idle host "
            f"(per size: {', '.join(f'{i:.0f}/{b:.0f}' for i, b in zip(cal.post_idle_us, cal.post_busy_us, strict=False))} us idle/busy)"
            + ("; not charged: the ranks run pinned, where a post does not wait for the peer's computation" if case.pin else ""))  # fmt: skip
        if not case.pin:
            link = dataclasses.replace(link, cpu_us=link.cpu_us + busy_us)
        # every configuration once per pass, the passes one after the other: a burst of load on the
        # shared host then disturbs one pass of a configuration, and the median of the passes drops it.
        # Each run reads the host's speed between its segments of measured steps, and its prediction
        # uses that reading (as ``validate dp`` does): a co-run factor read before the runs moved
        # between 1.00 and 1.28 from one sweep to the next, and on the 2026-11-24 VM between 0.91 and
        # 1.51 within two minutes, while the loop alone drifted from 0.80 to 1.28 of its profile.
        # The stage split is the plan's (at the profile's speed) in the first pass, kept for the later ones.
        rows: dict[tuple[int, str, int], tuple[dict[str, Any], Any]] = {}

        def predict(spec: Any, split: Any, m: int, speed: float, corun: float, busy_share: float | None = None) -> Any:
            return predict_pipeline(
                prof.scaled(speed), spec, batch_size=case.batch_size, link=link, split=split,
                overhead_us=overhead[m] * speed, slowdown=cal.slowdown, busy_share=busy_share, corun_factor=corun,
                step_overhead_us=step_us,
            )  # fmt: skip

        for k in range(passes):
            for m in case.microbatches:
                done: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []  # (spec, row, result) of this M
                for name, spr in case.schedules:
                    spec = PipeSpec(schedule=name, stages_per_rank=spr, microbatches=m)
                    key = (m, name, spr)
                    if key not in rows:
                        sizes = tuple(len(s) for s in predict(spec, None, m, 1.0, 1.0).split)
                        row: dict[str, Any] = {
                            "config": {
                                "label": f"{name}/{spr}",
                                "schedule": name,
                                "stages_per_rank": spr,
                                "microbatches": m,
                                "split": list(sizes),
                                "model": case.model,
                                "blocks": case.blocks,
                                "batch_size": case.batch_size,
                                "rate_mbit": case.rate_mbit,
                                "delay_ms": case.delay_ms,
                                "pinned": case.pin,
                                "comm_nice": case.comm_nice,
                            },
                            "passes_ms": [],
                            "action_overhead_us": round(overhead[m], 1),
                        }
                        run_cfg = PipeRunConfig(model=case.model, schedule=name, stages_per_rank=spr, microbatches=m,
                                                batch_size=case.batch_size, split=sizes, blocks=case.blocks, steps=steps,
                                                warmup=warmup, host_rounds=HOST_ROUNDS, pin=case.pin,
                                                comm_nice=case.comm_nice)  # fmt: skip
                        rows[key] = (row, run_cfg)
                    row, run_cfg = rows[key]
                    log(f"running {name}/{spr} M={m} (pass {k + 1}/{passes}), its steps in segments between "
                        "readings of the host's speed")  # fmt: skip
                    res = run_pipeline(run_cfg, popen=popen, master=master, port=free_port())
                    refused = sorted({r["comm_nice_error"] for r in res["ranks"] if r.get("comm_nice_error")})
                    for note in (pin_refused_note(r.get("pin_error") for r in res["ranks"]),
                                 f"the socket loops' nice value refused ({'; '.join(refused)})" if refused else None):  # fmt: skip
                        if note and note not in notes:
                            notes.append(note)
                    row["passes_ms"].append(round(res["step_ms"], 3))
                    row.setdefault("passes_median_ms", []).append(round(res["step_median_ms"], 3))
                    row.setdefault("passes_min_ms", []).append(round(res["step_min_ms"], 3))
                    alone, together = host_reading([res["ranks"]])
                    row.setdefault("passes_run_reading_ms", []).append([round(alone, 3), round(together, 3)])
                    row.setdefault("passes_post_us", []).append(post_us_per_op(res["ranks"]))
                    waited = run_queue_ms([r.get("threads", {}) for r in res["ranks"]])
                    row.setdefault("passes_run_queue_ms", []).append(None if waited is None else round(waited, 3))
                    log(f"  measured {res['step_ms']:.1f} ms; the loop alone {alone:.1f} ms, together {together:.1f} ms"
                        + ("" if waited is None else f"; compute threads waited up to {waited:.1f} ms per step for a core"))
                    done.append((spec, row, res))
                # the readings of every run of this M in this pass, pooled: one run's few plain steps are
                # at the mercy of a second's load (a single run's co-run factor read 1.49 while that run
                # went as fast as its neighbours), the pass's minute of them is not
                alone, together = host_reading([res["ranks"] for _, _, res in done])
                speed = alone / alone_ref[case.batch_size // m]
                factor = max(1.0, together / alone)
                log(f"M={m}, pass {k + 1}: the loop alone x{speed:.3f} of its profile-time speed, co-run factor "
                    f"{factor:.3f}")  # fmt: skip
                for spec, row, res in done:
                    fixed = tuple(row["config"]["split"])
                    pred = predict(spec, fixed, m, speed, factor)
                    # the same with the busy-host slowdown counted in full while either rank computes
                    alt = predict(spec, fixed, m, speed, factor, busy_share=1.0).step_ms
                    for field, v in (("passes_predicted_ms", pred.step_ms), ("passes_busy_full_ms", alt),
                                     ("passes_corun_factor", factor), ("passes_host_speed", speed),
                                     # without the ranks slowing each other's computation (separate hosts)
                                     ("passes_no_corun_ms", predict(spec, fixed, m, speed, 1.0).step_ms),
                                     # the profile as taken, not brought to the host's speed of the runs
                                     ("passes_profile_speed_ms", predict(spec, fixed, m, 1.0, factor).step_ms)):  # fmt: skip
                        row.setdefault(field, []).append(round(v, 4))
                    log(f"  {row['config']['label']}: predicted {pred.step_ms:.1f} ms, measured {res['step_ms']:.1f} ms "
                        f"({100 * (pred.step_ms - res['step_ms']) / res['step_ms']:+.1f}%)")  # fmt: skip
        for row, _ in rows.values():
            meas = statistics.median(row["passes_ms"])
            pred_ms = statistics.median(row["passes_predicted_ms"])
            row["predicted_ms"] = round(pred_ms, 3)
            row["measured_ms"] = round(meas, 3)
            row["error_pct"] = round(100 * (pred_ms - meas) / meas, 2)
            row["predicted_busy_full_ms"] = round(statistics.median(row.pop("passes_busy_full_ms")), 3)
            row["corun_factor"] = round(statistics.median(row["passes_corun_factor"]), 4)
            row["host_speed"] = round(statistics.median(row["passes_host_speed"]), 4)
            row["predicted_no_corun_ms"] = round(statistics.median(row.pop("passes_no_corun_ms")), 3)
            row["predicted_profile_speed_ms"] = round(statistics.median(row["passes_profile_speed_ms"]), 3)
            row["measured_median_ms"] = statistics.median(row.pop("passes_median_ms"))
            row["measured_min_ms"] = min(row.pop("passes_min_ms"))
            waits = [w for w in row["passes_run_queue_ms"] if w is not None]
            row["run_queue_ms"] = round(statistics.median(waits), 3) if waits else None
            row["post_us"] = [{k: round(statistics.median(p[r][k] for p in row["passes_post_us"] if k in p[r]), 1)
                               for k in sorted({k for p in row["passes_post_us"] for k in p[r]})}
                              for r in range(len(row["passes_post_us"][0]))]  # fmt: skip
            runs.append(row)
    return {
        **summary(runs),
        "ranking": ranking_check(runs, rank_gap_pct),
        "notes": notes,
        "profile_time_loop_ms": {str(b): [round(v, 3) for v in ref_steps[b]] for b in micro},
        "link": {"bw_gbps": link.bw_gbps, "latency_us": link.latency_us, "cpu_us": link.cpu_us,
                 "cpu_us_per_byte": link.cpu_us_per_byte, "runtime_p2p_us": probe_us, "busy_post_us": round(busy_us, 1), "runtime_step_us": round(step_us, 1)},
    }  # fmt: skip


HOST_ROUNDS = 2
"""readings of the host's speed per measured run (``PipeRunConfig.host_rounds``)"""


def post_us_per_op(ranks: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per rank of a run (``run_pipeline``'s ``ranks``): the wall time of posting one operation (µs), by
    what the batch posted (``send``, ``recv``, ``send+recv``; ``trainsim.run.pipeline._time_p2p_calls``)."""
    out = []
    for r in ranks:
        ms, ops = r.get("p2p_ms_per_step", {}), r.get("p2p_ops_per_step", {})
        out.append({k: round(1e3 * ms["post:" + k] / n, 1) for k, n in ops.items() if n > 0})
    return out


def profile_with_reference(
    model: str, blocks: int, batch_sizes: tuple[int, ...], *, reps: int = 20, zoo: dict[str, Any] | None = None
) -> tuple[Any, dict[int, list[float]]]:
    """The per-layer profile of zoo ``model`` at each batch size (``capture.layerprofile.profile_layers``)
    and, timed in step with it, the plain loop whose speed the runs read (``run.ranks.host_speed_round``):
    before each of the profile's timed steps, two steps of the plain loop of the whole model (a copy,
    ``run.ranks.loop_marks``'s loop) on the profile's thread, the second timed. Returns the profile and
    those step times (ms) per batch size; their median is the loop's speed at profile time. Readings
    before and after the profile instead (the fastest of three, until 2026-11-27) could land on another
    speed than the profile's: 14.3 and 13.9 ms before and after it, 12.5 ms a minute later, and the
    runs predicted 2-17 % high at that batch size (docs/ooo.md, "Pipeline schedules", item 9)."""
    import torch

    from trainsim.capture.layerprofile import profile_layers
    from trainsim.models.zoo import build_with_batches
    from trainsim.run.ooo_dp import zoo_spec
    from trainsim.run.ranks import step_starts

    loss_fn = torch.nn.CrossEntropyLoss()
    loops: dict[int, tuple[Any, Any, Any]] = {}
    times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    count = itertools.count()

    def plain_step(bs: int) -> None:
        if bs not in loops:
            net, batch = build_with_batches(model, seed=1, spec=zoo_spec(model, bs, blocks))
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            step_starts(net, opt, batch, loss_fn, range(2))  # warm-up: the optimizer's state, the allocator
            loops[bs] = (net, batch, opt)
        net, batch, opt = loops[bs]
        i = next(count)
        starts = step_starts(net, opt, batch, loss_fn, range(2 * i, 2 * i + 2))
        times[bs].append(1e3 * (time.perf_counter() - starts[1]))

    prof = profile_layers(model, batch_sizes=batch_sizes, reps=reps, zoo=zoo, between=plain_step)
    return prof, times


def host_reading(runs: list[list[dict[str, Any]]]) -> tuple[float, float]:
    """``(alone, together)``: median step (ms) of the plain loop in the host-speed readings of
    ``runs`` (each a run's per-rank results with their ``host_speed`` rounds), pooled: run by each
    rank alone, and by all at once (only the steps that ran while every rank ran,
    ``validate.dp.overlapping_steps``; the median over ranks of each rank's median)."""
    import statistics

    from trainsim.validate.dp import _median_step_ms, interleaved_corun

    alone: list[float] = []
    per_rank: list[list[float]] = [[] for _ in runs[0]] if runs else []
    for ranks in runs:
        alone += [(b - a) * 1e3 for r in ranks for rd in r["host_speed"] for a, b in itertools.pairwise(rd["alone"])]
        together = interleaved_corun([[rd["together"] for rd in r["host_speed"]] for r in ranks])
        for i, st in enumerate(together):
            per_rank[i] += st
    if not alone or not per_rank or not all(per_rank):
        raise ValueError("host_reading: the runs recorded no host-speed rounds (host_rounds=0)")
    return float(statistics.median(alone)), _median_step_ms(per_rank)


def comm_actions(spec: Any) -> int:
    """SEND and RECV actions per step on the busiest rank of ``spec``'s lowered order."""
    from trainsim.transform.pipeline import lowered_order

    kinds = {"SEND_F", "SEND_B", "RECV_F", "RECV_B"}
    return max(sum(a.computation_type.value in kinds for a in acts) for acts in lowered_order(spec).values())


def _probe_p2p_overhead_us(
    case: PipeCase, prof: Any, link: Any, slowdown: Any, steps: int, warmup: int, popen: Any, master: str,
    log: Callable[[str], None],
) -> tuple[float, float]:  # fmt: skip
    """The pipeline runtime's own cost on this host and link, beyond the calibrated transfers and their
    host CPU, as ``(per send or receive, per step)`` in µs: run the schedule with the most
    point-to-point actions on the zoo's *hollow* transformer (same activations, almost no compute) at
    the smallest and the largest microbatch count (the median of ``PROBE_RUNS`` runs each), predict
    both the same way, and fit the differences with a cost per step (>= 0) plus a cost per SEND/RECV
    action (``_fit_runtime_cost``; negative where the calibration's host CPU per message over-charges the
    runtime, down to none; one count: per action only). A property of the runtime, host and link, measured on a
    model other than the one predicted, like the collective calibration. (Read instead as a latency of
    every transfer, fitted against how much each hollow prediction grows per µs of latency, the same
    differences predicted far worse: docs/ooo.md, "One core per rank".)"""
    import statistics

    from trainsim.capture.layerprofile import profile_layers
    from trainsim.run.pipeline import PipeRunConfig, run_pipeline
    from trainsim.transform.pipeline import PipeSpec, predict_pipeline

    m_hi = max(case.microbatches)
    name, spr = max(case.schedules, key=lambda s: comm_actions(PipeSpec(schedule=s[0], stages_per_rank=s[1], microbatches=m_hi)))
    split = [len(s) for s in predict_pipeline(prof, PipeSpec(schedule=name, stages_per_rank=spr, microbatches=m_hi),
                                              batch_size=case.batch_size, link=link).split]  # fmt: skip
    points: list[tuple[int, float]] = []  # (SEND/RECV actions per step, measured - predicted µs)
    for m in sorted({min(case.microbatches), m_hi}):
        spec = PipeSpec(schedule=name, stages_per_rank=spr, microbatches=m)
        hollow = profile_layers(case.model, batch_sizes=(case.batch_size // m,), reps=20, zoo={**case.zoo(), "hollow": True})
        pred = predict_pipeline(hollow, spec, batch_size=case.batch_size, link=link, split=split, slowdown=slowdown).step_ms
        cfg = PipeRunConfig(model=case.model, schedule=name, stages_per_rank=spr, microbatches=m,
                            batch_size=case.batch_size, split=tuple(split), blocks=case.blocks, steps=steps,
                            warmup=warmup, hollow=True, pin=case.pin, comm_nice=case.comm_nice)  # fmt: skip
        # a single run of the hollow model moved by 20 % between probes minutes apart (56.6 and 67.0 ms
        # at M = 16), and every message of every prediction inherits it: the median of a few runs
        runs = [run_pipeline(cfg, popen=popen, master=master, port=free_port())["step_ms"]
                for _ in range(PROBE_RUNS)]  # fmt: skip
        meas = statistics.median(runs)
        n = comm_actions(spec)
        points.append((n, (meas - pred) * 1e3))
        log(f"runtime probe ({name}/{spr}, M={m}, hollow model): predicted {pred:.1f} ms, measured "
            f"{meas:.1f} ms (median of {' / '.join(f'{r:.1f}' for r in runs)}), {n} sends/receives per step")  # fmt: skip
    per_msg, per_step = _fit_runtime_cost(points, min_per_action=-link.cpu_us)
    log(f"runtime cost beyond the model: {per_msg:.0f} us per send/receive + {per_step / 1e3:.1f} ms per step")
    return per_msg, per_step


def _fit_runtime_cost(points: list[tuple[int, float]], min_per_action: float = 0.0) -> tuple[float, float]:
    """``(per action, per step)`` µs through ``(actions, extra µs)`` points, per action >= ``min_per_action``
    (negative: the calibrated host CPU per message over-charges the runtime, at most by itself) and per
    step >= 0: the line through two points; a line through the origin where the two-point line's cost
    per step would be negative, or for one point; the floor per action and the mean of the rest per
    step where the line's cost per action is below the floor."""
    if len(points) == 2 and points[0][0] != points[1][0]:
        (n1, d1), (n2, d2) = sorted(points)
        a = (d2 - d1) / (n2 - n1)
        f = d1 - a * n1
        if a >= min_per_action and f >= 0:
            return a, f
        if a < min_per_action:  # more messages, less extra: the floor per action, the rest per step
            return min_per_action, max(0.0, (d1 + d2 - min_per_action * (n1 + n2)) / 2)
    num = sum(n * d for n, d in points)
    den = sum(n * n for n, _ in points)
    return (max(min_per_action, num / den) if den else 0.0), 0.0


@click.command("pipeline")
@click.option("--quick", is_flag=True, help="3 schedules at 4 microbatches, short runs")
@click.option("--microbatches", "mbs", type=click.IntRange(min=1), multiple=True, help="microbatch counts (default 4, 8, 16)")
@click.option(
    "--schedule", "schedules", multiple=True, help="SCHEDULE or SCHEDULE/STAGES_PER_RANK (default: all)"
)
@click.option("--blocks", type=click.IntRange(min=1), default=6, show_default=True, help="transformer blocks")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1000.0, show_default=True, help="link rate, Mbit/s")
@click.option("--delay", type=click.FloatRange(min=0), default=0.0, show_default=True, help="added one-way latency, ms")
@click.option("--steps", type=int, default=8, show_default=True)
@click.option(
    "--rank-gap", type=float, default=5.0, show_default=True, help="ranking checked above this gap, %"
)
@click.option("--no-probe", is_flag=True, help="no runtime probe on the hollow model (see the module docstring)")
@click.option("--pin", is_flag=True,
              help="each rank of the probe and the runs on a core of its own (run.ranks.pin_to_core; see docs/ooo.md)")
@click.option("--comm-nice", type=click.IntRange(0, 19), default=0, show_default=True,
              help="nice value of each rank's gloo socket-loop thread (emulation only; see docs/ooo.md)")
@click.option("--passes", type=int, default=1, show_default=True,
              help="runs per configuration, all configurations once per pass; the medians are reported")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def pipeline_command(
    quick: bool,
    mbs: tuple[int, ...],
    schedules: tuple[str, ...],
    blocks: int,
    batch_size: int,
    rate: float,
    delay: float,
    steps: int,
    rank_gap: float,
    no_probe: bool,
    pin: bool,
    comm_nice: int,
    passes: int,
    as_json: bool,
) -> None:
    """Predict and measure GPipe, 1F1B, interleaved and zero-bubble schedules on 2 processes."""
    from rich.console import Console
    from rich.table import Table

    from trainsim.validate.ooo import link_label

    if steps < 1:
        raise UserError(f"validate pipeline: --steps {steps}; expected >= 1")
    if passes < 1:
        raise UserError(f"validate pipeline: --passes {passes}; expected >= 1")
    base = QUICK if quick else FULL
    scheds = tuple(_parse_schedule(s) for s in schedules) or base.schedules
    case = PipeCase(
        model="transformer",
        blocks=blocks,
        batch_size=batch_size,
        microbatches=mbs or base.microbatches,
        schedules=scheds,
        rate_mbit=rate,
        delay_ms=delay,
        pin=pin,
        comm_nice=comm_nice,
    )
    check_case(case)
    err = Console(stderr=True)
    out = run_pipeline_validation(
        case,
        steps=5 if quick else steps,
        warmup=2,
        rank_gap_pct=rank_gap,
        probe=not no_probe,
        passes=passes,
        log=progress_log(err),
    )
    if as_json:
        click.echo(json.dumps(out))
        return
    for n in out["notes"]:
        err.print(f"[yellow]note:[/] {n}")
    table = Table(title=f"validate pipeline ({link_label(rate, delay)}): predicted vs measured step time")
    for col in ("schedule", "M", "split", "predicted ms", "measured ms", "error"):
        table.add_column(col)
    for r in out["runs"]:
        c = r["config"]
        table.add_row(
            c["label"],
            str(c["microbatches"]),
            ",".join(map(str, c["split"])),
            f"{r['predicted_ms']:.1f}",
            f"{r['measured_ms']:.1f}",
            f"{r['error_pct']:+.1f}%",
        )
    Console().print(table)
    rk = out["ranking"]
    click.echo(
        f"ranking (gap > {rk['gap_pct']}%): {rk['pairs_checked']} pairs, misranked: "
        f"{'; '.join(misranked_lines(rk)) or 'none'}"
    )
    click.echo(f"mean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}%")


def _parse_schedule(text: str) -> tuple[str, int]:
    from trainsim.transform.pipeline import SCHEDULES

    name, _, spr = text.partition("/")
    if name not in SCHEDULES:
        raise UserError(f"--schedule {text!r}: unknown schedule; expected one of {', '.join(SCHEDULES)}")
    try:
        return name, int(spr) if spr else SCHEDULES[name].min_spr
    except ValueError as exc:
        raise UserError(f"--schedule {text!r}: expected SCHEDULE or SCHEDULE/STAGES_PER_RANK") from exc
