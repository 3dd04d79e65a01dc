"""Parallel random initialisation against one initialisation with the same compute, on two tasks.

    .venv/bin/python benchmarks/parinit_bench.py            # ~3-5 min on 2 cores
    .venv/bin/python benchmarks/parinit_bench.py --quick    # a smoke run (2 seeds, short budgets)

Arms, per seed (paired: the baseline's initialisation and data stream are parinit's candidate r0's):
  - ``single``: one initialisation trained for ``total_steps`` steps;
  - ``parinit``: ``trainsim.run.parinit.parallel_init`` with the same ``total_steps``, i.e. the same
    number of forward+backward passes on batches of the same size, its probes included (a probe batch
    of 4 training batches counts as 4 steps). The K workers run one after another in this process.

Tasks:
  - ``digits``: scikit-learn's digits (1,797 8x8 images, shipped with it), a fixed 80/20 split, MLP
    64-128-128-10, SGD lr 0.05 momentum 0.9, batch 32 drawn with replacement, two compute budgets;
  - ``transformer``: the zoo's transformer (``trainsim.models.zoo``, 2 pre-norm blocks, d=128, 4 heads,
    sequence length 16 here) on a generated "planted majority" task of this script: the zoo's own
    batches have random labels (nothing to learn), so here a label c in 0..9 is drawn, and each of 16
    tokens is, with probability 0.15, a token of class c (ids < 100 with id % 10 == c), else any of the
    100 ids. Adam lr 1e-3, batch 32, a fixed test set of 2,048 sequences.
Final test loss (mean cross-entropy) and accuracy of each arm's model; mean, standard deviation, min
and max over seeds, and the paired difference. Records docs/benchmarks/run.parinit.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import record  # noqa: E402
from trainsim.models.zoo import ZooSpec, build  # noqa: E402
from trainsim.run.parinit import ParInitConfig, Probe, parallel_init, perturbed_copy, plan_steps  # noqa: E402

BATCH = 32
PROBE_BATCHES = 4  # a probe runs on 4 x BATCH fixed training samples: it costs 4 steps
REL_STD = 0.05  # perturbation of refine copies: 5 % of each tensor's RMS


@dataclass
class Worker:
    """One candidate: model, optimizer and its own batch stream."""

    model: nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator


@dataclass(frozen=True)
class Task:
    name: str
    make_model: Callable[[int], nn.Module]  # seed -> initialised model
    make_opt: Callable[[nn.Module], torch.optim.Optimizer]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    probe: tuple[torch.Tensor, torch.Tensor]  # fixed, from the training distribution
    test: tuple[torch.Tensor, torch.Tensor]


def digits_task() -> Task:
    from sklearn.datasets import load_digits

    x_np, y_np = load_digits(return_X_y=True)
    perm = torch.randperm(len(x_np), generator=torch.Generator().manual_seed(0))
    x = torch.tensor(x_np, dtype=torch.float32)[perm] / 16.0
    y = torch.tensor(y_np, dtype=torch.int64)[perm]
    n_test = len(x) // 5
    xtr, ytr, xte, yte = x[n_test:], y[n_test:], x[:n_test], y[:n_test]

    def make_model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))

    def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, len(xtr), (BATCH,), generator=gen)
        return xtr[idx], ytr[idx]

    pidx = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(1))[: PROBE_BATCHES * BATCH]
    return Task("digits", make_model, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                batch, (xtr[pidx], ytr[pidx]), (xte, yte))  # fmt: skip


SEQ, VOCAB_USED, PLANT = 16, 100, 0.15


def planted(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of the planted-majority task (see the module docstring)."""
    y = torch.randint(0, 10, (n,), generator=gen)
    x = torch.randint(0, VOCAB_USED, (n, SEQ), generator=gen)
    plant = torch.rand(n, SEQ, generator=gen) < PLANT
    own = torch.randint(0, VOCAB_USED // 10, (n, SEQ), generator=gen) * 10 + y[:, None]
    return torch.where(plant, own, x), y


def transformer_task() -> Task:
    spec = ZooSpec(batch_size=BATCH, seq_len=SEQ)

    def make_model(seed: int) -> nn.Module:
        return build("transformer", seed=seed, spec=spec)[0]

    return Task("transformer", make_model, lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
                lambda g: planted(g, BATCH), planted(torch.Generator().manual_seed(7), PROBE_BATCHES * BATCH),
                planted(torch.Generator().manual_seed(8), 2048))  # fmt: skip


def train_step(task: Task, w: Worker) -> None:
    x, y = task.batch(w.gen)
    w.opt.zero_grad(set_to_none=True)
    F.cross_entropy(w.model(x), y).backward()
    w.opt.step()


def probe(task: Task, w: Worker) -> Probe:
    """Loss and gradient norm on the fixed probe batch; gradients are cleared so training is unchanged."""
    w.model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(w.model(task.probe[0]), task.probe[1])
    loss.backward()
    g2 = sum(float(p.grad.pow(2).sum()) for p in w.model.parameters() if p.grad is not None)
    w.model.zero_grad(set_to_none=True)
    return Probe(loss=loss.item(), grad_norm=math.sqrt(g2))


@torch.no_grad()
def evaluate(task: Task, model: nn.Module) -> tuple[float, float]:
    x, y = task.test
    losses, correct = 0.0, 0
    for i in range(0, len(x), 512):
        out = model(x[i : i + 512])
        losses += float(F.cross_entropy(out, y[i : i + 512], reduction="sum"))
        correct += int((out.argmax(1) == y[i : i + 512]).sum())
    return losses / len(x), correct / len(x)


def one_seed(task: Task, cfg: ParInitConfig, seed: int) -> dict[str, Any]:
    base = 1000 * (seed + 1)

    def make(i: int) -> Worker:
        m = task.make_model(base + i)
        return Worker(m, task.make_opt(m), torch.Generator().manual_seed(base + 500 + i))

    def perturb(w: Worker, j: int) -> Worker:
        m, opt = perturbed_copy(w.model, w.opt, seed=base + 700 + j, rel_std=REL_STD)
        return Worker(m, opt, torch.Generator().manual_seed(base + 800 + j))

    t0 = time.perf_counter()
    single = make(0)
    for _ in range(cfg.total_steps):
        train_step(task, single)
    t1 = time.perf_counter()
    out = parallel_init(make, lambda w: train_step(task, w), lambda w: probe(task, w), perturb, cfg)
    t2 = time.perf_counter()
    s_loss, s_acc = evaluate(task, single.model)
    p_loss, p_acc = evaluate(task, out.model.model)
    return {
        "seed": seed, "single_loss": s_loss, "single_acc": s_acc, "parinit_loss": p_loss, "parinit_acc": p_acc,
        "winner": out.winner, "winner_train_steps": out.winner_train_steps,
        "single_s": round(t1 - t0, 2), "parinit_s": round(t2 - t1, 2),
        "probes": [{"name": c.name, "round": c.round, "loss": c.probe.loss, "grad_norm": c.probe.grad_norm}
                   for c in out.candidates if c.probe is not None],
    }  # fmt: skip


def stats(v: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
            "min": min(v), "max": max(v)}  # fmt: skip


def summarise(factory: Callable[[], Task], n_seeds: int, cfg: ParInitConfig, rows: list[list[Any]],
              summary: list[str], data: dict[str, Any]) -> None:  # fmt: skip
    """Run both arms on ``n_seeds`` seeds; append headline rows, a summary line and the data."""
    task = factory()
    per_seed = []
    for s in range(n_seeds):
        r = one_seed(task, cfg, s)
        per_seed.append(r)
        print(f"{task.name} T={cfg.total_steps} seed {s}: single {r['single_loss']:.4f}/{r['single_acc']:.4f}"
              f" parinit {r['parinit_loss']:.4f}/{r['parinit_acc']:.4f} winner {r['winner']}"
              f" ({r['single_s']}+{r['parinit_s']} s)", flush=True)  # fmt: skip
    st = {k: stats([r[k] for r in per_seed]) for k in ("single_loss", "single_acc", "parinit_loss", "parinit_acc")}
    dl = stats([r["parinit_loss"] - r["single_loss"] for r in per_seed])
    da = stats([r["parinit_acc"] - r["single_acc"] for r in per_seed])
    wins = sum(r["parinit_loss"] < r["single_loss"] for r in per_seed)
    se = dl["std"] / math.sqrt(n_seeds)
    label = f"{task.name}, {cfg.total_steps} steps"
    for arm in ("single", "parinit"):
        rows.append([label, arm, n_seeds, round(st[f"{arm}_loss"]["mean"], 4), round(st[f"{arm}_loss"]["std"], 4),
                     round(100 * st[f"{arm}_acc"]["mean"], 2), round(100 * st[f"{arm}_acc"]["std"], 2)])  # fmt: skip
    verdict = ("no clear gain" if abs(dl["mean"]) <= 2 * se else
               "parinit better" if dl["mean"] < 0 else "parinit worse")  # fmt: skip
    summary.append(
        f"{label}: parinit - single test loss {dl['mean']:+.4f} ± {se:.4f} (s.e., {n_seeds} paired seeds), "
        f"accuracy {100 * da['mean']:+.2f} points; parinit lower loss on {wins}/{n_seeds} seeds: {verdict}."
    )
    data["runs"].append({"task": task.name, "seeds": n_seeds, "config": {
        f: getattr(cfg, f) for f in ("k", "budget_steps", "keep", "refine", "refine_steps", "probe_cost_steps",
                                     "total_steps", "loss_tol")},
        "steps": {**dataclasses.asdict(plan_steps(cfg)), "winner_train": per_seed[0]["winner_train_steps"]},
        "stats": st, "diff_loss": dl, "diff_acc": da, "parinit_wins": wins, "per_seed": per_seed})  # fmt: skip
    print(summary[-1], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description="parallel random initialisation vs one initialisation")
    ap.add_argument("--quick", action="store_true", help="2 seeds, short budgets: a smoke run, not recorded")
    args = ap.parse_args()
    torch.set_num_threads(2)
    # (task factory, seeds, config): exploration + refinement take ~25-35 % of the compute
    runs: list[tuple[Callable[[], Task], int, ParInitConfig]] = [
        (digits_task, 10, ParInitConfig(k=8, budget_steps=8, keep=2, refine=2, refine_steps=8,
                                        probe_cost_steps=PROBE_BATCHES, total_steps=300)),
        (digits_task, 10, ParInitConfig(k=8, budget_steps=30, keep=2, refine=4, refine_steps=30,
                                        probe_cost_steps=PROBE_BATCHES, total_steps=1500)),
        (transformer_task, 5, ParInitConfig(k=4, budget_steps=15, keep=1, refine=2, refine_steps=10,
                                            probe_cost_steps=PROBE_BATCHES, total_steps=400)),
    ]  # fmt: skip
    if args.quick:
        runs = [(f, 2, ParInitConfig(k=3, budget_steps=2, keep=1, refine=1, refine_steps=2,
                                     probe_cost_steps=PROBE_BATCHES, total_steps=60)) for f, _, _ in runs[1:]]  # fmt: skip
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"batch": BATCH, "probe_batches": PROBE_BATCHES, "perturb_rel_std": REL_STD,
                            "workers": "sequential, one process", "runs": []}  # fmt: skip
    summary: list[str] = []
    t_all = time.perf_counter()
    for factory, n_seeds, cfg in runs:
        try:
            summarise(factory, n_seeds, cfg, rows, summary, data)
        except Exception:  # keep the runs that finished; the record says which one failed
            traceback.print_exc()
            summary.append(f"{factory.__name__} (total_steps {cfg.total_steps}) FAILED: see data.errors.")
            data.setdefault("errors", []).append(traceback.format_exc())
    data["wall_s"] = round(time.perf_counter() - t_all, 1)
    print(f"total {data['wall_s']} s", flush=True)
    if args.quick:
        return 0
    summary.append(
        "Compute per arm: the same number of forward+backward passes on batches of 32 (parinit's probes on 4"
        " batches count 4 steps each); the K workers ran one after another in one process (wall time "
        "in the record). Differences within 2 standard errors are reported as no clear gain."
    )
    record(area="run", name="parinit", command="python benchmarks/parinit_bench.py",
           title="Parallel random initialisation vs one initialisation, same compute",
           headline={"columns": ["task, total steps", "arm", "seeds", "test loss mean", "test loss std",
                                 "accuracy % mean", "accuracy % std"], "rows": rows},
           summary=summary, data=data)  # fmt: skip
    return 0 if "errors" not in data else 1


if __name__ == "__main__":
    sys.exit(main())
