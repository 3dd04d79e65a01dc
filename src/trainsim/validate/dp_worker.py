"""One rank of a real data-parallel training run (started by ``trainsim validate dp``, one per namespace).

    $ RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... \\
      python -m trainsim.validate.dp_worker '{"model": "mlp", "mode": "ddp", "steps": 6, "warmup": 3}'

Modes:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` (``bucket_cap_mb``, default 25 MiB; 1 MiB first
  bucket, buffers broadcast before each forward) over gloo, SGD with momentum.
- ``overhead``: one process (``WORLD_SIZE=1``) times the plain loop and the same loop under DDP,
  alternately: DDP's own host work per step (``ddp_overhead``), and the part of it after the last
  bucket's collective (``ddp_finalize_ms``).
- ``p3``: a P3-style runtime (Jayarajan et al., MLSys'19): each layer's gradients are copied out as soon
  as autograd has accumulated them and cut into ``slice_bytes`` slices; one communication thread
  all-reduces the slices one at a time, always the *input-most* layer's slice among those ready on every
  rank; the next step's forward of a layer waits only for that layer's slices, then applies the layer's
  SGD update (``P3Runtime``).
- ``bytescheduler``: the same runtime with ByteScheduler's partitions and credit (Peng et al., SOSP'19):
  ``partition_bytes`` pieces (default 4 MB), up to ``credit`` (4) all-reduces in flight at once.

Prints one JSON line on rank 0: ``{"step_ms": [...], ...}`` (wall time between consecutive step starts).
With ``"trace": true`` the p3 and bytescheduler modes add ``p3_log``: ``(kind, layer, start ms, end ms)`` of every slice
all-reduce (``"slice"``) and every wait of a forward for its layer's slices (``"wait"``), relative to
the first measured step's start, and ``step_starts_ms``; every rank then prints its own line.
"""

from __future__ import annotations

import collections
import copy
import itertools
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

from trainsim.run.ranks import loop_marks, step_starts
from trainsim.transform.scheduling import BYTESCHEDULER_CREDIT as BS_CREDIT
from trainsim.transform.scheduling import BYTESCHEDULER_PARTITION_BYTES as BS_PARTITION_BYTES


