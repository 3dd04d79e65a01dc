"""``trainsim goodput``: with GPUs failing at a known rate, how often to checkpoint and what it costs.

    $ trainsim goodput --step-s 10 --gpus 16384 --mtbf-gpu-hours 50000 --checkpoint-s 60 --restart-s 600
    $ trainsim goodput --step-s 10 --gpus 16384 --mtbf-gpu-hours 50000 --mtbf-node-hours 200000 \
        --checkpoint-s 60 --restart-s 600 --spare-nodes 4 --replace-s 300 --repair-s 14400 --json

Monte Carlo over failure traces (``trainsim.plan.goodput``; docs/goodput.md says what it assumes).
Without ``--interval-s`` it searches the checkpoint interval with the best goodput and compares it with
Young/Daly's ``sqrt(2 * checkpoint_s * MTBF_job)``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click

from trainsim.cli.plan import JSON_OPT
from trainsim.errors import UserError


def _fmt_s(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:.2f} d"
    if s >= 2 * 3600:
        return f"{s / 3600:.2f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


@click.command("goodput")
@click.option("--step-s", type=float, required=True, help="Seconds per training step without failures.")
@click.option("--gpus", type=int, required=True, help="GPUs in the job.")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--mtbf-gpu-hours", type=float, required=True, help="One GPU's mean time between failures, hours.")
@click.option("--mtbf-node-hours", type=float, default=None, help="One host's MTBF, hours (default: hosts never fail).")
@click.option("--mtbf-link-hours", type=float, default=None, help="One GPU's network link MTBF, hours (default: never).")
@click.option("--checkpoint-s", type=float, required=True, help="Seconds to write one checkpoint.")
@click.option("--restart-s", type=float, required=True, help="Seconds per failure to detect, reschedule and re-init.")
@click.option("--restore-s", type=float, default=0.0, show_default=True, help="Seconds to load the last checkpoint.")
@click.option("--spare-nodes", type=int, default=0, show_default=True, help="Hot-spare hosts to swap in.")
@click.option("--replace-s", type=float, default=0.0, show_default=True, help="Seconds to swap a spare in.")
@click.option("--repair-s", type=float, default=0.0, show_default=True,
              help="Seconds until a failed node is back; with no spare free the job waits for it.")
@click.option("--steps", type=int, default=None, help="Steps to train (default: one month of compute).")
@click.option("--interval-s", type=float, default=None, help="Compute seconds between checkpoints (default: search).")
@click.option("--samples", type=int, default=10_000, show_default=True, help="Monte Carlo failure traces.")
@click.option("--seed", type=int, default=0, show_default=True)
@JSON_OPT
def goodput_cmd(as_json: bool, samples: int, seed: int, **kw: Any) -> None:
    """Goodput under failures: the best checkpoint interval, expected time to train, spares."""
    from rich.console import Console
    from rich.progress import Progress

    from trainsim.plan.goodput import GoodputConfig, goodput

    try:
        cfg = GoodputConfig(**kw)
    except UserError as exc:  # name the flag, not the field: "--mtbf-gpu-hours 0.0; expected ..."
        msg = str(exc)
        for name in kw:
            flag = "--" + name.replace("_", "-")
            msg = re.sub(rf"\b{name}\b", flag, re.sub(rf"\b{name}=", f"{flag} ", msg))
        raise UserError(msg) from None
    if samples < 2:
        raise UserError(f"--samples {samples}; expected at least 2 (the confidence interval needs a spread)")
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("simulating failure traces", total=4)
        res = goodput(cfg, samples=samples, seed=seed, progress=lambda i, n: prog.update(task, completed=i, total=n))
    if as_json:
        click.echo(json.dumps(res.to_json(), separators=(",", ":")))
        return
    _print(res)


def _print(r: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    c = r.config
    click.echo(f"{c.gpus} GPUs ({c.nodes} nodes), job MTBF {_fmt_s(r.job_mtbf_s)}, {c.n_steps} steps of "
               f"{c.step_s:g} s = {_fmt_s(c.work_s)} of compute; {r.samples} Monte Carlo traces, seed {r.seed}")  # fmt: skip
    t = Table()
    t.add_column("", justify="left")
    t.add_column("value", justify="right")
    t.add_column("", justify="left")
    lo, hi = r.goodput_ci95
    label = "best checkpoint interval (MC)" if r.searched else "checkpoint interval (given)"
    t.add_row(label, _fmt_s(r.interval_s), f"every {r.interval_steps} steps")
    t.add_row("Young/Daly sqrt(2 C M)", _fmt_s(r.young_daly_interval_s),
              f"interval above is {100 * (r.interval_s / r.young_daly_interval_s - 1):+.1f}% from it")
    t.add_row("closed-form optimum", _fmt_s(r.exact_interval_s), "Daly 2006, constant downtime")
    t.add_row("goodput", f"{100 * r.goodput:.2f}%", f"95% CI {100 * lo:.2f}-{100 * hi:.2f}%")
    t.add_row("goodput at Young/Daly interval", f"{100 * r.young_daly_goodput:.2f}%", "")
    t.add_row("expected time to train", _fmt_s(r.time_to_train_s),
              f"95% CI {_fmt_s(r.time_to_train_ci95[0])}-{_fmt_s(r.time_to_train_ci95[1])}")
    t.add_row("single runs, 5th-95th pct", f"{_fmt_s(r.time_to_train_p05_p95[0])}-{_fmt_s(r.time_to_train_p05_p95[1])}", "")
    t.add_row("failures per run", f"{r.failures_mean:.1f}", "mean")
    if r.closed_form_time_s is not None:
        t.add_row("closed-form time to train", _fmt_s(r.closed_form_time_s), "same interval")
    Console(highlight=False, width=160).print(t)


goodput = goodput_cmd
