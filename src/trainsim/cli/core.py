"""Core commands: profile, replay, whatif, bench-sim and the demo.

    $ trainsim profile --model cnn --out out/cnn.json.gz
    $ trainsim replay out/cnn.json.gz --json
    $ trainsim whatif out/cnn.json.gz --fused-optimizer --scale 'op:aten::convolution=0.5'
    $ trainsim bench-sim --tasks 1000000 --json
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from trainsim.cli.options import FORCE_OPT, JSON_OPT, check_new_file
from trainsim.errors import UserError


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def _emit_json(obj: dict[str, Any]) -> None:
    click.echo(json.dumps(obj, indent=None, separators=(",", ":")))


def _load(trace: str) -> Any:
    return _load_with_trace(trace)[1]


def _load_with_trace(trace: str) -> tuple[Any, Any]:
    """The parsed trace and its task graph (what-ifs that read the operators' shapes need both)."""
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph

    with warnings.catch_warnings(record=True) as caught, _console_err().status(f"reading {trace}") as status:
        warnings.simplefilter("always")
        tr = read_trace(trace)
        status.update(f"building the task graph of {len(tr.events)} events")
        g = build_graph(tr)
    for w in caught:
        click.echo(f"trainsim: warning: {w.message}", err=True)
    return tr, g


def _measured_ms(g: Any) -> float | None:
    """Mean measured step time of the trace (None when the graph has no traced steps)."""
    m = g.steps.measured_us
    return float(m.mean() / 1000.0) if m.size else None


def _steps_json(g: Any, res: Any) -> list[dict[str, Any]]:
    import numpy as np

    measured = g.steps.measured_us / 1000.0
    ids, t0, t1 = res.step_bounds_us()
    sim = (t1 - t0) / 1000.0
    out = []
    for i, s in enumerate(ids.tolist()):
        m = float(measured[i]) if i < measured.size else None
        out.append({"step": int(s), "measured_ms": m, "simulated_ms": float(sim[i]) if np.isfinite(sim[i]) else None})
    return out


def _summary(g: Any, res: Any) -> dict[str, Any]:
    import numpy as np

    steps = _steps_json(g, res)
    meas = [s["measured_ms"] for s in steps if s["measured_ms"] is not None]
    errs = [
        abs(s["simulated_ms"] - s["measured_ms"]) / s["measured_ms"] * 100
        for s in steps
        if s["measured_ms"] and s["simulated_ms"] is not None
    ]
    return {
        "trace": g.source,
        "tasks": g.n_tasks,
        "edges": g.n_edges,
        "resources": len(g.resources),
        "steps": steps,
        "measured_ms": float(np.mean(meas)) if meas else None,
        "simulated_ms": res.mean_step_ms,
        "median_abs_error_pct": float(np.median(errs)) if errs else None,
        "max_abs_error_pct": float(np.max(errs)) if errs else None,
        "breakdown_ms": {k: float(v) for k, v in res.breakdown().items()},
        "critical_path": res.critical_path_summary(top=5),
    }


def _print_table(title: str, rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    from rich.table import Table

    t = Table(title=title)
    for h in header:
        t.add_column(h, justify="right" if h != header[0] else "left")
    for r in rows:
        t.add_row(*r)
    _console().print(t)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@click.command()
@click.argument("trace", nargs=-1, required=True, type=click.Path())
@JSON_OPT
@click.option("--timeline", type=click.Path(dir_okay=False), help="Write the simulated timeline (Chrome trace).")
@click.option("--no-straggler", is_flag=True,
              help="Several ranks: also predict the step with the slowest rank computing like the median one.")
@FORCE_OPT
def replay(trace: str | tuple[str, ...], as_json: bool, timeline: str | None, force: bool,
           no_straggler: bool = False) -> None:  # fmt: skip
    """Replay TRACE (a Kineto .json/.json.gz) and compare simulated with measured step times.

    Several traces, or a folder of them, are the ranks of one job: replayed together, with their
    clocks aligned at the collectives."""
    from trainsim.graph.gpusync import fixed_wait_ms_per_step
    from trainsim.simulate.engine import simulate

    paths = (trace,) if isinstance(trace, str) else tuple(trace)
    check_new_file(timeline, force, "--timeline")
    if len(paths) > 1 or Path(paths[0]).is_dir():
        _replay_job(paths, as_json, timeline, no_straggler)
        return
    if no_straggler:
        raise UserError("replay: --no-straggler needs the ranks of a job (a folder of traces or several traces)")
    trace = paths[0]
    g = _load(trace)
    res = simulate(g)
    out = _summary(g, res)
    # durations kept as measured that may hide a wait the graph does not model (graph.gpusync)
    out["kept_fixed_ms_per_step"] = fixed_wait_ms_per_step(g)
    if timeline:
        out["timeline"] = str(_safe_write(timeline, res))
    if as_json:
        _emit_json(out)
        return
    rows = [(str(s["step"]), _fmt(s["measured_ms"]), _fmt(s["simulated_ms"])) for s in out["steps"]]
    rows.append(("mean", _fmt(out["measured_ms"]), _fmt(out["simulated_ms"])))
    _print_table(f"{Path(trace).name}: {g.n_tasks} tasks", rows, ("step", "measured ms", "simulated ms"))
    _print_breakdown(out)
    fixed = out["kept_fixed_ms_per_step"]
    why = ", ".join(f"{k} {v:.3f}" for k, v in fixed.items() if v > 0) or "none"
    click.echo(f"kept fixed: {sum(fixed.values()):.3f} ms/step ({why})")


def _replay_job(paths: tuple[str, ...], as_json: bool, timeline: str | None, no_straggler: bool) -> None:
    """``replay`` of several ranks (``graph.multirank``): the job's step, each rank's, the slowest rank."""
    from trainsim.graph.multirank import describe_rank, job_summary, load_job
    from trainsim.simulate.engine import simulate
    from trainsim.transform.straggler import remove_straggler, straggler_rank

    with warnings.catch_warnings(record=True) as caught, _console_err().status(f"reading {len(paths)} path(s)"):
        warnings.simplefilter("always")
        job = load_job(paths)
    for w in caught:
        click.echo(f"trainsim: warning: {w.message}", err=True)
    g = job.graph
    res = simulate(g)
    out = {"trace": [r.path for r in job.ranks], "tasks": g.n_tasks, "edges": g.n_edges,
           "resources": len(g.resources), **job_summary(job, res), "critical_path": res.critical_path_summary(top=5)}  # fmt: skip
    if no_straggler:
        slow = straggler_rank(g)
        alt = job_summary(job, simulate(remove_straggler(g, slow)))
        ms = alt["simulated_ms"]
        out["no_straggler"] = {"rank": slow, "simulated_ms": ms, "steps": alt["steps"],
                               "speedup": out["simulated_ms"] / ms if ms and out["simulated_ms"] else None}  # fmt: skip
    if timeline:
        out["timeline"] = str(_safe_write(timeline, res))
    if as_json:
        _emit_json(out)
        return
    rows = [(str(s["step"]), _fmt(s["measured_ms"]), _fmt(s["simulated_ms"]), str(s["slowest_rank"]))
            for s in out["steps"]]  # fmt: skip
    rows.append(("mean", _fmt(out["measured_ms"]), _fmt(out["simulated_ms"]), ""))
    _print_table(f"{len(job.ranks)} ranks: {g.n_tasks} tasks", rows,
                 ("step", "measured ms", "simulated ms", "slowest rank"))  # fmt: skip
    for s in out["steps"]:
        if s["slowest_rank"] is not None:
            click.echo(f"step {s['step']}: slowest {describe_rank(s['slowest'], s['slowest_rank'])}")
    offs = ", ".join(f"rank {r.rank} {r.offset_us:+.1f}" for r in job.ranks[1:])
    click.echo(f"clock offsets to rank {job.ranks[0].rank} (us): {offs}; {job.collectives} collectives matched, "
               f"ends agree to {job.residual_us:.1f} us (median)")  # fmt: skip
    if no_straggler:
        ns = out["no_straggler"]
        gain = f" ({ns['speedup']:.3f}x)" if ns["speedup"] else ""
        click.echo(f"without the straggler (rank {ns['rank']} computing like the median rank): "
                   f"{_fmt(ns['simulated_ms'])} ms per step{gain}")  # fmt: skip


def _print_breakdown(out: dict[str, Any]) -> None:
    b = out["breakdown_ms"]
    click.echo(
        "breakdown per step (ms): "
        + ", ".join(f"{k.removesuffix('_ms')} {v:.3f}" for k, v in b.items())
    )
    cp = out["critical_path"]
    top = ", ".join(f"{t['name'][:40]} {t['ms']:.2f}" for t in cp["top"][:3])
    click.echo(f"critical path: {cp['tasks']} tasks, {cp['length_ms']:.3f} ms; most time in: {top}")


def _safe_write(path: str, res: Any) -> Path:
    p = Path(path)
    if p.suffix != ".json":
        raise UserError(f"--timeline {path!r}: expected a path ending in .json")
    if not p.parent.exists():
        raise UserError(f"--timeline {path!r}: folder {p.parent} does not exist")
    out: Path = res.to_chrome_trace(p)
    return out


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--amp", is_flag=True, help="Automatic mixed precision (GEMM/conv kernels /3, others /2).")
@click.option("--fused-optimizer", is_flag=True, help="One fused optimizer task per step.")
@click.option("--fused-gbps", type=float, default=None, metavar="GB/S",
              help="The fused kernel's rate, bytes moved per second (--fused-optimizer); default: a GPU's catalog "
                   "bandwidth x 0.88, else the rate the trace's optimizer operators reached.")  # fmt: skip
@click.option("--batch-scale", type=click.FloatRange(min=0, min_open=True), default=None, metavar="F",
              help="A batch F times larger: ops that take the batch scale, per-parameter work does not (needs the "
                   "trace's sidecar).")  # fmt: skip
@click.option("--scale", "scales", multiple=True, metavar="SELECTOR=FACTOR",
              help="Scale selected tasks, e.g. 'kind:kernel,name:gemm=0.5'. Repeatable.")  # fmt: skip
@click.option("--ooo-dp", "ooo_dp", metavar="K|search",
              help="Out-of-order data parallel (reverse first-K); TRACE is a per-layer profile (trainsim ooo profile).")
@click.option("--pipeline", metavar="SCHEDULE",
              help="Pipeline schedule (GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble ...); TRACE is a per-layer profile.")
@click.option("--compress", "compress", metavar="ALGO",
              help="Data-parallel training with gradient compression (onebit, topk, powersgd ...); TRACE from trainsim profile.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), help="SeCoPa plan file for --compress.")
@click.option("--scheme", type=click.Choice(["allgather", "ps", "ring"]), default=None,
              help="Compression-aware synchronisation for --compress (default: the plan's topology, else allgather).")
@click.option("--world", type=click.IntRange(2, 100000), default=None,
              help="Ranks for --compress (default: the plan's world size, else 2).")
@click.option("--stages", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline stages per rank.")
@click.option("--microbatches", type=click.IntRange(min=1), default=4, show_default=True, help="Pipeline microbatches.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1000.0, show_default=True,
              help="Link rate, Mbit/s (--ooo-dp, --pipeline, --compress).")
@click.option("--device", "dst_device", metavar="NAME",
              help="Run the compute on this catalog device (with --from-device): roofline split of the tasks.")
@click.option("--from-device", "src_device", metavar="NAME", help="The device TRACE was recorded on (for --device).")
@click.option("--dtype", type=click.Choice(["fp32", "tf32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Precision of the compute-bound tasks for --device.")
@click.option("--network-cluster", "new_cluster", type=click.Path(dir_okay=False),
              help="Re-time TRACE's collectives for this cluster file (the network it would run on).")
@click.option("--from-cluster", "old_cluster", type=click.Path(dir_okay=False),
              help="The cluster file of the network TRACE was recorded on (keeps the measured overheads).")
@click.option("--network-bw-factor", "network_bw", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Without a cluster model: communication this many times faster (2 = twice the bandwidth).")
@click.option("--network-latency-us", type=click.FloatRange(min=0), default=None,
              help="Without a cluster model: add this latency to every communication task.")
@JSON_OPT
@click.option("--timeline", type=click.Path(dir_okay=False), help="Write the what-if timeline (Chrome trace).")
@FORCE_OPT
def whatif(trace: str, amp: bool, fused_optimizer: bool, fused_gbps: float | None, batch_scale: float | None, scales: tuple[str, ...], ooo_dp: str | None,
           pipeline: str | None, compress: str | None, plan_file: str | None, scheme: str | None, world: int | None,
           stages: int, microbatches: int, rate: float, dst_device: str | None, src_device: str | None, dtype: str,
           new_cluster: str | None, old_cluster: str | None, network_bw: float | None,
           network_latency_us: float | None, as_json: bool, timeline: str | None, force: bool) -> None:  # fmt: skip
    """Predict TRACE's step time after a change (AMP, fused optimizer, scaled tasks, another device or network,
    compression, OOO backprop, pipelines)."""
    from trainsim.simulate.engine import simulate
    from trainsim.transform import whatifs

    check_new_file(timeline, force, "--timeline")
    if ooo_dp is not None or pipeline is not None:
        _layer_whatif(trace, ooo_dp, pipeline, stages, microbatches, rate, as_json)
        return
    if compress is not None:
        from trainsim.transform.compression import predict

        if not Path(trace).is_file():
            raise UserError(f"{trace}: no such file; --compress needs a trace from trainsim profile")
        if plan_file is not None and (scheme is None or world is None):
            from trainsim.compress.secopa import Plan

            planned = Plan.load(plan_file)
            scheme = planned.topology if scheme is None else scheme
            world = planned.world_size if world is None else world
        scheme = scheme or "allgather"
        world = world or 2
        out = predict(trace, algorithm=compress, world=world, bw_gbyte_s=rate / 8e3, scheme=scheme, plan=plan_file)
        out["speedup"] = out["plain_ddp_ms"] / out["compressed_ms"] if out["compressed_ms"] > 0 else None
        if as_json:
            _emit_json(out)
        else:
            _print_table(f"{Path(trace).name}: {world} ranks, {rate:g} Mbit/s, {compress} ({scheme})",
                         [("plain DDP", _fmt(out["plain_ddp_ms"])), (f"compressed: {compress}",
                          _fmt(out["compressed_ms"]))], ("", "step ms"))  # fmt: skip
        return
    if plan_file is not None:
        raise UserError("--plan applies to --compress only")
    if (dst_device is None) != (src_device is None):
        raise UserError("whatif: --device and --from-device go together (the device to run on, the one recorded on)")
    if old_cluster is not None and new_cluster is None:
        raise UserError("whatif: --from-cluster goes with --network-cluster")
    network_scaled = network_bw is not None or network_latency_us is not None
    if fused_gbps is not None and not fused_optimizer:
        raise UserError("whatif: --fused-gbps goes with --fused-optimizer")
    if fused_gbps is not None and not (math.isfinite(fused_gbps) and fused_gbps > 0):
        raise UserError(f"--fused-gbps {fused_gbps!r}: expected the fused kernel's rate in GB/s, a number > 0")
    if not (amp or fused_optimizer or batch_scale or scales or dst_device or new_cluster or network_scaled):
        raise UserError("whatif: choose at least one of --amp, --fused-optimizer, --batch-scale, --scale, --device, "
                        "--network-cluster, --network-bw-factor, --network-latency-us, --ooo-dp, --pipeline, --compress")  # fmt: skip
    for s in scales:  # check the syntax before the (slower) trace load
        whatifs.parse_selector(s)
    if dst_device is not None and src_device is not None:  # unknown names before the trace load
        from trainsim.cluster.catalog import device

        devices = (device(src_device), device(dst_device))
    specs = None
    if new_cluster is not None:
        from trainsim.cluster.spec import load_cluster

        specs = (load_cluster(new_cluster), load_cluster(old_cluster) if old_cluster else None)
    tr, g = _load_with_trace(trace)
    base = simulate(g)
    g2 = g
    applied = []
    if amp:
        g2 = whatifs.amp(g2)
        applied.append("amp")
    if fused_optimizer:
        g2 = whatifs.fused_optimizer(g2, tr, kernel_gbps=fused_gbps)
        applied.append("fused-optimizer")
    if batch_scale is not None:
        _, batch, shapes = whatifs.batch_context(trace, tr)
        g2 = whatifs.batch_scale(g2, batch_scale, trace=tr, batch_size=batch, param_shapes=shapes)
        applied.append(f"batch x{batch_scale:g} ({batch} -> {batch * batch_scale:g} samples)")
    for s in scales:
        g2 = whatifs.scale_selected(g2, s)
        applied.append(f"scale {s}")
    if dst_device is not None:
        from trainsim.transform.device import change_device

        g2 = change_device(g2, src=devices[0], dst=devices[1], dtype=dtype)
        applied.append(f"device {devices[0].name} -> {devices[1].name} ({dtype})")
    split = None
    if (specs is not None and specs[1] is not None) or network_scaled:
        from trainsim.graph.ir import TaskKind
        from trainsim.transform.network import split_collectives

        if ((g2.kind == TaskKind.COMM) & (g2.size_bytes >= 0)).any():  # waiting for the peers is kept
            split = split_collectives(g2)
    if specs is not None:
        from trainsim.transform.network import retime_collectives

        g2 = retime_collectives(g2, new=specs[0], old=specs[1], split=split if specs[1] is not None else None)
        applied.append(f"network {new_cluster}" + (f" (recorded on {old_cluster})" if old_cluster else ""))
    if network_scaled:
        from trainsim.transform.network import scale_network

        g2 = scale_network(g2, bw_factor=network_bw or 1.0, latency_add_us=network_latency_us or 0.0,
                           split=split if specs is None else None)  # fmt: skip
        applied.append(f"network x{network_bw or 1.0:g} bandwidth, +{network_latency_us or 0.0:g} us")
    res = simulate(g2)
    out = _summary(g2, res)
    out["whatif"] = applied
    out["baseline_ms"] = base.mean_step_ms
    out["whatif_ms"] = res.mean_step_ms
    out["speedup"] = base.mean_step_ms / res.mean_step_ms if res.mean_step_ms > 0 else None
    out["measured_ms"] = _measured_ms(g)
    if split is not None:
        out["comm_split"] = split.note
    if timeline:
        out["timeline"] = str(_safe_write(timeline, res))
    if as_json:
        _emit_json(out)
        return
    rows = [("measured", _fmt(out["measured_ms"])), ("simulated baseline", _fmt(out["baseline_ms"])),
            ("what-if: " + "; ".join(applied), _fmt(out["whatif_ms"]))]  # fmt: skip
    _print_table(f"{Path(trace).name}: what-if", rows, ("", "step ms"))
    if split is not None:
        click.echo(f"collectives: {split.note}")
    if out["speedup"] is None:  # every task of the step scaled to 0
        click.echo("predicted speed-up: unbounded (the what-if's step takes 0 ms)")
    else:
        click.echo(f"predicted speed-up: {out['speedup']:.3f}x")
    _print_breakdown(out)


def _layer_whatif(trace: str, ooo_dp: str | None, pipeline: str | None, stages: int, microbatches: int,
                  rate: float, as_json: bool) -> None:  # fmt: skip
    """--ooo-dp / --pipeline work from a per-layer F/B/W profile; delegate to ``trainsim ooo``."""
    from trainsim.cli import ooo

    if not Path(trace).is_file():
        raise UserError(f"{trace}: no such file; --ooo-dp and --pipeline need a per-layer profile "
                        "(trainsim ooo profile MODEL --out FILE)")  # fmt: skip
    if ooo_dp is not None and pipeline is not None:
        raise UserError("whatif: choose one of --ooo-dp and --pipeline")
    ctx = click.get_current_context()
    if ooo_dp is not None:
        if ooo_dp != "search" and not ooo_dp.isdigit():
            raise UserError(f"--ooo-dp {ooo_dp!r}: expected a number of layers K or 'search'")
        k = None if ooo_dp == "search" else int(ooo_dp)
        ctx.invoke(ooo.dp_cmd, profile=trace, batch_size=32, k=k, search=k is None, rate=rate, latency_us=100.0,
                   as_json=as_json)  # fmt: skip
        return
    ctx.invoke(ooo.pipeline_cmd, profile=trace, schedule=pipeline, stages_per_rank=stages, ranks=2,
               microbatches=microbatches, batch_size=32, split="", rate=rate, latency_us=100.0,
               as_json=as_json)  # fmt: skip


@click.command("bench-sim")
@click.option("--tasks", type=click.IntRange(1, 50_000_000), default=1_000_000, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--repeats", "repeat", type=click.IntRange(1, 20), default=3, show_default=True, help="Best of N replays.")
@JSON_OPT
def bench_sim(tasks: int, seed: int, repeat: int, as_json: bool) -> None:
    """Build a synthetic graph of N tasks and time the simulator on it."""
    from trainsim.simulate.engine import prepare, simulate
    from trainsim.simulate.synthetic import synthetic_graph

    simulate(synthetic_graph(1000, seed))  # JIT warm-up (compiled code is cached on disk)
    t0 = time.perf_counter()
    g = synthetic_graph(tasks, seed)
    build_s = time.perf_counter() - t0
    best = float("inf")
    res = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = simulate(g, prepare(g))
        best = min(best, time.perf_counter() - t0)
    assert res is not None
    out = {
        "tasks": g.n_tasks, "edges": g.n_edges, "build_s": build_s, "simulate_s": best,
        "tasks_per_s": g.n_tasks / best, "makespan_ms": res.makespan_us / 1e3,
    }  # fmt: skip
    if as_json:
        _emit_json(out)
    else:
        click.echo(
            f"{g.n_tasks} tasks, {g.n_edges} edges: built in {build_s:.3f} s, simulated in {best:.3f} s "
            f"({out['tasks_per_s'] / 1e6:.2f} M tasks/s)"
        )


@click.command()
@click.option("--model", default="cnn", show_default=True, help="mlp, cnn, transformer, or package.module:function.")
@click.option("--steps", type=int, default=6, show_default=True)
@click.option("--warmup", type=int, default=2, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True, help="torch intra-op threads.")
@click.option("--optimizer", default="sgd", show_default=True,
              help="sgd or adam, optionally -loop, -foreach or -fused (e.g. adam-fused).")  # fmt: skip
@click.option("--out", default="out/trace.json.gz", show_default=True, help="Trace path (.json or .json.gz).")
@click.option("--force", is_flag=True, help="Overwrite an existing trace.")
def profile(model: str, steps: int, warmup: int, batch_size: int, threads: int, optimizer: str, out: str,
            force: bool) -> None:  # fmt: skip
    """Profile a few training steps of a model on this machine and write a trace + sidecar."""
    from rich.progress import Progress

    from trainsim.capture.profile import ProfileConfig, sidecar_path
    from trainsim.capture.profile import profile as run_profile

    cfg = ProfileConfig(model=model, steps=steps, warmup=warmup, batch_size=batch_size, threads=threads,
                        optimizer=optimizer, out=out)  # fmt: skip
    check_new_file(out, force, "--out")
    with Progress(transient=True, console=_console_err()) as bar:
        task = bar.add_task(f"profiling {model}", total=warmup + steps)
        path = run_profile(cfg, progress=lambda done, total: bar.update(task, completed=done))
    click.echo(f"wrote {path} and {sidecar_path(path)}")


def _console_err() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@click.command()
@click.option("--model", default="cnn", show_default=True)
@click.option("--out-dir", default="out/demo", show_default=True)
def demo(model: str, out_dir: str) -> None:
    """The main job on a built-in default: profile a model on the CPU, replay it, show what-ifs."""
    trace = str(Path(out_dir) / f"{model}.json.gz")
    click.echo(f"1) profiling the built-in '{model}' model on this CPU -> {trace}")
    ctx = click.get_current_context()
    ctx.invoke(profile, model=model, steps=6, warmup=2, batch_size=32, threads=1, optimizer="sgd", out=trace,
               force=True)  # fmt: skip
    click.echo("\n2) replaying the trace: simulated vs measured step time")
    ctx.invoke(replay, trace=trace, as_json=False, timeline=str(Path(out_dir) / f"{model}.sim.json"), force=True)
    click.echo(f"   simulated timeline (open in https://ui.perfetto.dev): {Path(out_dir) / f'{model}.sim.json'}")
    click.echo("\n3) what if the optimizer were fused, and convolutions / matmuls twice as fast?")
    ctx.invoke(whatif, trace=trace, amp=False, fused_optimizer=True,
               scales=("kind:cpu,name:convolution|addmm|aten::mm=0.5",), ooo_dp=None, pipeline=None,
               compress=None, plan_file=None, scheme="allgather", world=2, stages=1, microbatches=4, rate=1000.0,
               as_json=False, timeline=None, force=False)  # fmt: skip
    sys.stdout.flush()