class P3Runtime:
    """Priority-ordered, sliced gradient all-reduce with per-layer updates (see the module docstring).

    Ranks must agree on which slice to send next; queue order is the same on every rank (backward
    order), so it is enough to agree on how many slices every rank has queued, ``agreed``, and pick the
    highest-priority unsent slice among the first ``agreed``. Two ways, chosen once at start by rank 0
    from the measured cost of a tiny all-reduce (``agree_max_us``):

    * *agreement round* (cheap links): before each slice, one tiny all-reduce of a counter per rank;
      ``agreed`` is then current, so a layer that became ready during the previous slice is known to
      be ready everywhere;
    * *piggyback* (high-latency links, where a round trip costs as much as a slice): the counters ride
      on the previous slice's all-reduce, as old as its start; when no agreed slice is left, the first
      unsent one in queue order goes. On cnn at 100 Mbit/s this made the input layer's forward wait
      45 ms behind a 33 ms slice of a deeper layer that the counters still said was the only one ready.

    ``credit`` > 1 is ByteScheduler's credit-based scheduling (Peng et al., SOSP'19, §4.2): up to
    ``credit`` pieces in flight at once (asynchronous all-reduces), so that one piece's round trip and
    start-up hide behind the others' transfer; a new piece goes as soon as one completes, and it is
    again the input-most agreed one. Agreement is always by rounds then, on a process group of its own
    (``new_group``): a round runs while the pieces in flight keep the link busy, instead of queueing
    behind them on gloo's threads. Completions are taken in issue order.
    """

    def __init__(
        self, model: Any, lr: float, slice_bytes: int, agree_max_us: float = 3000.0, agree_rounds: bool | None = None,
        credit: int = 1,
    ) -> None:  # fmt: skip
        import torch
        import torch.distributed as dist

        if credit < 1:
            raise ValueError(f"P3Runtime: credit={credit}; expected >= 1 piece in flight")
        self.torch, self.dist = torch, dist
        self.credit = credit
        # credit > 1: the agreement rounds on a group of their own (every rank makes it, in the same order)
        self.agree_group = dist.new_group(backend="gloo") if credit > 1 else None
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.layers = [(name, m) for name, m in model.named_children() if any(True for _ in m.parameters())]
        self.opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for _, m in self.layers]
        self.slice_elems = max(1, slice_bytes // 4)
        # --- state shared with the communication thread (guarded by cond)
        self.cond = threading.Condition()
        self.queue: list[tuple[int, int, int, int]] = []  # (layer, slice, start, stop) in queue order
        self.sent: set[int] = set()
        self.flat: dict[int, Any] = {}  # layer -> flat gradient copy being reduced
        self.left: dict[int, int] = {}  # layer -> slices not yet reduced
        self.ready = [threading.Event() for _ in self.layers]
        self.total_steps = 0
        self.log: list[tuple[str, int, float, float]] | None = None  # ("slice"/"wait"/"round"/"queued", layer, t0, t1)
        self.stop = False
        self.error: BaseException | None = None
        # --- per-step bookkeeping on the main thread
        self.pending_grads: dict[int, int] = {}
        self.first_step = True
        for li, (_, m) in enumerate(self.layers):
            for p in m.parameters():
                p.register_post_accumulate_grad_hook(lambda _p, li=li: self._grad_ready(li))
            m.register_forward_pre_hook(lambda _m, _a, li=li: self._before_forward(li))
        # ``agree_rounds`` given: the caller decided (the validation harness, from its calibration, so that
        # prediction and run agree on the mode); else from this probe (the same everywhere: rank 0's)
        if credit > 1:
            self.agree_rounds = True
        else:
            self.agree_rounds = self._probe_round_trip_us() <= agree_max_us if agree_rounds is None else agree_rounds
        # (work, buffer, layer, start, stop, issued at) of the pieces in flight, oldest first (credit > 1)
        self.flying: collections.deque[tuple[Any, Any, int, int, int, float]] = collections.deque()
        loops = [self._comm_loop] if credit == 1 else [self._credit_loop, self._complete_loop]
        self.threads = [threading.Thread(target=f, daemon=True) for f in loops]
        for t in self.threads:
            t.start()

    # ---------------------------------------------------------------- main thread
    def begin_step(self) -> None:
        self.pending_grads = {li: sum(1 for _ in m.parameters()) for li, (_, m) in enumerate(self.layers)}

    def _grad_ready(self, li: int) -> None:
        self.pending_grads[li] -= 1
        if self.pending_grads[li]:
            return
        torch = self.torch
        params = list(self.layers[li][1].parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        n = flat.numel()
        with self.cond:
            if self.log is not None:
                now = time.perf_counter()
                self.log.append(("queued", li, now, now))
            self.flat[li] = flat
            starts = list(range(0, n, self.slice_elems))
            self.left[li] = len(starts)
            for j, s in enumerate(starts):
                self.queue.append((li, j, s, min(n, s + self.slice_elems)))
            self.cond.notify_all()

    def _before_forward(self, li: int) -> None:
        if self.first_step:
            return
        t0 = time.perf_counter()
        self.ready[li].wait()
        if self.log is not None:
            self.log.append(("wait", li, t0, time.perf_counter()))
        self._raise()
        self.ready[li].clear()
        params = list(self.layers[li][1].parameters())
        flat = self.flat.pop(li)
        off = 0
        for p in params:
            k = p.numel()
            p.grad = flat[off : off + k].view_as(p).div_(self.world)
            off += k
        self.opts[li].step()
        for p in params:  # this step's backward must not add to the averaged gradient just applied
            p.grad = None

    def end_step(self) -> None:
        self.first_step = False

    def drain(self) -> None:
        """Wait for the last step's slices and apply them; the next step starts afresh (its forward
        waits for nothing), e.g. after other work in between."""
        for li in range(len(self.layers)):
            self._before_forward(li)
        self.first_step = True

    def finish(self) -> None:
        """Wait for the last step's slices, apply them, stop the thread."""
        self.drain()
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"P3 communication thread failed: {self.error!r}")

    def _probe_round_trip_us(self) -> float:
        """Mean time of a tiny all-reduce, rank 0's measurement for everyone."""
        torch, dist = self.torch, self.dist
        x = torch.zeros(self.world)
        dist.all_reduce(x)
        t0 = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(x)
        us = torch.tensor([(time.perf_counter() - t0) / 10 * 1e6])
        dist.broadcast(us, 0)
        return float(us.item())

    # ---------------------------------------------------------------- communication thread
    def _comm_loop(self) -> None:
        torch, dist = self.torch, self.dist
        agreed = 0
        w = self.world
        try:
            while True:
                with self.cond:  # wait until this rank has an unsent slice (or is told to stop)
                    while len(self.sent) == len(self.queue):
                        if self.stop:
                            return
                        self.cond.wait()
                    progress = len(self.queue)
                if self.agree_rounds:
                    agreed = self._round(progress)
                with self.cond:
                    pick = self._agreed_pick(agreed)
                    if pick is None:  # piggyback mode, nothing agreed left: queue order (same on every rank)
                        pick = next(k for k in range(len(self.queue)) if k not in self.sent)
                    li, _, s, e = self.queue[pick]
                    flat = self.flat[li]
                n = e - s
                buf = torch.zeros(n + (0 if self.agree_rounds else w))
                buf[:n] = flat[s:e]
                if not self.agree_rounds:
                    buf[n + self.rank] = float(progress)
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                if self.log is not None:
                    self.log.append(("slice", li, t0, time.perf_counter()))
                if not self.agree_rounds:
                    agreed = int(buf[n:].min().item())
                with self.cond:
                    self.sent.add(pick)
                self._landed(li, s, e, buf[:n])
        except BaseException as exc:  # surfaced on the main thread
            self._fail(exc)

    def _agreed_pick(self, agreed: int) -> int | None:
        """The unsent piece among the first ``agreed`` queued (ready on every rank) of the input-most
        layer, the earliest queued of its pieces first; None if there is none. Under ``cond``."""
        cand = [k for k in range(min(agreed, len(self.queue))) if k not in self.sent]
        return min(cand, key=lambda k: (self.queue[k][0], k)) if cand else None

    def _round(self, progress: int) -> int:
        """One agreement round: every rank's queue length in, the smallest out."""
        counts = self.torch.zeros(self.world)
        counts[self.rank] = float(progress)
        t_round = time.perf_counter()
        self.dist.all_reduce(counts, group=self.agree_group)
        if self.log is not None:
            self.log.append(("round", -1, t_round, time.perf_counter()))
        return int(counts.min().item())

    def _credit_loop(self) -> None:
        """The issuing thread with ``credit`` pieces in flight (ByteScheduler). Every rank issues the same
        sequence of collectives: a round, then the input-most agreed unsent piece, again and again,
        whenever it has an unsent piece and fewer than ``credit`` in flight; the completions are taken
        by a thread of their own (``_complete_loop``), so a piece queued while others fly goes at once.
        When a rank takes them changes no choice (the rounds fix ``agreed``, the issues fix ``sent``)."""
        dist = self.dist
        try:
            while True:
                with self.cond:
                    while len(self.sent) == len(self.queue) or len(self.flying) >= self.credit:
                        if self.stop and len(self.sent) == len(self.queue):
                            return
                        self.cond.wait()
                    progress = len(self.queue)
                agreed = self._round(progress)
                with self.cond:
                    # every piece sent so far was agreed before, and this rank had more: one is left
                    pick = self._agreed_pick(agreed)
                    assert pick is not None
                    li, _, s, e = self.queue[pick]
                    buf = self.flat[li][s:e].clone()
                    self.sent.add(pick)
                    t0 = time.perf_counter()
                    self.flying.append((dist.all_reduce(buf, async_op=True), buf, li, s, e, t0))
                    self.cond.notify_all()
        except BaseException as exc:  # surfaced on the main thread
            self._fail(exc)

    def _complete_loop(self) -> None:
        """With ``credit`` > 1: wait for the pieces in flight in issue order and land them."""
        try:
            while True:
                with self.cond:
                    while not self.flying:
                        if self.stop:
                            return
                        self.cond.wait()
                    work, buf, li, s, e, t0 = self.flying[0]
                work.wait()
                if self.log is not None:
                    self.log.append(("slice", li, t0, time.perf_counter()))
                with self.cond:
                    self.flying.popleft()
                    self.cond.notify_all()
                self._landed(li, s, e, buf)
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        for ev in self.ready:
            ev.set()

    def _landed(self, li: int, s: int, e: int, buf: Any) -> None:
        """A piece's reduced values are back: into the layer's gradient copy; the layer is ready once
        all of its pieces are."""
        with self.cond:
            self.flat[li][s:e] = buf
            self.left[li] -= 1
            if self.left[li] == 0:
                self.ready[li].set()


def loop_ms(net: Any, batch: Any, loss_fn: Any, lr: float, warmup: int, steps: int) -> list[float]:
    """Step times (ms) of the plain training loop on ``net`` after ``warmup`` steps (``loop_marks``)."""
    marks = loop_marks(net, batch, loss_fn, lr, warmup, steps)
    return [(b - a) * 1e3 for a, b in itertools.pairwise(marks)][warmup:]


def _ddp_steps(net: Any, opt: Any, batch: Any, loss_fn: Any, warmup: int, steps: int, rank: int, first: int = 0) -> list[float]:
    """Run ``warmup + steps + 1`` training steps of ``net`` (DDP around a module); return each step's
    start. ``first``: the first step's number (each rank's data is ``batch(step * 1000 + rank)``)."""
    data = (step * 1000 + rank for step in range(first, first + warmup + steps + 1))
    return step_starts(net, opt, batch, loss_fn, data)


def _p3_steps(
    rt: P3Runtime, model: Any, batch: Any, loss_fn: Any, warmup: int, steps: int, rank: int, trace: bool,
    first: int = 0,
) -> list[float]:  # fmt: skip
    """Run ``warmup + steps + 1`` training steps through the P3 runtime, numbered from ``first``; return
    each step's start."""
    starts = []
    for step in range(first, first + warmup + steps + 1):
        starts.append(time.perf_counter())
        if step == first + warmup and trace:
            rt.log = []
        x, y = batch(step * 1000 + rank)
        rt.begin_step()
        for p in model.parameters():
            p.grad = None
        loss = loss_fn(model(x), y)
        loss.backward()
        rt.end_step()
        loss.detach().item()
    return starts


def runtime_overhead(
    model: Any, batch: Any, loss_fn: Any, lr: float, warmup: int, steps: int, slice_bytes: int
) -> dict[str, Any]:
    """The host work per step that DDP and the P3 runtime add to the plain loop, measured in one process
    (a process group of one rank): ``ddp_overhead`` for both."""
    out = ddp_overhead(model, batch, loss_fn, lr, warmup, steps)
    p3: list[float] = []
    plain: list[float] = []
    for _ in range(2):
        plain += loop_ms(model, batch, loss_fn, lr, warmup, steps)
        rt = P3Runtime(model, lr, slice_bytes)
        starts = _p3_steps(rt, model, batch, loss_fn, warmup, steps, 0, False)
        rt.finish()
        p3 += [(b - a) * 1e3 for a, b in itertools.pairwise(starts)][warmup:]
        for m in model.modules():  # the runtime's hooks stay on the module: drop them before the next pass
            m._forward_pre_hooks.clear()
        for q in model.parameters():
            q._post_accumulate_grad_hooks = None
    p, d = statistics.median(plain), statistics.median(p3)
    return {**out, "p3_ms": d, "p3_plain_ms": p, "p3_overhead_ms": max(0.0, d - p)}


def alternating_ms(nets: dict[str, Any], batch: Any, loss_fn: Any, lr: float, warmup: int, steps: int) -> dict[str, float]:
    """Median step time (ms) of the plain training loop on each of ``nets``, their steps alternated one
    by one (after ``warmup`` steps of each): ``2 * steps`` rounds of one step per net, in turn forwards
    and backwards (a b, b a, ...), so that each round's steps see the same moment of the host's load.
    With two nets also ``diff_ms``: the median over the rounds of (second net's step - first's).

    The paired difference is what the callers want (a runtime's own cost per step) and it keeps a burst
    of load on a shared host out: on the 2-vCPU VM, alternating blocks of 12 steps read DDP's own work
    on the mlp at 1.9-5.6 ms per step within one hour (2026-11-24), a block of DDP or of plain steps
    sometimes falling into a slow second alone."""
    import torch

    keys = list(nets)
    opts = {k: torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9) for k, net in nets.items()}
    for k in keys:
        step_starts(nets[k], opts[k], batch, loss_fn, range(warmup))
    times: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(2 * steps):
        for k in keys if i % 2 == 0 else keys[::-1]:
            t0 = time.perf_counter()
            step_starts(nets[k], opts[k], batch, loss_fn, [warmup + i])
            times[k].append((time.perf_counter() - t0) * 1e3)
    out = {k: float(statistics.median(v)) for k, v in times.items()}
    if len(keys) == 2:
        a, b = (times[k] for k in keys)
        out["diff_ms"] = float(statistics.median(y - x for x, y in zip(a, b, strict=True)))
    return out


