"""Data parallelism with out-of-order backprop ("reverse first-k"), for real, on gloo.

    >>> from trainsim.run.ooo_dp import DpRunConfig, run_dp
    >>> res = run_dp(DpRunConfig(model="mlp", mode="ooo", k=2, steps=20))   # doctest: +SKIP
    >>> res["step_ms"], res["losses"][:3]                                   # doctest: +SKIP

``OooDataParallel`` wraps an ``nn.Sequential`` (the zoo's layers). One training step:

1. forward, layer by layer; just before layer ``i`` (``i < k``) runs, wait for its gradient
   all-reduce from the previous step and apply its optimizer update there (not earlier);
2. the output-gradient chain (B of every layer, last to first) - the critical path;
   layers ``i >= k`` run B and W fused, as plain backprop does, and start their all-reduce at once
   (DDP with one bucket per layer);
3. W of the first ``k`` layers, input-first (layer 0 first: its update is needed first), each
   all-reduce started as soon as its gradient exists;
4. wait for the all-reduces of layers ``i >= k`` and update them (DDP's end of step).

So the communication of the first ``k`` layers overlaps the end of backward and the start of the
next forward (Oh et al., EuroSys'22, §5; ``mlsys-seo/ooo-backprop: dp_schedule.py``). ``k = 0`` is
DDP's order. Gradients are divided by the world size before a SUM all-reduce, as DDP's default
hook does, so updated weights equal DDP's for the same data (``tests/run/test_ooo_dp.py``).
``flush()`` applies the updates still pending after the last step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import UserError
from trainsim.run.ranks import (
    HOST_STEPS,
    Popen,
    host_speed_round,
    init_gloo,
    local_popen,
    run_workers,
    segments,
    slowest_rank_steps,
    train_while,
    window_step_ms,
)
from trainsim.run.splitgrad import LayerTape

if TYPE_CHECKING:
    import torch
    from torch import nn

MODES = ("ooo", "ddp", "load")


@dataclass(frozen=True, kw_only=True, slots=True)
class DpRunConfig:
    """One real data-parallel run."""

    model: str = "mlp"
    """zoo model name"""
    mode: str = "ooo"
    """``ooo``: ``OooDataParallel`` with ``k``; ``ddp``: torch's DistributedDataParallel (reference);
    ``load``: no gradient exchange: all-reduces of ``probe_sizes`` timed on a thread while the plain
    training loop runs (``load_probe``)"""
    k: int = 0
    """layers (from the input) whose weight gradients are deferred and reordered; 0 = DDP order"""
    world_size: int = 2
    steps: int = 20
    """measured steps"""
    warmup: int = 3
    """steps run before measuring"""
    batch_size: int = 32
    """samples per rank per step"""
    lr: float = 0.01
    momentum: float = 0.9
    zoo_blocks: int = 0
    """transformer blocks / mlp depth; 0 = the zoo's default"""
    seed: int = 0
    timeout_s: float = 120.0
    """process-group timeout and (x3) whole-run timeout"""
    crash_rank: int = -1
    """fault injection for tests: this rank exits with code 3 at step 1"""
    save_params: bool = False
    """return the final parameters (tests)"""
    probe_sizes: tuple[int, ...] = ()
    """``load`` mode: all-reduce sizes (bytes)"""
    probe_reps: tuple[int, ...] = ()
    """``load`` mode: all-reduces per size (every rank runs the same count)"""
    start_at: float = 0.0
    """epoch seconds: every rank starts its loop no earlier (copies of a one-rank run launched together
    then run their loops together: ``validate.ooo.side_by_side_terms``)"""
    trace: bool = False
    """record each step's events (ms from the step's start): forward/backward/weight phase ends, time
    spent waiting for all-reduces, each all-reduce's issue and completion (``OooDataParallel.events``)"""
    host_rounds: int = 0
    """modes ``ooo`` and ``ddp``: readings of the host's speed during the run
    (``run.ranks.host_speed_round`` on a copy of the model), each before a segment of the measured
    steps (``run.ranks.segments``); 0: none"""
    alternate: tuple[int, ...] = ()
    """mode ``ooo``: run these orders (values of k) side by side instead of ``k``, each on its own copy
    of the model, in turns of ``ALT_TURN`` steps on the same batches (``alternate_orders``); ``steps``
    counted steps per order. The rank's result then holds ``alt``: per order, its counted steps'
    (start, end) times"""

    def __post_init__(self) -> None:
        from trainsim.models.zoo import MODELS

        if self.model not in MODELS:
            raise UserError(f"model {self.model!r}; expected one of {', '.join(sorted(MODELS))}")
        if self.mode not in MODES:
            raise UserError(f"mode {self.mode!r}; expected one of {', '.join(MODES)}")
        for f in ("world_size", "steps", "batch_size"):
            if getattr(self, f) < 1:
                raise UserError(f"{f}={getattr(self, f)}; expected a positive integer")
        if self.k < 0 or self.warmup < 0 or self.host_rounds < 0:
            raise UserError(f"k={self.k}, warmup={self.warmup}, host_rounds={self.host_rounds}; expected "
                            "integers >= 0")  # fmt: skip
        if len(self.probe_sizes) != len(self.probe_reps) or any(
            v < 1 for v in (*self.probe_sizes, *self.probe_reps)
        ):
            raise UserError(f"probe_sizes {self.probe_sizes}, probe_reps {self.probe_reps}; expected two lists "
                            "of positive integers of the same length")  # fmt: skip
        if self.mode == "load" and not self.probe_sizes:
            raise UserError("mode 'load' needs probe_sizes")
        if self.alternate and (self.mode != "ooo" or self.host_rounds or self.trace or len(set(self.alternate))
                               != len(self.alternate) or min(self.alternate) < 0):
            raise UserError(f"alternate={self.alternate} with mode {self.mode!r}, host_rounds={self.host_rounds}, "
                            f"trace={self.trace}; expected distinct k >= 0, mode 'ooo', no host rounds, no trace")

    def zoo_spec(self) -> Any:
        return zoo_spec(self.model, self.batch_size, self.zoo_blocks)


