"""Convergence of every compression algorithm: 2-process gloo DDP on scikit-learn's digits.

    .venv/bin/python benchmarks/compress_convergence.py            # ~2-4 min on 2 cores
    .venv/bin/python benchmarks/compress_convergence.py --epochs 3 --only none,onebit   # a smoke run

Real data that ships with scikit-learn (1,797 8x8 digit images), a fixed 80/20 split, each of the
2 ranks trains on its half of the training set; MLP 64-256-128-10, plain SGD (lr 0.1, momentum 0 by
default: error feedback with optimizer momentum 0.9 at this lr diverges for several biased
compressors, see docs/compress.md; ``--momentum 0.9`` reproduces that; DGC always runs without
optimizer momentum and its own momentum correction), batch 32 per rank, a fixed number of epochs
for everyone. Every algorithm runs through ``trainsim.run.hooks.compress_hook`` (weights compressed,
biases all-reduced exactly). The result table goes to docs/benchmarks/compress.convergence*.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import DIR, record_report

ROOT = Path(__file__).resolve().parents[1]
OUT_MD = DIR / "compress.md"  # only its folder is used: reports become docs/benchmarks/compress.<name>.json

# (label, algorithm or None for plain DDP, hook options, lr)
RUNS: list[tuple[str, str | None, dict[str, Any], float]] = [
    ("plain DDP all-reduce", None, {}, 0.1),
    ("none (hook, fp32)", "none", {}, 0.1),
    ("fp16", "fp16", {}, 0.1),
    ("bf16", "bf16", {}, 0.1),
    ("onebit (EF)", "onebit", {}, 0.1),
    ("signsgd (no EF, lr 1e-3)", "signsgd", {}, 1e-3),
    ("efsignsgd (EF)", "efsignsgd", {}, 0.1),
    ("tbq (EF)", "tbq", {}, 0.1),
    ("terngrad (no EF)", "terngrad", {}, 0.1),
    ("terngrad + EF", "terngrad", {"error_feedback": True}, 0.1),
    ("terngrad_minmax 2-bit (no EF)", "terngrad_minmax", {}, 0.1),
    ("terngrad_minmax 2-bit + EF", "terngrad_minmax", {"error_feedback": True}, 0.1),
    ("qsgd 8-bit (no EF)", "qsgd", {}, 0.1),
    ("qsgd 4-bit (no EF)", "qsgd", {"bits": 4}, 0.1),
    ("qsgd 8-bit + EF", "qsgd", {"error_feedback": True}, 0.1),
    ("topk 1% (EF)", "topk", {"ratio": 0.01}, 0.1),
    ("randomk 1% (EF)", "randomk", {"ratio": 0.01}, 0.1),
    ("randomk 10% (EF)", "randomk", {"ratio": 0.1}, 0.1),
    ("dgc 0.1% (momentum corr. 0.9)", "dgc", {}, 0.1),
    ("dgc 1% (momentum corr. 0.9)", "dgc", {"ratio": 0.01}, 0.1),
    ("graddrop 0.1% (EF)", "graddrop", {}, 0.1),
    ("graddrop 1% (EF)", "graddrop", {"ratio": 0.01}, 0.1),
    ("powersgd rank 1 (EF)", "powersgd", {"rank": 1}, 0.1),
    ("powersgd rank 4 (EF)", "powersgd", {"rank": 4}, 0.1),
    ("tbq (EF), CaSync PS", "tbq", {"scheme": "ps"}, 0.1),
    ("tbq (EF), CaSync ring", "tbq", {"scheme": "ring"}, 0.1),
]


def _data(rank: int, world: int) -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    xt = torch.tensor(x, dtype=torch.float32)[perm] / 16.0
    yt = torch.tensor(y, dtype=torch.int64)[perm]
    n_test = len(x) // 5
    x_test, y_test, x_train, y_train = xt[:n_test], yt[:n_test], xt[n_test:], yt[n_test:]
    return x_train[rank::world], y_train[rank::world], x_test, y_test


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def _train(
    rank: int,
    world: int,
    algo: str | None,
    opts: dict[str, Any],
    lr: float,
    epochs: int,
    momentum: float,
    in_hook: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    from trainsim.run.hooks import CompressionState, hook_for

    x_tr, y_tr, x_te, y_te = _data(rank, world)
    model = _model(seed)
    ddp = DDP(model)
    hook_momentum = 0.0
    if algo == "dgc":
        momentum = 0.0  # DGC corrects momentum itself
    elif algo is not None and in_hook:
        hook_momentum, momentum = momentum, 0.0  # momentum correction: the hook keeps the velocity
    if algo is not None:
        state = CompressionState(algo, model=model, min_numel=1024, momentum=hook_momentum, seed=seed, **opts)
        ddp.register_comm_hook(state, hook_for(algo))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    batch = 32
    g = torch.Generator().manual_seed(1000 * seed + rank)
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    steps = 0
    for _ in range(epochs):
        perm = torch.randperm(len(x_tr), generator=g)
        for i in range(0, len(x_tr) - batch + 1, batch):
            idx = perm[i : i + batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            steps += 1
    wall = time.perf_counter() - t0
    with torch.no_grad():
        acc = float((model(x_te).argmax(1) == y_te).float().mean()) * 100
    return {"acc": acc, "loss": float(loss.detach()), "steps": steps, "wall_s": wall}


def _worker(
    rank: int, port: int, out: str, runs: list[int], epochs: int, momentum: float, in_hook: bool, seeds: int
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    results = []
    for i in runs:
        label, algo, opts, lr = RUNS[i]
        per_seed = [_train(rank, 2, algo, opts, lr, epochs, momentum, in_hook, seed) for seed in range(seeds)]
        res = {"label": label, "acc": [r["acc"] for r in per_seed], "loss": [r["loss"] for r in per_seed],
               "steps": per_seed[0]["steps"], "wall_s": sum(r["wall_s"] for r in per_seed) / seeds}  # fmt: skip
        results.append(res)
        if rank == 0:
            accs = " ".join(f"{a:6.2f}" for a in res["acc"])
            print(f"{label:34s} acc {accs} %  {res['wall_s']:.1f} s per seed", flush=True)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    os._exit(0)  # skip gloo teardown (its threads sometimes abort at exit on torch 2.13)


def write_section(path: Path, name: str, text: str) -> Path:
    """Record one report as ``docs/benchmarks/compress.<name>.json`` (``path``: kept for the callers, unused)."""
    return record_report("compress", name.replace("-", "_"), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated algorithm names to run (plus the baseline)")
    ap.add_argument("--momentum", type=float, default=0.0, help="SGD momentum of every run but DGC")
    ap.add_argument(
        "--momentum-correction",
        action="store_true",
        help="compressed runs keep the momentum in the hook (CompressionState(momentum=...)), optimizer without",
    )
    ap.add_argument("--seeds", type=int, default=3, help="repetitions with different initialisation, "
                    "shuffling and compressor seeds (the train/test split is fixed)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.seeds < 1 or args.epochs < 1:
        ap.error(f"--seeds {args.seeds}, --epochs {args.epochs}: expected positive integers")
    only = {a for a in args.only.split(",") if a}
    runs = [i for i, r in enumerate(RUNS) if not only or r[1] is None or r[1] in only]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "res.json"))
        t0 = time.perf_counter()
        mp.start_processes(
            _worker,
            args=(port, out, runs, args.epochs, args.momentum, args.momentum_correction, args.seeds),
            nprocs=2,
            start_method="spawn",
        )
        results = json.loads(Path(out).read_text())
        total = time.perf_counter() - t0
    base = results[0]["acc"]
    section = "convergence" if not args.momentum else "convergence-momentum"
    if args.momentum_correction:
        section += "-corrected"
    if args.epochs != 20:  # the default budget keeps its section; others get their own
        section += f"-{args.epochs}ep"
    n = args.seeds
    lines = [
        f"## Convergence: 2-process gloo DDP on scikit-learn digits (momentum {args.momentum}"
        f"{', in the hook (momentum correction) for compressed runs' if args.momentum_correction else ''})",
        "",
        f"Command: `.venv/bin/python benchmarks/compress_convergence.py --epochs {args.epochs} --seeds {n}"
        f"{' --momentum ' + str(args.momentum) if args.momentum else ''}"
        f"{' --momentum-correction' if args.momentum_correction else ''}"
        f"{' --only ' + args.only if args.only else ''}`  ",
        f"Machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}; "
        f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; total {total:.0f} s.  ",
        f"Setup: MLP 64-256-128-10, SGD lr 0.1 (signSGD 1e-3) momentum {args.momentum} "
        "(DGC: optimizer momentum 0, it corrects momentum itself), "
        f"batch 32 per rank, {args.epochs} epochs = {results[0]['steps']} steps, 1,437 train / 360 test images, "
        "weights compressed (min_numel 1024), biases all-reduced exactly. Test accuracy on rank 0. "
        f"Each run {n} times (seeds 0-{n - 1}: initialisation, shuffling, the compressor's randomness; the "
        "split is fixed); the difference is taken per seed against plain DDP with the same seed, then "
        "averaged. One test image is 0.28 points.",
        "",
        "| run | test accuracy % (mean) | per seed | vs plain DDP (points, mean of per-seed differences) "
        "| worst seed | within 1 point | final train loss (mean) | wall s per seed |",
        "|---|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in results:
        diffs = [a - b for a, b in zip(r["acc"], base, strict=True)]
        mean_diff = sum(diffs) / n
        lines.append(
            f"| {r['label']} | {sum(r['acc']) / n:.2f} | {' / '.join(f'{a:.2f}' for a in r['acc'])} | "
            f"{mean_diff:+.2f} | {min(diffs):+.2f} | {'yes' if mean_diff >= -1.0 else 'no'} | "
            f"{sum(r['loss']) / n:.4f} | {r['wall_s']:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(OUT_MD, section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