def ddp_overhead(model: Any, batch: Any, loss_fn: Any, lr: float, warmup: int, steps: int) -> dict[str, Any]:
    """DDP's own host cost per step, measured in one process (a process group of one rank).

    DDP adds work that the plain loop's profile does not have: autograd hooks per parameter, copying
    gradients into bucket buffers and back, the reducer's bookkeeping, the buffer sync before forward.
    With one rank its collectives have nobody to talk to, so ``DDP step - plain step`` is that host
    work (``alternating_ms``); returns the medians, the paired difference (``overhead_ms``, at least
    0) and the part of it after the last bucket's collective (``finalize_ms``, ``ddp_finalize_ms``, at
    most ``overhead_ms``).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    t = alternating_ms({"plain_ms": model, "ddp_ms": DDP(model)}, batch, loss_fn, lr, warmup, steps)
    fin = ddp_finalize_ms(copy.deepcopy(model), batch, loss_fn, lr, warmup, steps)
    return {"plain_ms": t["plain_ms"], "ddp_ms": t["ddp_ms"], "overhead_ms": max(0.0, t["diff_ms"]),
            "finalize_ms": min(fin, max(0.0, t["diff_ms"]))}  # fmt: skip


def ddp_finalize_ms(model: Any, batch: Any, loss_fn: Any, lr: float, warmup: int, steps: int) -> float:
    """The part of DDP's own work that comes after its last bucket's collective, measured in one
    process: the median time from the last bucket's future completing to ``backward()`` returning.

    The reducer waits for every bucket's future, then copies each reduced bucket back into the
    parameters' ``.grad`` (``Reducer::finalize_backward``) on the thread that called ``backward()``,
    so this work follows the last transfer, wherever it ends, and delays the optimizer step by itself.
    A comm hook that all-reduces as DDP does notes when its future completes."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    done_at = [0.0]

    def hook(_: Any, bucket: Any) -> Any:
        def done(fut: Any) -> Any:
            done_at[0] = time.perf_counter()
            return fut.value()[0]

        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(done)

    hook.__annotations__ = {}  # DDP checks annotations as objects; these are strings here
    net = DDP(model)
    net.register_comm_hook(None, hook)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    out: list[float] = []
    for i in range(warmup + steps):
        x, y = batch(i)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        if i >= warmup:
            out.append((time.perf_counter() - done_at[0]) * 1e3)
        opt.step()
    return max(0.0, float(statistics.median(out)))


