"""Cluster commands: ``trainsim calibrate`` and ``trainsim scaleout``.

    $ trainsim calibrate --rate 100 --latency-us 2000 --max-bytes 16MB --out net.json
    $ trainsim scaleout out/mlp.json.gz --cluster my.toml --world 8 --mode p3 --json

``calibrate`` measures gloo all-reduce times between processes (each in its own network namespace,
links shaped with tc, or on loopback) and fits the alpha-beta constants. ``scaleout`` predicts the
data-parallel step time of a single-process trace on a cluster (from a TOML/YAML file, or a
calibration file's measured link). No torch import at module level.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from trainsim.cli.options import us_to_ms
from trainsim.errors import UserError


def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise UserError(f"size {text!r}; expected a number of bytes like 4096, 64KB or 256MB")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


@click.command("calibrate")
@click.option("--world", type=int, default=2, show_default=True, help="processes")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None, help="shape links to this many Mbit/s (default: unshaped)")
@click.option("--latency-us", "delay", type=click.FloatRange(min=0), default=0.0, show_default=True, callback=us_to_ms,
              help="added one-way latency, us")
@click.option("--min-bytes", default="1KB", show_default=True, help="smallest all-reduce")
@click.option("--max-bytes", default="16MB", show_default=True, help="largest all-reduce")
@click.option("--reps", type=int, default=5, show_default=True, help="repetitions per size at least (mean kept)")
@click.option("--realtime", is_flag=True, help="run the ranks' threads in the real-time scheduling class (root): "
              "removes the wake-up delays of several ranks sharing this machine's cores; skips the CPU pass")
@click.option("--pin", is_flag=True, help="keep each rank's threads on a core of its own (rank modulo the cores), "
              "as separate machines would be: steadier sub-millisecond all-reduces where ranks share a host")
@click.option("--launches", type=int, default=1, show_default=True,
              help="measure the sizes up to 256 KiB in this many launches of new processes, keep the median")
@click.option("--launch-seconds", type=float, default=None,
              help="with --launches: seconds of all-reduces per size in each launch after the first (default 0.3)")
@click.option("--floor-launches", type=int, default=0, show_default=True,
              help="that many launches more of the sizes under 1 ms (the latency floor), each size's median over all; "
                   "with --launches, also of sizes that split the steepest steps around the knee")
@click.option("--big-launches", type=int, default=0, show_default=True,
              help="that many launches more of the sizes above 256 KiB, spread among the --launches; each size's median over all")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="write the calibration JSON here")
@click.option("--force", is_flag=True, help="overwrite an existing --out file")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def calibrate(
    world: int, rate: float | None, delay: float, min_bytes: str, max_bytes: str, reps: int, realtime: bool,
    pin: bool, launches: int, launch_seconds: float | None, floor_launches: int, big_launches: int, out: str | None, force: bool,
    as_json: bool,
) -> None:
    """Measure gloo all-reduce latency/bandwidth with torch.distributed and fit the model's constants."""
    from rich.console import Console
    from rich.table import Table

    from trainsim.testbed.calibrate import calibrate as run

    if launch_seconds is not None and not launch_seconds > 0:
        raise UserError(f"--launch-seconds {launch_seconds}; expected > 0 seconds")
    lo, hi = _parse_bytes(min_bytes), _parse_bytes(max_bytes)
    if not 0 < lo <= hi:
        raise UserError(f"--min-bytes {min_bytes} / --max-bytes {max_bytes}; expected 0 < min <= max")
    from trainsim.cli.options import check_new_file

    check_new_file(out, force, "--out")
    with Console(stderr=True).status("measuring all-reduce times ..."):
        cal = run(world=world, rate_mbit=rate, delay_ms=delay, min_bytes=lo, max_bytes=hi, reps=reps,
                  realtime=realtime, pin=pin, launches=launches, small_budget_s=launch_seconds,
                  floor_launches=floor_launches, big_launches=big_launches)
    data = cal.to_json()
    if out:
        Path(out).write_text(json.dumps(data, indent=1))
    if as_json:
        click.echo(json.dumps(data))
        return
    for note in cal.notes:
        click.echo(f"note: {note}", err=True)
    t = Table(title=f"gloo all-reduce, {world} processes ({cal.where})")
    cpu = dict(zip(cal.cpu_sizes_bytes, cal.cpu_allreduce_us, strict=True))
    lost = dict(zip(cal.cpu_sizes_bytes, cal.stolen_us, strict=False))
    for col in ("bytes", "measured us", "model us", "error", "process CPU us", "computation lost us"):
        t.add_column(col, justify="right")
    for s, m in zip(cal.sizes_bytes, cal.measured_us, strict=True):
        p = cal.predict_us(s)
        t.add_row(f"{s:,}", f"{m:,.0f}", f"{p:,.0f}", f"{100 * (p - m) / m:+.1f}%",
                  f"{cpu[s]:,.0f}" if s in cpu else "-", f"{lost[s]:,.0f}" if s in lost else "-")  # fmt: skip
    Console().print(t)
    b = cal.b_us_per_byte
    knee = cal.floor_us / b if b > 0 else 0.0
    click.echo(
        f"fit: t = {cal.a_us:.1f} us + max({cal.floor_us:.1f} us + {cal.b0_us_per_byte * 1e3:.4f} us/KB * "
        f"(size - {knee / 1e3:.1f} KB), {b * 1e3:.4f} us/KB * size); ring model: alpha "
        f"{cal.link.latency_us:.1f} us, bandwidth {cal.link.bw_gbyte_s * 8e3:.1f} Mbit/s"
    )
    ratios = [f"{x:,} B x{r:.3f}" for x, r in zip(cal.residual_sizes_bytes, cal.residual_ratio, strict=True) if r != 1]
    if ratios:
        click.echo("measured / fitted above the knee (the model keeps these): " + ", ".join(ratios))