def zoo_spec(model: str, batch_size: int, blocks: int = 0) -> Any:
    """``ZooSpec`` with ``blocks`` as transformer blocks or mlp depth (0: the default)."""
    from trainsim.models.zoo import ZooSpec

    if blocks and model == "transformer":
        return ZooSpec(batch_size=batch_size, blocks=blocks)
    if blocks and model == "mlp":
        return ZooSpec(batch_size=batch_size, depth=blocks)
    return ZooSpec(batch_size=batch_size)


def zoo_layer_count(model: str, batch_size: int = 32, zoo: dict[str, Any] | None = None) -> int:
    from trainsim.models.zoo import ZooSpec, build

    m, _ = build(model, spec=ZooSpec(batch_size=batch_size, **(zoo or {})))
    return len(list(m.children()))


def check_k(k: int, n_layers: int, model: str) -> None:
    if not 0 <= k <= n_layers:
        raise UserError(f"--k {k}: model {model!r} has {n_layers} layers; expected 0 <= k <= {n_layers}")


class OooDataParallel:
    """Reverse-first-k data parallelism over the children of an ``nn.Sequential``."""

    __slots__ = ("_works", "events", "group", "k", "layers", "optimizers", "world_size")

    def __init__(
        self,
        model: nn.Sequential,
        k: int,
        make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        group: Any = None,
    ) -> None:
        import torch.distributed as dist

        self.layers = list(model.children())
        check_k(k, len(self.layers), type(model).__name__)
        self.k = k  # layers [0, k) are reordered
        self.group = group
        # without a process group: one process, no communication (the reordered computation alone)
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.optimizers = [
            make_optimizer(list(m.parameters())) if any(True for _ in m.parameters()) else None
            for m in self.layers
        ]
        # layer -> (all-reduce work, flat buffer) in flight, not yet applied
        self._works: dict[int, tuple[Any, torch.Tensor]] = {}
        self.events: list[tuple[str, float]] | None = None
        """``(event, perf_counter seconds)`` when tracing (set to a list); appended from gloo's
        threads too (all-reduce completions)"""
        if self.world_size > 1:
            for p in model.parameters():  # same start on every rank, as DDP does
                dist.broadcast(p.data, 0, group=group)

    # ---------------------------------------------------------------- communication
    def _start_allreduce(self, i: int) -> None:
        import torch
        import torch.distributed as dist

        grads = [p.grad for p in self.layers[i].parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.world_size == 1:
            self._works[i] = (None, flat)
            return
        flat.div_(self.world_size)
        work = dist.all_reduce(flat, async_op=True, group=self.group)
        ev = self.events
        if ev is not None:
            ev.append((f"issue:{i}", time.perf_counter()))
            work.get_future().then(lambda _f: ev.append((f"done:{i}", time.perf_counter())))
        self._works[i] = (work, flat)

    def _finish(self, i: int) -> None:
        """Wait for layer ``i``'s all-reduce, write the averages back and apply its update."""
        work, flat = self._works.pop(i)
        if work is not None:
            if self.events is not None:
                t = time.perf_counter()
                work.wait()
                self.events.append((f"wait:{i}", time.perf_counter() - t))
            else:
                work.wait()
        off = 0
        for p in self.layers[i].parameters():
            if p.grad is not None:
                n = p.grad.numel()
                p.grad.copy_(flat[off : off + n].view_as(p.grad))
                off += n
        opt = self.optimizers[i]
        assert opt is not None
        opt.step()
        opt.zero_grad(set_to_none=True)

    # ---------------------------------------------------------------- one step
    def step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor]) -> float:
        """One training step (forward, reordered backward, updates); returns the local loss."""
        import torch

        ev = self.events
        cpu0 = time.thread_time()
        tapes: list[LayerTape] = []
        h = x
        for i, layer in enumerate(self.layers):
            if i in self._works:  # 1. the deferred update, just before the layer's forward
                self._finish(i)
            tape = LayerTape.forward(layer, h, input_grad=i > 0)
            tapes.append(tape)
            h = tape.out
        if ev is not None:
            ev.append(("forward", time.perf_counter()))
            ev.append(("cpu:forward", time.thread_time() - cpu0))
        logits = h.detach().requires_grad_(True)
        loss = loss_fn(logits, y)
        (g,) = torch.autograd.grad(loss, logits)
        for i in range(len(tapes) - 1, -1, -1):  # 2. output-gradient chain; DDP layers do W too
            if i >= self.k:
                g_in = tapes[i].backward(g)  # fused B+W, as plain backprop
                self._start_allreduce(i)
            else:
                g_in = tapes[i].backward_input(g)
            if g_in is not None:
                g = g_in
        if ev is not None:
            ev.append(("backward", time.perf_counter()))
            ev.append(("cpu:backward", time.thread_time() - cpu0))
        for i in range(self.k):  # 3. reversed first k: input-first weight gradients
            tapes[i].backward_weight()
            self._start_allreduce(i)
        if ev is not None:
            ev.append(("weights", time.perf_counter()))
            ev.append(("cpu:weights", time.thread_time() - cpu0))
        for i in range(self.k, len(self.layers)):  # 4. DDP's end of step
            if i in self._works:
                self._finish(i)
        if ev is not None:
            ev.append(("end", time.perf_counter()))
        return float(loss.detach())

    def flush(self) -> None:
        """Apply every update still pending (after the last step)."""
        for i in sorted(self._works):
            self._finish(i)


