"""Real gloo runs of the robust aggregation hooks on scikit-learn's digits, with bad ranks injected.

    >>> from trainsim.run.robust_worker import RobustRunConfig, run_robust
    >>> out = run_robust(RobustRunConfig(cases=[["median", 1, "sign_flip"]], timing_rounds=0))  # doctest: +SKIP
    >>> out["cases"][0]["test_acc"]                                                             # doctest: +SKIP

One launch of ``world_size`` processes (``ranks.run_workers``) runs every case in turn, each from the
same initial weights: a case is an aggregator (``robust.AGGREGATORS``, or ``allreduce``: DDP's own
all-reduce mean through PyTorch's ``allreduce_hook``), a number of bad ranks (the last ones) and a
fault kind (``robust.FAULT_KINDS``). Each rank trains an MLP on its own shard of the training split
(``world_size`` disjoint shards); rank 0 reports the test accuracy, and the ranks check that they ended
with the same weights. Then, with no bad rank, ``timing_rounds`` rounds time every aggregator in
``timing`` for ``timing_steps`` steps after ``timing_warmup``, the order rotated each round (a slow
stretch of the host then touches every aggregator, not one).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainsim.run.ranks import Popen, init_gloo, local_popen, rank_main, run_workers, window_step_ms

BASELINE = "allreduce"
"""DDP's all-reduce mean (``default_hooks.allreduce_hook``): the plain mean the robust rules replace"""


@dataclass(frozen=True, kw_only=True, slots=True)
class RobustRunConfig:
    """One launch: the model, the training, the cases and the timing."""

    world_size: int = 4
    hidden: int = 256
    """width of the MLP's two hidden layers (64 -> hidden -> hidden -> 10; 85,002 parameters at 256)"""
    batch: int = 32
    """samples per rank per step"""
    steps: int = 150
    """training steps of each accuracy case (~14 epochs of the 1,437 training digits at 4 x 32)"""
    lr: float = 0.05
    momentum: float = 0.9
    trim: float = 0.25
    krum_f: int = 0
    """Krum's f: 0 is the largest that 4 ranks allow (world >= 2f + 3)"""
    zeno_drop: int = 2
    zeno_rho: float = 5e-4
    val_batch: int = 32
    """Zeno's validation batch: drawn once from the training split, the same on every rank"""
    fault_factor: float = 10.0
    cases: list[list[Any]] = field(default_factory=list)
    """``[aggregator, bad ranks, fault kind]`` each, optionally a fourth item: the case's fault factor
    (default ``fault_factor``)"""
    eval_every: int = 0
    """record the test accuracy and loss every this many steps of each accuracy case (0: at the end only)"""
    timing: list[str] = field(default_factory=list)
    """aggregators timed with no bad rank"""
    timing_rounds: int = 5
    timing_warmup: int = 5
    timing_steps: int = 40
    seed: int = 0
    timeout_s: float = 60.0
    """gloo's timeout on every collective"""


def _data(cfg: RobustRunConfig, rank: int) -> dict[str, Any]:
    """This rank's training shard, the test split and Zeno's validation batch (the same seed everywhere)."""
    import torch
    from sklearn.datasets import load_digits

    x_np, y_np = load_digits(return_X_y=True)
    x = torch.tensor(x_np, dtype=torch.float32) / 16.0  # pixels are 0..16
    y = torch.tensor(y_np, dtype=torch.int64)
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(y), generator=g)
    n_test = len(y) // 5  # 359 of 1,797
    test, train = perm[:n_test], perm[n_test:]
    val = train[torch.randperm(len(train), generator=g)[: cfg.val_batch]]
    shard = train[rank :: cfg.world_size]
    return {"x": x, "y": y, "test": test, "shard": shard, "val": (x[val], y[val])}


def _model(cfg: RobustRunConfig) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    h = cfg.hidden
    return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))


