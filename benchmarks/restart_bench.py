"""Kill a rank of a real gloo DDP job, restart it from its checkpoint, and compare the lost time with
``plan.goodput``'s model of one failure, predicted beforehand from separate measurements.

    realrun .venv/bin/python benchmarks/restart_bench.py --repeats 6    # ~6 min on 2 shared cores
    .venv/bin/python benchmarks/restart_bench.py --repeats 2 --steps 80 --kill-step 60

Writes docs/benchmarks/restart.json and its record docs/benchmarks/goodput.restart.json.

Protocol:

1. Once: time a checkpoint save and a load + restore of the job's state in this process (median of
   5 each), and how long a SIGKILLed process holding the same state (torch, the model, DDP in a world
   of one) takes to be gone (median of 3): the kill -> detection and the survivor's own exit.
2. Per repeat: an unfailed run of the job (same config, no kill) gives the step time (mean over its
   steady steps, checkpoint steps left out) and the start-up cost (launch -> the start of step
   ``WARM``, less ``WARM`` steady steps: processes, ``import torch``, process group, model, DDP, the
   cold first steps), the median of it and ``--startups - 1`` short clean starts (the start-up is
   most of the lost time and varies by +-20 % with the other load on a shared host). These go into a
   ``GoodputConfig``; ``elastic.predict_lost_s`` is goodput's one
   failure: ``(kill_step - checkpoint step) * step_s + restart_s + restore_s``, with ``restart_s`` =
   start-up + detection + the survivor's exit (twice the kill time, plus the supervisor's poll period).
   The prediction is written to the JSON file before the failing run starts.
3. The failing run: rank ``--kill-rank`` SIGKILLs itself at the start of ``--kill-step``; the supervisor
   restarts the job from the last checkpoint. Measured lost time: kill -> the restarted job starts
   ``--kill-step`` again (``elastic.lost_time``), and its parts. Also: the failing run's wall time less
   the unfailed run's, and whether both end with the same weights.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trainsim.plan.goodput import GoodputConfig
from trainsim.run.elastic import (
    ElasticConfig,
    ElasticResult,
    checkpoint_state,
    load_checkpoint,
    lost_time,
    predict_lost_s,
    restart_checkpoint_step,
    restore_state,
    save_checkpoint,
    step_times_s,
    supervise,
)
from trainsim.transform.opcost import cpu_model

ROOT = Path(__file__).resolve().parents[1]
WARM = 5
"""steps counted into the start-up cost (the first steps of a fresh process are slower)"""

_HOLDER = """
import sys, torch, torch.distributed as dist
from trainsim.models import zoo
from trainsim.capture.profile import make_optimizer
cfg = {cfg}
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
model, batch = zoo.build_with_batches(cfg["model"], seed=0, spec=zoo.ZooSpec(batch_size=cfg["batch_size"], width=cfg["width"], depth=cfg["depth"]))
net = torch.nn.parallel.DistributedDataParallel(model)
opt = make_optimizer(cfg["optimizer"], net.parameters(), 0.01)
x, y = batch(0)
torch.nn.CrossEntropyLoss()(net(x), y).backward(); opt.step()
print("ready", flush=True)
sys.stdin.read()
"""


def kill_time_s(cfg: ElasticConfig) -> float:
    """Seconds from SIGKILL to reaped, for a process holding the job's state (one rank's worth)."""
    from trainsim.run.ranks import free_port

    code = _HOLDER.format(cfg=repr(asdict(cfg)), port=free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout is not None
        if p.stdout.readline().strip() != b"ready":
            raise RuntimeError("the state holder did not start")
        t0 = time.monotonic()
        p.send_signal(signal.SIGKILL)
        p.wait()
        return time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def save_load_s(cfg: ElasticConfig, n: int = 5) -> tuple[float, float]:
    """Median seconds to save the job's checkpoint and to load and restore it, in this process."""
    import torch

    from trainsim.capture.profile import make_optimizer
    from trainsim.models import zoo

    torch.set_num_threads(1)
    spec = zoo.ZooSpec(batch_size=cfg.batch_size, width=cfg.width, depth=cfg.depth)
    model, batch = zoo.build_with_batches(cfg.model, seed=cfg.seed, spec=spec)
    opt = make_optimizer(cfg.optimizer, model.parameters(), 0.01)
    x, y = batch(0)
    torch.nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()
    saves, loads = [], []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(n):
            t0 = time.monotonic()
            path = save_checkpoint(d, checkpoint_state(model, opt, 1))
            saves.append(time.monotonic() - t0)
            t0 = time.monotonic()
            restore_state(model, opt, load_checkpoint(path))
            loads.append(time.monotonic() - t0)
    return statistics.median(saves), statistics.median(loads)