# ---------------------------------------------------------------------- worker process
def _worker(cfg: DpRunConfig, rank: int, master: str, port: int, out: Path) -> None:
    import os

    import torch
    import torch.distributed as dist
    from torch import nn

    from trainsim.models.zoo import build_with_batches

    init_gloo(rank, cfg.world_size, master, port, cfg.timeout_s)
    model, batches = build_with_batches(cfg.model, seed=cfg.seed, spec=cfg.zoo_spec())
    loss_fn = nn.CrossEntropyLoss()

    def make_opt(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)

    if cfg.mode == "load" or cfg.alternate:  # the probe, or the orders side by side: their own loops
        if cfg.mode == "load":
            res = load_probe(model, batches, loss_fn, cfg, rank)
        else:
            res = alternate_orders(model, batches, loss_fn, make_opt, cfg, rank)
        out.write_text(json.dumps({"rank": rank, **res}))
        dist.barrier()
        dist.destroy_process_group()
        return
    step_fn: Callable[[torch.Tensor, torch.Tensor], float]
    trace: list[Any] = []
    if cfg.mode == "ooo":
        assert isinstance(model, nn.Sequential)
        ooo = OooDataParallel(model, cfg.k, make_opt)
        step_fn = lambda x, y: ooo.step(x, y, loss_fn)  # noqa: E731
        finish: Callable[[], None] = ooo.flush
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = make_opt(list(ddp.parameters()))

        def ddp_step(x: torch.Tensor, y: torch.Tensor) -> float:
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        step_fn = ddp_step
        finish = lambda: None  # noqa: E731
    losses: list[float] = []
    step_ms: list[float] = []
    marks: list[float] = []
    host: list[dict[str, list[float]]] = []
    if cfg.host_rounds:  # a copy of the model for the host's speed (the plain loop, no communication)
        plain, plain_batch = build_with_batches(cfg.model, seed=cfg.seed + 1, spec=cfg.zoo_spec())
    time.sleep(max(0.0, cfg.start_at - time.time()))
    s = 0
    for i, (warm, n) in enumerate(segments(cfg.steps, cfg.warmup, cfg.host_rounds)):
        if cfg.host_rounds:  # the collectives still in flight finish first (the barriers queue behind them)
            host.append(host_speed_round(plain, plain_batch, loss_fn, rank=rank, world=cfg.world_size,
                                         steps=HOST_STEPS, warmup=1 if i else 2))  # fmt: skip
        stamps: list[float] = []
        for j in range(warm + n):
            if s == 1 and rank == cfg.crash_rank:
                os._exit(3)
            x, y = batches(s * cfg.world_size + rank)
            measured = j >= warm
            if measured:
                stamps.append(time.perf_counter())
            if cfg.trace and cfg.mode == "ooo":
                ooo.events = [("start", time.perf_counter())] if measured else None
            losses.append(step_fn(x, y))
            if cfg.trace and cfg.mode == "ooo" and measured:
                trace.append(ooo.events)
            s += 1
        stamps.append(time.perf_counter())
        step_ms += [1e3 * (b - a) for a, b in itertools.pairwise(stamps)]
        marks += stamps
    finish()
    dist.barrier()
    result: dict[str, Any] = {
        "rank": rank,
        "losses": losses,
        "step_ms": step_ms,
        # each segment's measured steps' starts and its last step's end (time.perf_counter, s)
        "marks": marks,
        "host_speed": host,
    }
    if cfg.trace:  # events as ms from each step's start (completions may land in the next step's list)
        result["trace"] = [[(name, round(1e3 * (t - ev[0][1]), 3) if not name.startswith(("wait:", "cpu:")) else round(1e3 * t, 3))
                            for name, t in ev] for ev in trace]  # fmt: skip
    if cfg.save_params:
        result["params"] = [p.detach().reshape(-1).tolist() for p in model.parameters()]
    out.write_text(json.dumps(result))
    dist.destroy_process_group()