def main(cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.models.zoo import ZooSpec, build_with_batches

    torch.set_num_threads(int(cfg.get("threads", 1)))
    spec = ZooSpec(batch_size=int(cfg.get("batch_size", 32)), width=int(cfg.get("width", 1024)),
                   depth=int(cfg.get("depth", 4)))  # fmt: skip
    model, batch = build_with_batches(cfg["model"], seed=int(cfg.get("seed", 0)), spec=spec)
    loss_fn = torch.nn.CrossEntropyLoss()
    lr = float(cfg.get("lr", 0.01))
    mode = cfg.get("mode", "ddp")
    warmup, steps = int(cfg.get("warmup", 3)), int(cfg.get("steps", 6))
    dist.init_process_group("gloo")
    if mode == "overhead":  # one process: DDP's own host cost per step (see ``ddp_overhead``)
        slice_bytes = int(cfg.get("slice_bytes", 256 * 1024))
        print(json.dumps(runtime_overhead(model, batch, loss_fn, lr, warmup, steps, slice_bytes)), flush=True)
        dist.destroy_process_group()
        return
    rank = dist.get_rank()
    extra: dict[str, Any] = {}
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, bucket_cap_mb=float(cfg.get("bucket_cap_mb", 25.0)))
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        starts = _ddp_steps(net, opt, batch, loss_fn, warmup, steps, rank)
        data = net._get_ddp_logging_data()
        extra.update({k: data.get(k) for k in ("rebuilt_bucket_sizes", "rebuilt_per_bucket_param_indices")})
    elif mode in ("p3", "bytescheduler"):
        # same initial weights on every rank (DDP broadcasts them; here rank 0's are broadcast once)
        for p in model.parameters():
            dist.broadcast(p.data, 0)
        rounds = cfg.get("agree_rounds")
        if mode == "p3":
            rt = P3Runtime(model, lr, int(cfg.get("slice_bytes", 256 * 1024)), float(cfg.get("agree_max_us", 3000.0)),
                           None if rounds is None else bool(rounds))  # fmt: skip
        else:  # ByteScheduler: bigger pieces, several in flight
            rt = P3Runtime(model, lr, int(cfg.get("partition_bytes", BS_PARTITION_BYTES)),
                           credit=int(cfg.get("credit", BS_CREDIT)))  # fmt: skip
        starts = _p3_steps(rt, model, batch, loss_fn, warmup, steps, rank, bool(cfg.get("trace")))
        rt.finish()
        extra["p3_agreement_rounds"] = rt.agree_rounds
        if rt.log is not None:  # --- timeline of the measured steps, relative to their first start
            t_ref = starts[warmup]
            extra["p3_log"] = [(k, li, round((a - t_ref) * 1e3, 3), round((b - t_ref) * 1e3, 3)) for k, li, a, b in rt.log]
            extra["step_starts_ms"] = [round((t - t_ref) * 1e3, 3) for t in starts[warmup:]]
            extra["t_ref_s"] = t_ref  # time.perf_counter (CLOCK_MONOTONIC: one clock for every rank on a host)
    else:
        raise SystemExit(f"dp_worker: unknown mode {mode!r}")
    step_ms = [(b - a) * 1e3 for a, b in itertools.pairwise(starts)][warmup:]
    t = torch.tensor(step_ms, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    # every rank must hold the same weights after training: a check that gradients were synchronised
    check = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64)
    both = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(both, check)
    in_sync = all(abs(float(b) - float(check)) <= 1e-6 * max(1.0, abs(float(check))) for b in both)
    if rank == 0 or "p3_log" in extra:  # traced: every rank's timeline (its own stdout)
        print(json.dumps({"step_ms": t.tolist(), "params_in_sync": in_sync, "param_sum": float(check), **extra}),
              flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2 or "RANK" not in os.environ:
        print("usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python -m trainsim.validate.dp_worker JSON")
        sys.exit(2)
    main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: gloo/DDP threads can abort in static destructors after the work is done
