"""One rank of a supervised, checkpointed data-parallel job (started by ``trainsim.run.elastic.supervise``).

    $ python -m trainsim.run.elastic_worker --rank 0 --master 127.0.0.1 --port 29500 \
        --out ev-a0-r0.jsonl --config '{"world": 2, "steps": 40, "attempt": 0, ...}'

(``trainsim.run.ranks.rank_main``'s protocol: the events go to ``--out``.)

Algorithm (each attempt, each rank):

1. Join the gloo process group through the supervisor's TCP store (already listening: no connect
   retries, whose back-off made the join take 0.01-0.7 s when rank 0 hosted it), with a timeout on
   every collective; build the zoo model, wrap it in DDP and make the optimizer.
2. Restore the newest checkpoint of ``checkpoint_dir`` if there is one (model, optimizer, RNG, next
   step); else start at step 0.
3. Train up to ``steps``; step ``i`` uses batch ``rank * 100_003 + i`` whatever the attempt, so a
   restarted job recomputes exactly what the failed one had done. After step ``i`` with
   ``(i + 1) % checkpoint_every == 0`` rank 0 writes a checkpoint atomically (the others wait for it in
   the next step's all-reduce: a write stalls the job, as ``plan.goodput`` assumes).
4. Fault injection: on attempt 0, rank ``kill_rank`` sends itself ``kill_signal`` at the start of step
   ``kill_step``: SIGKILL (no clean-up: its sockets close, what a crashed process looks like to its
   peers) or SIGSTOP (its sockets stay open and silent, what a hung host looks like).
5. A survivor's collective that fails (the peer's socket closed, or the collective timeout) ends the
   rank with ``PeerLost`` on stderr, naming the step, how long the collective waited and the timeout,
   and exit code ``EXIT_PEER_LOST``; never a hang past the timeout.

Every event is one JSON line, flushed at once, ``{"ev": ..., "t": time.monotonic(), ...}`` (Linux's
CLOCK_MONOTONIC is one clock for all processes of the host, so the supervisor can subtract them):
``up`` (interpreter up, torch imported), ``imported``, ``joined`` (process group), ``ready`` (process group, model, DDP), ``restored`` (with
``step``: the first step to run), ``step`` (with ``i``: a step starts), ``ckpt`` (with ``i`` and
``write_s``), ``kill``, ``done`` (with ``digest`` of the final weights), ``error`` (with ``msg``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Any


class PeerLost(RuntimeError):
    """A collective failed: a peer closed its connections or did not answer within the timeout."""


class _Events:
    def __init__(self, path: str) -> None:
        self._f: IO[str] = open(path, "a", buffering=1)  # one line per event, kept open

    def __call__(self, ev: str, **kw: Any) -> None:
        self._f.write(json.dumps({"ev": ev, "t": time.monotonic(), **kw}) + "\n")


def run_rank(rank: int, master: str, port: int, attempt: int, cfg: dict[str, Any], events: str) -> None:
    emit = _Events(events)
    import torch

    emit("up")
    import torch.distributed as dist

    torch.set_num_threads(1)

    from trainsim.capture.profile import make_optimizer
    from trainsim.models import zoo
    from trainsim.run import elastic
    from trainsim.run.ranks import pin_to_core

    world, steps, every = cfg["world"], cfg["steps"], cfg["checkpoint_every"]
    emit("imported")
    if cfg["pin"]:
        pin_to_core(rank)
    timeout = timedelta(seconds=cfg["collective_timeout_s"])
    store = dist.TCPStore(master, port, world, is_master=False, timeout=timeout)  # the supervisor's
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    emit("joined")
    spec = zoo.ZooSpec(batch_size=cfg["batch_size"], width=cfg["width"], depth=cfg["depth"])
    model, batch = zoo.build_with_batches(cfg["model"], seed=cfg["seed"], spec=spec)
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = make_optimizer(cfg["optimizer"], net.parameters(), 0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    ckpt_dir = Path(cfg["checkpoint_dir"])
    emit("ready")
    first = 0
    path = elastic.latest_checkpoint(ckpt_dir)
    if path is not None:
        first = elastic.restore_state(model, opt, elastic.load_checkpoint(path))
    emit("restored", step=first)
    kill_here = attempt == 0 and cfg["kill_rank"] == rank
    for i in range(first, steps):
        emit("step", i=i)
        if kill_here and i == cfg["kill_step"]:
            emit("kill", i=i)
            os.kill(os.getpid(), getattr(signal, cfg["kill_signal"]))
        x, y = batch(rank * 100_003 + i)
        opt.zero_grad(set_to_none=True)
        t0 = time.monotonic()
        try:
            loss = loss_fn(net(x), y)
            loss.backward()  # DDP's all-reduce: where a dead peer shows
        except RuntimeError as exc:
            raise PeerLost(
                f"rank {rank}: the all-reduce of step {i} failed after {time.monotonic() - t0:.3f} s "
                f"(collective timeout {cfg['collective_timeout_s']:g} s); a peer of the {world} ranks is gone: "
                + " ".join(str(exc).split())[:300]
            ) from None
        opt.step()
        if rank == 0 and (i + 1) % every == 0:
            t0 = time.monotonic()
            elastic.save_checkpoint(ckpt_dir, elastic.checkpoint_state(model, opt, i + 1))
            emit("ckpt", i=i + 1, write_s=time.monotonic() - t0)
    digest = float(sum(float(p.detach().double().sum()) for p in model.parameters()))
    dist.barrier()
    emit("done", digest=digest)
    dist.destroy_process_group()


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    """``rank_main``'s body: attempt ``cfg["attempt"]``, events to ``out``."""
    try:
        run_rank(rank, master, port, int(cfg["attempt"]), cfg, out)
    except PeerLost as exc:
        _Events(out)("error", msg=str(exc))
        print(f"PeerLost: {exc}", file=sys.stderr, flush=True)
        from trainsim.run.elastic import EXIT_PEER_LOST

        # leave at once: a normal exit tears the broken process group down first (1.5 s on the 2-core VM)
        os._exit(EXIT_PEER_LOST)


if __name__ == "__main__":
    from trainsim.run.ranks import rank_main

    rank_main(_rank, "one rank of trainsim.run.elastic (started by supervise)")
