"""Compression commands: ``compress-bench`` and ``secopa``.

$ trainsim compress-bench --json
$ trainsim compress-bench --sizes 1M --algorithms onebit,topk
$ trainsim secopa --algorithm tbq --model mlp --topology ps --nnodes 4 --bandwidth-mbps 1000 --out plan.yaml
$ trainsim secopa --algorithm dgc --option ratio=0.01 --input grads.txt --nnodes 2 --measure-comm
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from trainsim.errors import UserError

JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    t = text.strip().upper()
    try:
        n = int(float(t[:-1]) * _UNITS[t[-1]]) if t and t[-1] in _UNITS else int(t)
    except ValueError:
        raise UserError(f"--sizes: {text!r} is not a size; expected e.g. 1M, 16M, 65536") from None
    if n < 1:
        raise UserError(f"--sizes: {text!r} is {n} elements; expected at least 1")
    return n


def _options(pairs: tuple[str, ...]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--option {pair!r}: expected key=value, e.g. ratio=0.01")
        out[key] = yaml.safe_load(value)
    return out


@click.command("compress-bench")
@click.option("--sizes", default="1M,16M,64M", show_default=True, help="Gradient sizes in fp32 elements.")
@click.option("--algorithms", default="", help="Comma-separated algorithms (default: all registered).")
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Timed repeats per case (default 15/5/3 by size).")
@click.option("--no-baselines", is_flag=True, help="Skip PyTorch's fp16 and PowerSGD hook steps.")
@JSON_OPT
def compress_bench(
    sizes: str, algorithms: str, repeats: int | None, no_baselines: bool, as_json: bool
) -> None:
    """Encode+decode throughput (GB/s of fp32 input) and compression ratio of every algorithm."""
    import platform

    from rich.progress import Progress

    from trainsim.compress import make_codec
    from trainsim.compress.bench import bench_all

    size_list = [_size(s) for s in sizes.split(",") if s.strip()]
    algos = [a.strip() for a in algorithms.split(",") if a.strip()] or None
    for a in algos or []:
        make_codec(a)  # UserError on an unknown name, before any timing
    with Progress(transient=True, disable=as_json) as prog:
        task = prog.add_task("benchmarking", total=None)
        rows = bench_all(sizes=size_list, repeats=repeats, algorithms=algos, baselines=not no_baselines,
                         progress=lambda what: prog.update(task, description=what))  # fmt: skip
    if as_json:
        click.echo(json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="encode + decode throughput (GB/s of fp32 input)")
    for col in ("algorithm", "elements", "EF", "encode ms", "decode ms", "GB/s", "wire bytes", "ratio"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in rows:
        table.add_row(r["algorithm"], f"{r['numel']:,}", "y" if r["error_feedback"] else "n",
                      f"{r['encode_ms']:.2f}", f"{r['decode_ms']:.2f}", f"{r['gbps']:.2f}",
                      f"{r['wire_bytes']:,}", f"1/{1 / r['ratio']:.1f}")  # fmt: skip
    Console().print(table)


def _gradients(model: str | None, sidecar: str | None, input_file: str | None) -> list[tuple[str, int]]:
    given = [x for x in (model, sidecar, input_file) if x]
    if len(given) != 1:
        raise UserError("secopa: give exactly one of --model, --sidecar, --input")
    if model:
        from trainsim.models.zoo import build

        net, _ = build(model)
        return [(name, p.numel()) for name, p in net.named_parameters()]
    if sidecar:
        try:
            data = json.loads(Path(sidecar).read_text())
            return [(str(p["name"]), int(p["numel"])) for p in data["params"]]
        except OSError as exc:
            raise UserError(f"{sidecar}: cannot read ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(
                f"{sidecar}: expected a profiling sidecar with params[].name/numel ({exc})"
            ) from None
    assert input_file is not None
    out = []
    try:
        lines = Path(input_file).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"{input_file}: cannot read ({exc.strerror})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, numel = line.rpartition(",")
        if not name or not numel.strip().isdigit():
            raise UserError(f"{input_file}:{i}: expected 'gradient_name,num_float32_elements', got {line!r}")
        out.append((name.strip(), int(numel)))
    return out


def _spawn_comm(rank: int, port: int, world: int, out: str) -> None:
    import datetime

    import torch.distributed as dist

    from trainsim.compress.secopa import calibrate_comm

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    fits = calibrate_comm()
    if rank == 0:
        Path(out).write_text(json.dumps({k: [v.a_ms, v.b_ms, v.overhead_ms] for k, v in fits.items()}))
    dist.destroy_process_group()


def _measure_comm(world: int) -> dict[str, Any]:
    import socket
    import tempfile

    import torch.multiprocessing as mp

    from trainsim.compress.secopa import Linear

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "comm.json"))
        mp.start_processes(_spawn_comm, args=(port, world, out), nprocs=world, start_method="spawn")
        data = json.loads(Path(out).read_text())
    return {k: Linear(*v) for k, v in data.items()}


@click.command("secopa")
@click.option("--algorithm", required=True, help="Compression algorithm (see compress-bench).")
@click.option("--option", "option_pairs", multiple=True, help="Algorithm option key=value (repeatable).")
@click.option("--topology", type=click.Choice(["ps", "ring"]), default="ps", show_default=True)
@click.option("--nnodes", type=int, required=True, help="Number of data-parallel ranks (N).")
@click.option("--model", default=None, help="A zoo model whose parameters are the gradients.")
@click.option("--sidecar", default=None, help="A profiling sidecar (<trace>.trainsim.json).")
@click.option("--input", "input_file", default=None, help="HiPress input: lines 'name,numel'.")
@click.option("--bandwidth-mbps", type=float, default=None, help="Model the links: Mbit/s per port ...")
@click.option("--latency-ms", type=float, default=0.1, show_default=True, help="... and per-message latency.")
@click.option("--measure-comm", is_flag=True, help="Measure gather/bcast/send with N local gloo processes.")
@click.option("--quick", is_flag=True, help="Fewer calibration sizes (seconds instead of tens).")
@click.option("--out", default="secopa_plan.yaml", show_default=True, help="Where to write the plan.")
@click.option("--force", is_flag=True, help="Overwrite an existing plan (edits in it are lost).")
@JSON_OPT
def secopa(
    algorithm: str, option_pairs: tuple[str, ...], topology: str, nnodes: int, model: str | None,
    sidecar: str | None, input_file: str | None, bandwidth_mbps: float | None, latency_ms: float,
    measure_comm: bool, quick: bool, out: str, force: bool, as_json: bool,
) -> None:  # fmt: skip
    """Calibrate the SeCoPa cost model on this machine and write a compression plan."""
    from trainsim.compress import make_codec
    from trainsim.compress.secopa import Constants, calibrate_codec, link_model, plan_gradients

    if nnodes < 2:
        raise UserError(f"--nnodes {nnodes}: a plan needs at least 2 ranks")
    if (bandwidth_mbps is None) == (not measure_comm):
        raise UserError("secopa: give exactly one of --bandwidth-mbps (a link model) or --measure-comm")
    options = _options(option_pairs)
    make_codec(algorithm, **options)  # bad names/options fail before calibrating
    grads = _gradients(model, sidecar, input_file)
    from trainsim.cli.options import check_new_file

    check_new_file(out, force, "--out")
    sizes = [1 << 10, 1 << 14, 1 << 18] if quick else [1 << 10, 1 << 13, 1 << 16, 1 << 18, 1 << 20, 1 << 22]
    from rich.console import Console

    err = Console(stderr=True)
    with err.status(f"calibrating {algorithm} encode/decode"):
        cal = calibrate_codec(algorithm, sizes=sizes, repeats=3 if quick else 5, **options)
    if measure_comm:
        with err.status(f"measuring gather/bcast/send with {nnodes} local gloo processes"):
            comm = _measure_comm(nnodes)
    else:
        assert bandwidth_mbps is not None
        comm = link_model(bandwidth_mbps, latency_ms, nnodes)
    consts = Constants(enc=cal["enc"], dec=cal["dec"], aggr=cal["aggr"], **comm)
    plan = plan_gradients(grads, algorithm, cal["ratio"], consts, topology=topology, world_size=nnodes,
                          options=options)  # fmt: skip
    plan.save(out)
    n_comp = sum(g.compress for g in plan.gradients.values())
    summary = {
        "plan": out,
        "algorithm": algorithm,
        "topology": topology,
        "world_size": nnodes,
        "ratio": cal["ratio"],
        "gradients": len(plan.gradients),
        "compressed": n_comp,
        "predicted_orig_ms": sum(g.orig_ms for g in plan.gradients.values()),
        "predicted_plan_ms": sum(
            min(g.orig_ms, g.comp_ms) if g.compress else g.orig_ms for g in plan.gradients.values()
        ),  # fmt: skip
        "constants": consts.to_dict(),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"wrote {out}: {n_comp} of {len(plan.gradients)} gradients compressed with {algorithm} "
                   f"({topology}, N={nnodes}); predicted sync {summary['predicted_plan_ms']:.2f} ms "
                   f"vs {summary['predicted_orig_ms']:.2f} ms uncompressed")  # fmt: skip