@click.command("scaleout")
@click.argument("trace", type=click.Path())
@click.option("--cluster", "cluster_file", type=click.Path(), default=None, help="cluster TOML/YAML file")
@click.option("--calibration", type=click.Path(), default=None, help="use a `trainsim calibrate --out` file's link")
@click.option("--world", "ranks", type=int, default=None, help="data-parallel ranks (default: the whole cluster)")
@click.option("--mode", type=click.Choice(["ddp", "p3", "bytescheduler"]), default="ddp", show_default=True)
@click.option("--bucket-mb", type=float, default=25.0, show_default=True, help="DDP bucket cap, MiB")
@click.option("--slice-kb", type=click.FloatRange(min=0, min_open=True), default=256.0, show_default=True,
              help="p3: slice size, KiB")
@click.option("--partition-mb", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="bytescheduler: partition size, MB (10^6 bytes; ByteScheduler's default is 1M fp32 parameters)")
@click.option("--credit", type=click.IntRange(min=1), default=4, show_default=True,
              help="bytescheduler: partitions in flight")
@click.option(
    "--backend", type=click.Choice(["nccl", "gloo"]), default="nccl", show_default=True,
    help="process group: nccl all-reduces DDP's buckets one after another, gloo two at once",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def scaleout(
    trace: str, cluster_file: str | None, calibration: str | None, ranks: int | None, mode: str, bucket_mb: float,
    slice_kb: float, partition_mb: float, credit: int, backend: str, as_json: bool,
) -> None:
    """Predict the data-parallel step time of a single-process trace on a cluster."""
    from trainsim.capture.profile import sidecar_path
    from trainsim.cluster.calibration import Calibration
    from trainsim.cluster.collectives import cluster_us
    from trainsim.cluster.spec import cluster, load_cluster
    from trainsim.graph.build import load_trace
    from trainsim.simulate.engine import simulate
    from trainsim.transform.dataparallel import (
        BACKEND_LANES,
        DPConfig,
        data_parallel,
        dp_step_ms,
        read_params,
    )

    spec = load_cluster(cluster_file) if cluster_file else None
    if calibration:
        p = Path(calibration)
        if not p.is_file():
            raise UserError(f"{p}: no such calibration file")
        try:
            cal = Calibration.from_json(json.loads(p.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{p}: not a `trainsim calibrate --out` file ({exc})") from None
        spec = cluster(nodes=cal.world, devices_per_node=1, inter=cal.link, source=str(p))
    if spec is None:
        raise UserError("scaleout: give --cluster FILE or --calibration FILE")
    n = spec.world_size if ranks is None else ranks
    if n < 1:
        raise UserError(f"--world {n}; expected >= 1")
    spec.check_ranks(n)
    if not Path(trace).exists():
        raise UserError(f"{trace}: no such trace")
    params, layers = read_params(sidecar_path(trace))
    g = load_trace(trace)
    cfg = DPConfig(world=n, mode=mode, bucket_cap_mb=bucket_mb, lanes=BACKEND_LANES[backend],
                   slice_bytes=max(1, round(slice_kb * 1024)), partition_bytes=max(1, round(partition_mb * 1e6)),
                   credit=credit)  # fmt: skip
    dp = data_parallel(g, params, layers, cfg, comm_us=lambda b: cluster_us("allreduce", b, spec, n))
    single = dp_step_ms(simulate(g).step_ms, "ddp")  # the same statistic (median step) as the prediction
    step = dp_step_ms(simulate(dp).step_ms, mode)
    out = {"trace": trace, "cluster": spec.describe(), "ranks": n, "mode": mode, "backend": backend,
           "single_ms": round(single, 3), "predicted_ms": round(step, 3),
           "gradient_bytes": sum(q.size_bytes for q in params)}  # fmt: skip
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{trace}: one process {single:.1f} ms/step; {n} ranks on {spec.describe()} ({mode}): {step:.1f} ms/step")