def phases(a: Any) -> dict[str, float]:
    """Seconds from an attempt's launch until the slowest rank reached each start-up event."""
    out = {}
    for ev in ("up", "joined", "ready", "restored"):
        ts = [e["t"] for evs in a.events for e in evs if e["ev"] == ev]
        if ts:
            out[ev] = round(max(ts) - a.launched_t, 3)
    return out


def startup_s(a: Any, step_s: float) -> float:
    """Launch -> the slowest rank starts step ``WARM``, less ``WARM`` steady steps of ``step_s``."""
    warm_t = max(e["t"] for evs in a.events for e in evs if e["ev"] == "step" and e["i"] == WARM)
    return float(warm_t - a.launched_t - WARM * step_s)


def clean_figures(res: ElasticResult) -> dict[str, Any]:
    a = res.attempts[0]
    steps = step_times_s(a, skip=WARM)
    step_s = statistics.fmean(steps)
    ready_t = max(e["t"] for evs in a.events for e in evs if e["ev"] == "ready")
    writes = [e["write_s"] for e in a.events[0] if e["ev"] == "ckpt"]
    return {"step_s": step_s, "step_s_stdev": statistics.stdev(steps), "startup_s": startup_s(a, step_s),
            "launch_to_ready_s": ready_t - a.launched_t, "checkpoint_write_in_run_s": statistics.fmean(writes) if writes else None,
            "wall_s": res.wall_s, "digest": res.digest, "phases_s": phases(a)}  # fmt: skip


