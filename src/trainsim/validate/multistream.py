"""``trainsim validate multistream``: weight gradients on a second stream, predicted and measured.

    $ trainsim validate multistream --quick --json          # a CUDA device if there is one, else the CPU
    $ trainsim validate multistream --model cnn --batch 512 --device cuda

One process, one device, no network. Per case:

1. ``trainsim.run.multistream.profile_streams`` times every phase of the two-stream runner, host and
   device apart, on one stream;
2. the simulator (``trainsim.transform.ooo.multistream_graph``) predicts one step of plain backprop
   on one stream, of the split order with each W right after its own B on the second stream
   (``BWD i``), and of the map that ``search_schedule_map`` picks;
3. the same three run for real (``TwoStreamTrainer``), with PyTorch's own loop beside them for
   reference, each ``rounds`` times in turn; the medians are compared with the predictions.

On a CPU there is no second stream (the runner issues the same order on the one thread), so the
split order cannot overlap anything there: the CPU run checks the host model only.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from trainsim.errors import UserError
from trainsim.validate import progress_log


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamCase:
    model: str
    batch: int
    zoo: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        width = f" w{self.zoo['width']}" if "width" in self.zoo else ""
        return f"{self.model}{width} b{self.batch}"


FULL = (
    StreamCase(model="mlp", batch=256, zoo={"width": 1024}),
    StreamCase(model="mlp", batch=64, zoo={"width": 4096}),
    StreamCase(model="mlp", batch=1024, zoo={"width": 4096}),
    StreamCase(model="cnn", batch=64),
    StreamCase(model="cnn", batch=512),
    StreamCase(model="cnn", batch=2048),
)
QUICK = (StreamCase(model="mlp", batch=32, zoo={"width": 256}),)
MODES = ("one stream", "two streams, BWD i", "two streams, searched")


def check_case(case: StreamCase) -> None:
    """Refuse, before any timing, a model the two-stream runner cannot split."""
    from trainsim.models.zoo import ZooSpec
    from trainsim.run.multistream import check_splittable

    check_splittable(case.model, ZooSpec(batch_size=case.batch, **case.zoo))


def _sums(prof: Any, batch: int) -> dict[str, tuple[float, float]]:
    """Per mode: one step's host and device time (ms) from the profile."""
    from trainsim.run.multistream import PHASE_FIELDS

    rows, entry = prof.table(batch), prof.by_batch[batch]
    out = {}
    for mode, fields in PHASE_FIELDS.items():
        keys = [k for k, _ in fields]
        other = "host_other_us" if mode == "fused" else "host_other_split_us"
        host = sum(r["host_" + k] for r in rows for k in keys) + entry["host_loss_us"] + entry[other]
        dev = sum(r[k] for r in rows for k in keys) + entry["loss_us"]
        out[mode] = (round(host / 1e3, 3), round(dev / 1e3, 3))
    return out


