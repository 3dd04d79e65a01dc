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

import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import UserError
from trainsim.models.splitgrad import LayerTape
from trainsim.run.ranks import (
    Popen,
    init_gloo,
    local_popen,
    rank_main,
    run_workers,
    segments,
    slowest_rank_steps,
    window_step_ms,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

MODES = ("ooo", "ddp")


@dataclass(frozen=True, kw_only=True, slots=True)
class DpRunConfig:
    """One real data-parallel run."""

    model: str = "mlp"
    """zoo model name"""
    mode: str = "ooo"
    """``ooo``: ``OooDataParallel`` with ``k``; ``ddp``: torch's DistributedDataParallel (reference)"""
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
    zoo_width: int = 0
    """mlp hidden width; 0 = the zoo's default (other models: ignored)"""
    seed: int = 0
    timeout_s: float = 120.0
    """process-group timeout and (x3) whole-run timeout"""
    crash_rank: int = -1
    """fault injection for tests: this rank exits with code 3 at step 1"""
    save_params: bool = False
    """return the final parameters (tests)"""
    trace: bool = False
    """record each step's events (ms from the step's start): forward/backward/weight phase ends, time
    spent waiting for all-reduces, each all-reduce's issue and completion (``OooDataParallel.events``)"""
    def __post_init__(self) -> None:
        from trainsim.models.zoo import MODELS

        if self.model not in MODELS:
            raise UserError(f"model {self.model!r}; expected one of {', '.join(sorted(MODELS))}")
        if self.mode not in MODES:
            raise UserError(f"mode {self.mode!r}; expected one of {', '.join(MODES)}")
        for f in ("world_size", "steps", "batch_size"):
            if getattr(self, f) < 1:
                raise UserError(f"{f}={getattr(self, f)}; expected a positive integer")
        if self.k < 0 or self.warmup < 0:
            raise UserError(f"k={self.k}, warmup={self.warmup}; expected integers >= 0")
    def zoo_spec(self) -> Any:
        return zoo_spec(self.model, self.batch_size, self.zoo_blocks, width=self.zoo_width)


def zoo_spec(model: str, batch_size: int, blocks: int = 0, *, width: int = 0) -> Any:
    """``ZooSpec`` with ``blocks`` as transformer blocks or mlp depth and ``width`` as the mlp's hidden
    width (0: the default)."""
    from trainsim.models.zoo import ZooSpec

    spec = ZooSpec(batch_size=batch_size)
    if blocks and model == "transformer":
        spec = replace(spec, blocks=blocks)
    if blocks and model == "mlp":
        spec = replace(spec, depth=blocks)
    if width and model == "mlp":
        spec = replace(spec, width=width)
    return spec


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

    import torch
    import torch.distributed as dist
    from torch import nn

    from trainsim.models.zoo import build_with_batches

    init_gloo(rank, cfg.world_size, master, port, cfg.timeout_s)
    model, batches = build_with_batches(cfg.model, seed=cfg.seed, spec=cfg.zoo_spec())
    loss_fn = nn.CrossEntropyLoss()

    def make_opt(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)

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
    s = 0
    for warm, n in segments(cfg.steps, cfg.warmup, 0):
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
    }
    if cfg.trace:  # events as ms from each step's start (completions may land in the next step's list)
        result["trace"] = [[(name, round(1e3 * (t - ev[0][1]), 3) if not name.startswith(("wait:", "cpu:")) else round(1e3 * t, 3))
                            for name, t in ev] for ev in trace]  # fmt: skip
    if cfg.save_params:
        result["params"] = [p.detach().reshape(-1).tolist() for p in model.parameters()]
    out.write_text(json.dumps(result))
    dist.destroy_process_group()


def run_dp(
    cfg: DpRunConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1", port: int | None = None
) -> dict[str, Any]:
    """Run ``cfg`` on ``world_size`` processes; per-rank results, the time per step over the measured
    window (ms; ``window_step_ms``), and the median and minimum of the slowest rank's steps."""
    import statistics

    from trainsim.models.zoo import build

    if cfg.mode == "ooo":
        check_k(cfg.k, len(list(build(cfg.model, spec=cfg.zoo_spec())[0].children())), cfg.model)
    ranks = run_workers("trainsim.run.ooo_dp", cfg, cfg.world_size, popen=popen, master=master, port=port,
                        timeout_s=3 * cfg.timeout_s)  # fmt: skip
    per_step = slowest_rank_steps(ranks, cfg.steps)
    return {
        "config": asdict(cfg),
        "step_ms": window_step_ms(ranks, cfg.steps),
        "step_median_ms": statistics.median(per_step),
        "step_min_ms": min(per_step),
        "ranks": ranks,
        "losses": ranks[0]["losses"],
    }


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    _worker(DpRunConfig(**cfg), rank, master, port, Path(out))


if __name__ == "__main__":
    rank_main(_rank, "one rank of a trainsim data-parallel run (started by run_dp)")
