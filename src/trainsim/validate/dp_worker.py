"""One rank of a real data-parallel training run (started by ``trainsim validate dp``, one per namespace).

    $ RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... \\
      python -m trainsim.validate.dp_worker --config '{"model": "mlp", "mode": "ddp", "steps": 6, "warmup": 3}'

(``testbed.launch.run_json`` starts it so; ``trainsim.run.ranks.rank_main``'s protocol.)

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
  SGD update (``trainsim.run.p3.P3Runtime``).
- ``bytescheduler``: the same runtime with ByteScheduler's partitions and credit (Peng et al., SOSP'19):
  ``partition_bytes`` pieces (default 4 MB), up to ``credit`` (4) all-reduces in flight at once.

Prints one JSON line on rank 0: ``{"step_ms": [...], ...}`` (wall time between consecutive step starts).
With ``"trace": true`` the p3 and bytescheduler modes add ``p3_log``: ``(kind, layer, start ms, end ms)`` of every slice
all-reduce (``"slice"``) and every wait of a forward for its layer's slices (``"wait"``), relative to
the first measured step's start, and ``step_starts_ms``; every rank then prints its own line.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import time
from typing import Any

from trainsim.run.p3 import P3Runtime
from trainsim.run.ranks import loop_marks, rank_main, slowest_and_in_sync, step_starts, write_result
from trainsim.transform.scheduling import BYTESCHEDULER_CREDIT as BS_CREDIT
from trainsim.transform.scheduling import BYTESCHEDULER_PARTITION_BYTES as BS_PARTITION_BYTES


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


def main(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
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
        write_result(out, runtime_overhead(model, batch, loss_fn, lr, warmup, steps, slice_bytes))
        dist.destroy_process_group()
        return
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
    slowest, in_sync, param_sum = slowest_and_in_sync(step_ms, model)
    if rank == 0 or "p3_log" in extra:  # traced: every rank's timeline (its own stdout)
        write_result(out, {"step_ms": slowest, "params_in_sync": in_sync, "param_sum": param_sum, **extra})
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(main, "one rank of a real data-parallel run (started by trainsim validate dp)")