def _git_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    rev = git("rev-parse", "HEAD")
    return rev + (" (with uncommitted changes)" if git("status", "--porcelain") else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--kill-step", type=int, default=95)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--startups", type=int, default=3, help="clean start-ups timed per repeat (median taken)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "restart.json"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    with tempfile.TemporaryDirectory(prefix="restart_bench_") as tmp:
        base = ElasticConfig(checkpoint_dir=tmp, steps=a.steps, checkpoint_every=a.checkpoint_every)
        doc: dict[str, Any] = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_revision": _git_revision(),
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version(), "load_avg_at_start": os.getloadavg()},  # fmt: skip
            "config": {**asdict(base), "checkpoint_dir": None, "kill_rank": a.kill_rank, "kill_step": a.kill_step},
            "restart_step": restart_checkpoint_step(a.kill_step, a.checkpoint_every),
        }
        save_s, load_s = save_load_s(base)
        kills = [kill_time_s(base) for _ in range(3)]
        kill_s = statistics.median(kills)
        doc["calibration"] = {"checkpoint_save_s": save_s, "checkpoint_load_restore_s": load_s,
                              "kill_to_reaped_s": kills, "poll_s": base.poll_s}  # fmt: skip
        print(f"calibration: save {save_s:.3f} s, load {load_s:.3f} s, kill->reaped {kill_s:.3f} s", flush=True)
        doc["repeats"] = []
        for i in range(a.repeats):
            run_dir = Path(tmp) / f"r{i}"
            clean = clean_figures(supervise(replace(base, checkpoint_dir=str(run_dir / "clean"))))
            short = replace(base, steps=WARM + 1, checkpoint_every=10**6)
            starts = [clean["startup_s"]] + [
                startup_s(supervise(replace(short, checkpoint_dir=str(run_dir / f"start{j}"))).attempts[0], clean["step_s"])
                for j in range(a.startups - 1)
            ]  # fmt: skip
            clean["startups_s"] = starts
            detect_s = 2 * kill_s + base.poll_s
            g = GoodputConfig(step_s=clean["step_s"], gpus=base.world, gpus_per_node=base.world, mtbf_gpu_hours=1e6,
                              checkpoint_s=save_s, restore_s=load_s, restart_s=statistics.median(starts) + detect_s,
                              steps=a.steps)  # fmt: skip
            pred = predict_lost_s(g, a.kill_step, a.checkpoint_every)
            rep: dict[str, Any] = {
                "clean": clean,
                "prediction": {"lost_s": pred, "goodput_config": g.to_json(), "detect_and_teardown_s": detect_s,
                               "recompute_s": (a.kill_step - doc["restart_step"]) * g.step_s,
                               "frozen_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
            }  # fmt: skip
            doc["repeats"].append(rep)
            out.write_text(json.dumps(doc, indent=1))  # the prediction is on disk before the failing run
            cfg = replace(base, checkpoint_dir=str(run_dir / "fail"), kill_rank=a.kill_rank, kill_step=a.kill_step)
            res = supervise(cfg)
            lt = lost_time(res)
            a0 = res.attempts[0]
            rep["measured"] = {**lt.to_json(), "wall_s": res.wall_s, "wall_minus_clean_s": res.wall_s - clean["wall_s"],
                               "same_final_weights": res.digest == clean["digest"], "failure": a0.describe(),
                               "survivor_exit_s": a0.survivors_exit_s, "restart_phases_s": phases(res.attempts[1]),
                               "first_start_phases_s": phases(a0)}  # fmt: skip
            rep["error_pct"] = 100 * (pred / lt.lost_s - 1)
            out.write_text(json.dumps(doc, indent=1))
            print(f"repeat {i}: predicted {pred:.2f} s, measured {lt.lost_s:.2f} s ({rep['error_pct']:+.1f} %); "
                  f"restart {lt.restart_s:.2f} s vs clean start-up {clean['launch_to_ready_s']:.2f} s", flush=True)  # fmt: skip
    errs = [r["error_pct"] for r in doc["repeats"]]
    doc["summary"] = {"error_pct_mean": statistics.fmean(errs), "error_pct_min": min(errs), "error_pct_max": max(errs),
                      "within_15_pct": sum(abs(e) <= 15 for e in errs), "repeats": len(errs),
                      "load_avg_at_end": os.getloadavg()}  # fmt: skip
    out.write_text(json.dumps(doc, indent=1))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import record_report

    record_report("goodput", "restart", _markdown(doc), raw=[out.name])  # then: python3 dev.py results
    print(_markdown(doc))


def _markdown(doc: dict[str, Any]) -> str:
    c, cal, s = doc["config"], doc["calibration"], doc["summary"]
    rows = [
        "# Kill and restart: measured lost time against goodput's model of one failure",
        "",
        f"`{doc['command']}` on {doc['machine']['cpu']} ({doc['machine']['cpus']} cores, shared), {doc['date']}, "
        f"git {doc['git_revision']}. Data: `restart.json`.",
        "",
        f"Job: {c['model']} (width {c['width']}, depth {c['depth']}, batch {c['batch_size']}), {c['world']} gloo DDP ranks "
        f"on loopback, {c['steps']} steps, a checkpoint every {c['checkpoint_every']} steps; rank {c['kill_rank']} "
        f"SIGKILLed at the start of step {c['kill_step']}, restart from step {doc['restart_step']}. Separate "
        f"measurements: checkpoint save {cal['checkpoint_save_s']:.3f} s, load + restore "
        f"{cal['checkpoint_load_restore_s']:.3f} s, SIGKILL -> reaped {statistics.median(cal['kill_to_reaped_s']):.3f} s; "
        "step time from an unfailed run just before each failing one, start-up from it and two short clean starts.",
        "",
        "| repeat | step ms (unfailed) | start-up s (unfailed: median, range) | predicted lost s | measured lost s | error | "
        "measured: detect + teardown / restart / restore / recompute s | wall - unfailed wall s | same weights |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(doc["repeats"]):
        m, cl = r.get("measured"), r["clean"]
        if m is None:
            continue
        rows.append(
            f"| {i} | {1e3 * cl['step_s']:.1f} | {statistics.median(cl['startups_s']):.2f} ({min(cl['startups_s']):.2f}-{max(cl['startups_s']):.2f}) | {r['prediction']['lost_s']:.2f} | {m['lost_s']:.2f} | "
            f"{r['error_pct']:+.1f} % | {m['detect_s'] + m['teardown_s']:.2f} / {m['restart_s']:.2f} / {m['restore_s']:.3f} / "
            f"{m['recompute_s']:.2f} | {m['wall_minus_clean_s']:.2f} | {'yes' if m['same_final_weights'] else 'NO'} |"
        )
    rows += ["", f"Error (predicted / measured - 1): mean {s['error_pct_mean']:+.1f} %, range {s['error_pct_min']:+.1f} "
             f"to {s['error_pct_max']:+.1f} %; {s['within_15_pct']} of {s['repeats']} repeats within 15 %. Load average "
             f"at start {doc['machine']['load_avg_at_start'][0]:.1f}, at end {s['load_avg_at_end'][0]:.1f} (2 cores).", ""]  # fmt: skip
    return "\n".join(rows)


if __name__ == "__main__":
    main()