ALT_TURN = 4
"""steps per turn of one order in ``alternate_orders``; the first after a switch is not counted (the
other order's copy of the model has just run)"""


def alternate_orders(
    model: Any, batches: Any, loss_fn: Any, make_opt: Any, cfg: DpRunConfig, rank: int
) -> dict[str, Any]:
    """The orders ``cfg.alternate`` side by side in this process: each on its own copy of ``model``
    (``OooDataParallel``), in turns of ``ALT_TURN`` steps, every order on the same batches, until each
    has ``cfg.steps`` counted steps. Side by side, a drift of the host's speed reaches every order
    alike, so their difference (the runtime's own work as a function of k) is read in one window, not
    in runs a minute apart (two such runs of k = 0 and k = 1 on the transformer, the same minute,
    differed by 14 ms per step, ten times what the orders differ by). ``{"alt": {k: [(start, end)]}}``."""
    import copy

    runners = {k: OooDataParallel(copy.deepcopy(model), k, make_opt) for k in cfg.alternate}
    for r in runners.values():
        for s in range(cfg.warmup):
            x, y = batches(s * cfg.world_size + rank)
            r.step(x, y, loss_fn)
    time.sleep(max(0.0, cfg.start_at - time.time()))
    spans: dict[int, list[tuple[float, float]]] = {k: [] for k in runners}
    turn = 0
    while min(len(v) for v in spans.values()) < cfg.steps:
        for k, r in runners.items():
            for j in range(ALT_TURN):
                t0 = time.perf_counter()
                x, y = batches((cfg.warmup + turn * ALT_TURN + j) * cfg.world_size + rank)
                r.step(x, y, loss_fn)
                if j:
                    spans[k].append((t0, time.perf_counter()))
        turn += 1
    for r in runners.values():
        r.flush()
    return {"alt": {str(k): v[: cfg.steps] for k, v in spans.items()}}