def _ddp(
    cfg: RobustRunConfig, model: Any, aggregator: str, bad: int, kind: str, data: dict[str, Any],
    factor: float | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """``model`` in DDP with the case's hook (the fault's ``factor``, default ``cfg.fault_factor``); the
    robust state (None for the baseline)."""
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainsim.run.robust import Fault, FaultState, RobustState, fault_hook, robust_hook

    ddp = DDP(model, bucket_cap_mb=64)  # one bucket: the whole model's gradient
    hook: Any
    if aggregator == BASELINE:
        hook, state = allreduce_hook, None
    else:
        hook = robust_hook
        state = RobustState(aggregator, trim=cfg.trim, f=cfg.krum_f, drop=cfg.zeno_drop, lr=cfg.lr, rho=cfg.zeno_rho,
                            model=model, validation=data["val"], loss_fn=F.cross_entropy)  # fmt: skip
    fault = Fault(kind=kind, ranks=tuple(range(cfg.world_size - bad, cfg.world_size)),
                  factor=cfg.fault_factor if factor is None else float(factor), seed=cfg.seed)  # fmt: skip
    ddp.register_comm_hook(FaultState(hook, state, fault), fault_hook)
    return ddp, state


def _train(
    cfg: RobustRunConfig, ddp: Any, data: dict[str, Any], steps: int, first: int = 0,
    after: Callable[[int], None] | None = None,
) -> list[float]:  # fmt: skip
    """``steps`` SGD steps on this rank's shard (batches in a per-epoch order, the same seed on every
    rank); each step's wall time (s). ``after(n)`` runs, untimed, after the n-th step (n from 1)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    shard = data["shard"]
    per_epoch = len(shard) // cfg.batch
    g = torch.Generator().manual_seed(cfg.seed + 1)
    order = torch.randperm(len(shard), generator=g)
    times = []
    for s in range(first, first + steps):
        if s % per_epoch == 0 and s:
            order = torch.randperm(len(shard), generator=g)
        idx = shard[order[(s % per_epoch) * cfg.batch : (s % per_epoch + 1) * cfg.batch]]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(data["x"][idx]), data["y"][idx]).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if after is not None:
            after(s + 1)
    return times


def _accuracy(model: Any, data: dict[str, Any]) -> tuple[float, float, float]:
    """Test accuracy (0-1), test loss (mean cross-entropy) and a checksum of the weights (the ranks must
    agree on it)."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = model(data["x"][data["test"]])
        acc = float((logits.argmax(dim=1) == data["y"][data["test"]]).float().mean())
        loss = float(F.cross_entropy(logits, data["y"][data["test"]]))
        checksum = float(sum(p.double().sum() for p in model.parameters()))
    return acc, loss, checksum


def _worker(cfg: RobustRunConfig, rank: int, master: str, port: int, out: Path) -> None:
    import math

    import torch
    import torch.distributed as dist

    init_gloo(rank, cfg.world_size, master, port, cfg.timeout_s)
    data = _data(cfg, rank)
    cases = []
    for aggregator, bad, kind, *factor in cfg.cases:
        model = _model(cfg)
        ddp, state = _ddp(cfg, model, aggregator, int(bad), kind, data, *factor)
        curve: list[list[float]] = []

        def record(n: int, model: Any = model, curve: list[list[float]] = curve) -> None:
            if cfg.eval_every and n % cfg.eval_every == 0:
                curve.append([n, *_accuracy(model, data)[:2]])

        t0 = time.perf_counter()
        _train(cfg, ddp, data, cfg.steps, after=record)
        train_s = time.perf_counter() - t0
        acc, loss, checksum = _accuracy(model, data)
        sums = torch.tensor([checksum, -checksum], dtype=torch.float64)
        dist.all_reduce(sums, op=dist.ReduceOp.MAX)  # max and -min of the ranks' checksums
        spread = float(sums[0] + sums[1])
        cases.append({"aggregator": aggregator, "bad": int(bad), "kind": kind,
                      "factor": float(factor[0]) if factor else cfg.fault_factor, "test_acc": acc, "test_loss": loss,
                      "curve": curve,
                      "finite": math.isfinite(checksum), "ranks_agree": spread == 0.0 or not math.isfinite(spread),
                      "train_s": train_s, "dropped": state.dropped if state is not None else None})  # fmt: skip
    timing: dict[str, list[dict[str, Any]]] = {a: [] for a in cfg.timing}
    for r in range(cfg.timing_rounds):
        k = r % max(1, len(cfg.timing))
        for aggregator in [*cfg.timing[k:], *cfg.timing[:k]]:
            model = _model(cfg)
            ddp, state = _ddp(cfg, model, aggregator, 0, "scale", data)
            _train(cfg, ddp, data, cfg.timing_warmup)
            c0 = state.compute_s if state is not None else 0.0
            dist.barrier()
            times = _train(cfg, ddp, data, cfg.timing_steps, cfg.timing_warmup)
            compute_s = (state.compute_s - c0) if state is not None else 0.0
            timing[aggregator].append({"step_ms": [1e3 * t for t in times],
                                       "compute_ms": 1e3 * compute_s / cfg.timing_steps})  # fmt: skip
    out.write_text(json.dumps({"rank": rank, "cases": cases, "timing": timing}))
    dist.barrier()


def run_robust(
    cfg: RobustRunConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1", port: int | None = None,
    timeout_s: float = 900.0,
) -> dict[str, Any]:  # fmt: skip
    """Run ``cfg`` on ``world_size`` processes. Returns the cases (rank 0's accuracies) and, per timed
    aggregator, per round: the time per step over the window (``window_step_ms``, the slowest rank's)
    and the ranks' mean aggregation compute per step (ms)."""
    ranks = run_workers("trainsim.run.robust_worker", cfg, cfg.world_size, popen=popen, master=master, port=port,
                        timeout_s=timeout_s)  # fmt: skip
    timing: dict[str, list[dict[str, float]]] = {}
    for aggregator in cfg.timing:
        rounds = []
        for i in range(cfg.timing_rounds):
            per_rank = [{"step_ms": r["timing"][aggregator][i]["step_ms"]} for r in ranks]
            rounds.append({
                "step_ms": window_step_ms(per_rank, cfg.timing_steps),
                "compute_ms": statistics.fmean(r["timing"][aggregator][i]["compute_ms"] for r in ranks),
            })  # fmt: skip
        timing[aggregator] = rounds
    return {"config": asdict(cfg), "cases": ranks[0]["cases"], "timing": timing}


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    _worker(RobustRunConfig(**cfg), rank, master, port, Path(out))


if __name__ == "__main__":
    rank_main(_rank, "one rank of a robust-aggregation run (started by run_robust)")
