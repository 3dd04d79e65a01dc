"""``trainsim ooo``: out-of-order backprop and pipeline-schedule what-ifs from a per-layer profile.

    $ trainsim ooo profile transformer --blocks 4 --batch-sizes 32,8,4 --out tf.layers.json
    $ trainsim ooo dp tf.layers.json --batch-size 32 --rate 1000 --search
    $ trainsim ooo pipeline tf.layers.json --schedule ZBVZeroBubble --stages-per-rank 2 --microbatches 4
    $ trainsim ooo order --schedule Interleaved1F1B --stages-per-rank 2 --microbatches 4
    $ trainsim ooo multistream tf.layers.json --batch-size 32

Real runs and their comparison with these predictions: ``trainsim validate ooo-dp`` and
``trainsim validate pipeline``. No torch import at module level (the CLI stays fast).
"""

from __future__ import annotations

import json
from typing import Any

import click

from trainsim.errors import UserError


def _emit(obj: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(obj))
    else:
        for ln in lines:
            click.echo(ln)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as exc:
        raise UserError(f"{what} {text!r}: expected comma-separated integers") from exc


def _link(rate: float, latency_us: float) -> Any:
    """The link of ``--rate`` (Mbit/s) and ``--latency-us``."""
    from trainsim.cluster.catalog import Link

    return Link(name="cli", bw_gbyte_s=rate / 8e3, latency_us=latency_us)


@click.group("ooo")
def ooo() -> None:
    """Out-of-order backprop (data parallel, multi-stream) and pipeline schedules: profile and what-ifs."""


@ooo.command("profile")
@click.argument("model")
@click.option(
    "--batch-sizes", default="32", show_default=True, help="comma-separated (pipelines: the microbatch sizes)"
)
@click.option("--blocks", type=int, default=0, help="transformer blocks / mlp depth (0: zoo default)")
@click.option("--reps", type=int, default=20, show_default=True)
@click.option("--streams", is_flag=True,
              help="profile the two-stream runner instead (host and device time per phase, co-run factor): "
                   "the input of `ooo multistream` on a GPU")  # fmt: skip
@click.option("--device", type=click.Choice(["cuda", "cpu"]), help="with --streams; default cuda if present")
@click.option("--out", type=click.Path(dir_okay=False), required=True)
@click.option("--force", is_flag=True, help="overwrite an existing --out file")
def profile_cmd(
    model: str, batch_sizes: str, blocks: int, reps: int, streams: bool, device: str | None, out: str, force: bool
) -> None:
    """Per-layer forward / backward-input / backward-weight / update times of a zoo model (one CPU thread)."""
    from trainsim.capture.layerprofile import LayerProfile, profile_layers
    from trainsim.models.zoo import MODELS

    if model not in MODELS:
        raise UserError(f"unknown model {model!r}; expected one of {', '.join(sorted(MODELS))}")
    zoo: dict[str, Any] | None = (
        ({"blocks": blocks} if model == "transformer" else {"depth": blocks}) if blocks else None
    )
    sizes = _ints(batch_sizes, "--batch-sizes")
    if device and not streams:
        raise UserError("ooo profile: --device goes with --streams (the per-layer profile runs on the CPU)")
    from trainsim.cli.options import check_new_file

    check_new_file(out, force, "--out")
    if not streams:
        click.echo(str(profile_layers(model, batch_sizes=sizes, reps=reps, zoo=zoo).save(out)))
        return
    import torch

    from trainsim.models.zoo import ZooSpec
    from trainsim.run.multistream import check_splittable, profile_streams

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        raise UserError("ooo profile: --device cuda, but torch sees no CUDA device here")
    check_splittable(model, ZooSpec(batch_size=sizes[0], **(zoo or {})))
    profs = [profile_streams(model, bs, device=dev, reps=reps, zoo=zoo) for bs in sizes]
    first = profs[0]
    merged = LayerProfile(first.model, first.threads, first.reps, first.machine,
                          {bs: p.by_batch[bs] for bs, p in zip(sizes, profs, strict=True)})  # fmt: skip
    click.echo(str(merged.save(out)))