def load_probe(model: Any, batches: Any, loss_fn: Any, cfg: DpRunConfig, rank: int) -> dict[str, Any]:
    """All-reduces under a training load, as the reordered schedule runs them.

    First the plain training loop alone (every rank at once, nothing sent) for ``cfg.warmup +
    cfg.steps`` steps; then a communication thread runs back-to-back all-reduces of each size of
    ``cfg.probe_sizes`` (``cfg.probe_reps`` of each) while the main thread keeps training. Per size:
    the mean all-reduce time (the slowest rank's per operation) and the training lost meanwhile: the
    loop's progress over the size's window (steps counted in fractions of the part inside it) against
    its rate alone, times the mean all-reduce time. The idle calibration misses both: a busy rank's
    gloo threads wait for a core, and the kernel's work for the shaped link runs on the training thread.
    """
    import statistics

    import torch
    import torch.distributed as dist

    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)

    def train_step(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        x, y = batches(i * cfg.world_size + rank)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        return t0, time.perf_counter()

    alone = [b - a for a, b in (train_step(i) for i in range(cfg.warmup + cfg.steps))][cfg.warmup :]
    alone_s = statistics.median(alone)
    windows: list[tuple[float, float, list[float]]] = []  # per size: start, end, all-reduce times (s)

    def comm() -> None:
        for size, reps in zip(cfg.probe_sizes, cfg.probe_reps, strict=True):
            x = torch.ones(max(1, size // 4))
            dist.all_reduce(x)  # buffers and connections for this size
            times: list[float] = []
            start = time.perf_counter()
            for _ in range(reps):
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - t0)
            windows.append((start, time.perf_counter(), times))

    dist.barrier()
    steps: list[tuple[float, float]] = []
    train_while(comm, lambda i: steps.append(train_step(i)), cfg.warmup + cfg.steps, f"load probe on rank {rank}")
    mean_s, lost_s = [], []
    for start, end, times in windows:
        inside = sum(max(0.0, min(b, end) - max(a, start)) / (b - a) for a, b in steps)
        frac = max(0.0, 1.0 - (inside / (end - start)) * alone_s)
        mean_s.append(statistics.fmean(times))
        lost_s.append(frac * mean_s[-1])
    t = torch.tensor(mean_s, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    lost = torch.tensor(lost_s, dtype=torch.float64)
    dist.all_reduce(lost)
    return {"sizes": list(cfg.probe_sizes), "allreduce_us": [1e6 * v for v in t.tolist()],
            "lost_us": [1e6 * v / cfg.world_size for v in lost.tolist()], "alone_ms": 1e3 * alone_s,
            "train_steps": len(steps)}  # fmt: skip


def run_dp(
    cfg: DpRunConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1", port: int | None = None
) -> dict[str, Any]:
    """Run ``cfg`` on ``world_size`` processes; per-rank results, the time per step over the measured
    window (ms; ``window_step_ms``), and the median and minimum of the slowest rank's steps."""
    import statistics

    from trainsim.models.zoo import build

    if cfg.mode == "ooo":
        n = len(list(build(cfg.model, spec=cfg.zoo_spec())[0].children()))
        for k in cfg.alternate or (cfg.k,):
            check_k(k, n, cfg.model)
    ranks = run_workers("trainsim.run.ooo_dp", cfg, cfg.world_size, popen=popen, master=master, port=port,
                        timeout_s=3 * cfg.timeout_s)  # fmt: skip
    if cfg.mode == "load":
        return {"config": asdict(cfg), **{k: v for k, v in ranks[0].items() if k != "rank"}}
    if cfg.alternate:
        return {"config": asdict(cfg), "ranks": ranks}
    per_step = slowest_rank_steps(ranks, cfg.steps)
    return {
        "config": asdict(cfg),
        "step_ms": window_step_ms(ranks, cfg.steps),
        "step_median_ms": statistics.median(per_step),
        "step_min_ms": min(per_step),
        "ranks": ranks,
        "losses": ranks[0]["losses"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one rank of a trainsim data-parallel run (started by run_dp)")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", required=True)
    a = ap.parse_args(argv)
    _worker(DpRunConfig(**json.loads(a.config)), a.rank, a.master, a.port, a.out)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: the result is written; gloo's and DDP's threads can abort in static
    # destructors afterwards ("terminate called without an active exception"), failing a finished rank
    os._exit(code)