def run_multistream_validation(
    cases: tuple[StreamCase, ...],
    *,
    device: str,
    rounds: int = 3,
    reps: int = 15,
    steps: int = 50,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Profile, predict and measure every case; the ``validate`` JSON shape plus per-case details."""
    from trainsim.run.multistream import measure_step_ms, profile_streams
    from trainsim.transform.ooo import predict_multistream, search_schedule_map

    for c in cases:
        check_case(c)
    runs: list[dict[str, Any]] = []
    cases_out: list[dict[str, Any]] = []
    for c in cases:
        prof = profile_streams(c.model, c.batch, device=device, zoo=c.zoo, reps=reps, progress=log)
        n = len(prof.table(c.batch))
        all_bwd = [("BWD", i) for i in range(n)]
        smap, best = search_schedule_map(prof, c.batch)
        maps = dict(zip(MODES, (None, all_bwd, smap), strict=True))
        pred = dict(zip(MODES, (predict_multistream(prof, c.batch, None),
                                predict_multistream(prof, c.batch, all_bwd), best), strict=True))  # fmt: skip
        meas: dict[str, list[float]] = {k: [] for k in (*MODES, "torch loop")}
        for r in range(rounds):
            for mode, m in maps.items():
                meas[mode].append(measure_step_ms(c.model, c.batch, m, zoo=c.zoo, device=device, steps=steps))
            meas["torch loop"].append(
                measure_step_ms(c.model, c.batch, None, zoo=c.zoo, device=device, steps=steps, native=True)
            )
            log(f"{c.label}: round {r + 1}/{rounds} measured")
        med = {k: statistics.median(v) for k, v in meas.items()}
        for mode in MODES:
            m = maps[mode]
            runs.append({
                "config": {"model": c.model, "zoo": c.zoo, "batch": c.batch, "mode": mode,
                           "map": [list(e) for e in m] if m is not None else None},
                "predicted_ms": round(pred[mode], 3),
                "measured_ms": round(med[mode], 3),
                "error_pct": round(100 * (pred[mode] - med[mode]) / med[mode], 2),
            })  # fmt: skip
        sums = _sums(prof, c.batch)
        cases_out.append({
            "model": c.model, "zoo": c.zoo, "batch": c.batch,
            "host_ms": sums["fused"][0], "device_ms": sums["fused"][1],
            "host_split_ms": sums["split"][0], "device_split_ms": sums["split"][1],
            "torch_loop_ms": round(med["torch loop"], 3),
            "stream_corun_factor": prof.by_batch[c.batch].get("stream_corun_factor", 1.0),
            "predicted_speedup": round(pred[MODES[0]] / pred[MODES[2]], 3),
            "measured_speedup": round(med[MODES[0]] / med[MODES[2]], 3),
            "profile": prof.to_json(),
        })  # fmt: skip
    errs = [abs(r["error_pct"]) for r in runs]
    return {
        "device": device,
        "runs": runs,
        "cases": cases_out,
        "mean_abs_error_pct": round(statistics.mean(errs), 2),
        "max_abs_error_pct": round(max(errs), 2),
    }


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@click.command("multistream")
@click.option("--quick", is_flag=True, help="one small configuration, one round (under a minute)")
@click.option("--model", type=click.Choice(["mlp", "cnn"]), help="zoo model for a custom case")
@click.option("--batch", type=int, default=256, show_default=True, help="batch size (custom case)")
@click.option("--width", type=int, help="MLP hidden width (custom case)")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), help="default: cuda if there is one, else cpu")
@click.option("--rounds", type=int, default=3, show_default=True, help="measurements per mode (medians)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def multistream_command(
    quick: bool, model: str | None, batch: int, width: int | None, device: str | None, rounds: int, as_json: bool
) -> None:
    """Predict and measure weight gradients on a second stream (one device) against one stream."""
    import torch
    from rich.console import Console
    from rich.table import Table

    if batch < 1:
        raise UserError(f"validate multistream: --batch {batch}; expected >= 1")
    if rounds < 1:
        raise UserError(f"validate multistream: --rounds {rounds}; expected >= 1")
    if width is not None and (width < 1 or model not in (None, "mlp")):
        raise UserError(f"validate multistream: --width {width}; expected a positive width, with --model mlp")
    dev = device or _default_device()
    if dev == "cuda" and not torch.cuda.is_available():
        raise UserError("validate multistream: --device cuda, but torch sees no CUDA device here")
    if model:
        cases: tuple[StreamCase, ...] = (
            StreamCase(model=model, batch=batch, zoo={"width": width} if width else {}),
        )
    else:
        cases = QUICK if quick else FULL
    err = Console(stderr=True)
    if dev == "cpu":
        err.print("[yellow]note:[/] no CUDA device: on the CPU the runner issues the split order on one "
                  "thread, so nothing overlaps; this checks the host model only")  # fmt: skip
    out = run_multistream_validation(
        cases,
        device=dev,
        rounds=1 if quick else rounds,
        reps=5 if quick else 15,
        steps=20 if quick else 50,
        log=progress_log(err),
    )
    if as_json:
        slim = dict(out, cases=[{k: v for k, v in c.items() if k != "profile"} for c in out["cases"]])
        click.echo(json.dumps(slim))
        return
    table = Table(title=f"validate multistream ({dev}): predicted vs measured step time")
    for col in ("config", "mode", "predicted ms", "measured ms", "error"):
        table.add_column(col)
    for r in out["runs"]:
        c = r["config"]
        label = StreamCase(model=c["model"], batch=c["batch"], zoo=c["zoo"]).label
        table.add_row(label, c["mode"], f"{r['predicted_ms']:.2f}", f"{r['measured_ms']:.2f}",
                      f"{r['error_pct']:+.1f}%")  # fmt: skip
    Console().print(table)
    for c in out["cases"]:
        label = StreamCase(model=c["model"], batch=c["batch"], zoo=c["zoo"]).label
        click.echo(f"{label}: two streams (searched map) over one stream: predicted {c['predicted_speedup']}x, "
                   f"measured {c['measured_speedup']}x; torch's own loop {c['torch_loop_ms']} ms")  # fmt: skip
    click.echo(f"mean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}%")
    sys.stdout.flush()