@ooo.command("dp")
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--k", "k", type=int, help="layers reordered (reverse first-k)")
@click.option("--search", is_flag=True, help="predict every k and pick the best")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1000.0, show_default=True, help="link rate, Mbit/s")
@click.option("--latency-us", type=click.FloatRange(min=0), default=100.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def dp_cmd(
    profile: str, batch_size: int, k: int | None, search: bool, rate: float, latency_us: float, as_json: bool
) -> None:
    """Predicted step time of 2-rank data parallelism in DDP order (k=0) and with reverse first-k."""
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.cluster.collectives import AlphaBeta
    from trainsim.transform.ooo import predict_dp, search_k

    prof = LayerProfile.load(profile)
    net = AlphaBeta(_link(rate, latency_us))
    best, pred = search_k(prof, batch_size, net) if (search or k is None) else (k, {})
    if k is not None:
        pred = {0: predict_dp(prof, batch_size, 0, net), k: predict_dp(prof, batch_size, k, net)}
        best = k
    obj = {
        "k": best,
        "predicted_ms": {str(kk): round(v, 3) for kk, v in sorted(pred.items())},
        "speedup_over_ddp_order": round(pred[0] / pred[best], 3),
    }
    _emit(
        obj,
        as_json,
        [f"k={kk}: {v:.2f} ms" for kk, v in sorted(pred.items())]
        + [f"chosen k={best}: {obj['speedup_over_ddp_order']}x over the DDP order"],
    )


@ooo.command("pipeline")
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
@click.option("--schedule", required=True)
@click.option("--stages-per-rank", type=int, default=1, show_default=True)
@click.option("--world", "ranks", type=int, default=2, show_default=True, help="Ranks (pipeline stages' processes).")
@click.option("--microbatches", type=int, default=4, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option(
    "--split", default="", help="layers per stage, e.g. 2,2,2,3 (default: planned from the profile)"
)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1000.0, show_default=True, help="link rate, Mbit/s")
@click.option("--latency-us", type=click.FloatRange(min=0), default=100.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def pipeline_cmd(
    profile: str,
    schedule: str,
    stages_per_rank: int,
    ranks: int,
    microbatches: int,
    batch_size: int,
    split: str,
    rate: float,
    latency_us: float,
    as_json: bool,
) -> None:
    """Predicted step time of a torch.distributed.pipelining schedule, from a single-process profile."""
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.transform.pipeline import P2PLink, PipeSpec, predict_pipeline

    prof = LayerProfile.load(profile)
    spec = PipeSpec(
        schedule=schedule, n_ranks=ranks, stages_per_rank=stages_per_rank, microbatches=microbatches
    )
    p = predict_pipeline(
        prof,
        spec,
        batch_size=batch_size,
        link=P2PLink(wire=_link(rate, latency_us)),
        split=_ints(split, "--split") or None,
    )
    obj = {
        "schedule": schedule,
        "stages_per_rank": stages_per_rank,
        "microbatches": microbatches,
        "split": [len(s) for s in p.split],
        "predicted_ms": round(p.step_ms, 3),
    }
    _emit(
        obj,
        as_json,
        [
            f"{schedule} ({stages_per_rank} stage(s)/rank, M={microbatches}, split "
            f"{obj['split']}): {p.step_ms:.2f} ms"
        ],
    )


@ooo.command("order")
@click.option("--schedule", required=True)
@click.option("--stages-per-rank", type=int, default=1, show_default=True)
@click.option("--world", "ranks", type=int, default=2, show_default=True, help="Ranks (pipeline stages' processes).")
@click.option("--microbatches", type=int, default=4, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def order_cmd(schedule: str, stages_per_rank: int, ranks: int, microbatches: int, as_json: bool) -> None:
    """The per-rank action list (with communication) that both the simulator and the real run execute."""
    from trainsim.transform.pipeline import PipeSpec, format_order, lowered_order

    spec = PipeSpec(
        schedule=schedule, n_ranks=ranks, stages_per_rank=stages_per_rank, microbatches=microbatches
    )
    order = lowered_order(spec)
    _emit(
        {"order": {str(r): [str(a) for a in acts] for r, acts in order.items()}},
        as_json,
        format_order(order).splitlines(),
    )


@ooo.command("multistream")
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def multistream_cmd(profile: str, batch_size: int, as_json: bool) -> None:
    """Single device: weight gradients on a second stream with a searched schedule map.

    From a CPU profile (``ooo profile``) the two streams overlap freely: an upper bound. From a
    ``ooo profile --streams`` profile taken on a GPU, the host's issue time and the measured co-run
    factor of the two streams are in the model."""
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.transform.ooo import predict_multistream, search_schedule_map

    prof = LayerProfile.load(profile)
    base = predict_multistream(prof, batch_size, None)
    smap, best = search_schedule_map(prof, batch_size)
    obj = {
        "single_stream_ms": round(base, 3),
        "multistream_ms": round(best, 3),
        "schedule_map": [list(e) for e in smap],
        "speedup": round(base / best, 3),
    }
    _emit(
        obj,
        as_json,
        [
            f"single stream {base:.2f} ms, two streams {best:.2f} ms ({obj['speedup']}x)",
            f"schedule map: {smap}",
        ],
    )
