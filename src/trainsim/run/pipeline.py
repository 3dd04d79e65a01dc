"""Pipeline parallelism for real: a zoo model split into stages, torch.distributed.pipelining on gloo.

    >>> from trainsim.run.pipeline import PipeRunConfig, run_pipeline
    >>> cfg = PipeRunConfig(model="transformer", schedule="ZBVZeroBubble", stages_per_rank=2,
    ...                     microbatches=4, split=(2, 1, 1, 3), blocks=4)          # doctest: +SKIP
    >>> run_pipeline(cfg)["step_ms"]                                               # doctest: +SKIP

Each rank builds the same model (same seed), keeps the stages that the schedule's stage-to-rank
mapping gives it (``loop``: stage s on rank s mod R; ``v``: 0,1,..,R-1,R-1,..,0), wraps them in
``PipelineStage`` and runs them with torch's ``_PipelineScheduleRuntime`` loaded with the compute
order of torch's own schedule class (``trainsim.transform.pipeline.make_runtime``). The simulator
replays the lowered form of that same order, so both execute one list of actions; each worker
returns the list it ran so that tests can check it. Bad input (empty stage, a split that does not
cover the model, microbatches not dividing the batch, too few stages per rank) is refused before
any process starts; a crashed rank stops the run with ``RankFailed`` naming it.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import UserError
from trainsim.run.ranks import (
    Popen,
    ThreadClock,
    init_gloo,
    local_popen,
    rank_main,
    run_workers,
    segments,
    slowest_rank_steps,
    window_step_ms,
)
from trainsim.transform.pipeline import PipeSpec, check_split


@dataclass(frozen=True, kw_only=True, slots=True)
class PipeRunConfig:
    """One real pipeline-parallel run."""

    model: str = "transformer"
    schedule: str = "1F1B"
    n_ranks: int = 2
    stages_per_rank: int = 1
    microbatches: int = 4
    batch_size: int = 32
    """global batch per step, split into ``microbatches``"""
    split: tuple[int, ...] = ()
    """layers per stage (first stage first); empty = equal layer counts, remainder to the last"""
    blocks: int = 2
    """encoder blocks (transformer) / linear layers (mlp, as depth)"""
    steps: int = 10
    warmup: int = 2
    lr: float = 0.01
    seed: int = 0
    timeout_s: float = 120.0
    crash_rank: int = -1
    """fault injection for tests: this rank exits with code 3 at step 1"""
    hollow: bool = False
    """the zoo's hollow transformer (``ZooSpec.hollow``): the runtime's own costs, almost no compute"""
    pin: bool = False
    """keep each rank, and the threads gloo starts for it, on one core (``run.ranks.pin_to_core``)"""
    def __post_init__(self) -> None:
        object.__setattr__(self, "split", tuple(self.split))
        if self.hollow and self.model != "transformer":
            raise UserError(f"hollow=True needs the transformer; got model {self.model!r}")
        if self.batch_size < 1 or self.steps < 1 or self.warmup < 0:
            raise UserError(
                f"batch_size={self.batch_size}, steps={self.steps}, warmup={self.warmup}; expected positive "
                "(warmup >= 0)"
            )
        spec = self.pipe_spec()  # validates schedule, stages per rank, microbatches
        if self.batch_size % self.microbatches:
            raise UserError(
                f"--microbatches {self.microbatches} does not divide the batch size {self.batch_size}"
            )
        self.layers(spec)

    def pipe_spec(self) -> PipeSpec:
        return PipeSpec(
            schedule=self.schedule,
            n_ranks=self.n_ranks,
            stages_per_rank=self.stages_per_rank,
            microbatches=self.microbatches,
        )

    def zoo_spec(self, batch_size: int | None = None) -> Any:
        from trainsim.models.zoo import ZooSpec

        kw: dict[str, Any] = {"batch_size": batch_size or self.batch_size}
        kw["blocks" if self.model == "transformer" else "depth"] = self.blocks
        if self.hollow:
            kw["hollow"] = True
        return ZooSpec(**kw) if self.model in ("transformer", "mlp") else ZooSpec(batch_size=kw["batch_size"])

    def layers(self, spec: PipeSpec | None = None) -> list[list[int]]:
        """Layer indices of every stage (validated)."""
        spec = spec or self.pipe_spec()
        n = n_layers(self.model, self.zoo_spec(1))
        sizes = list(self.split) or even_split(n, spec.n_stages)
        return check_split(sizes, n, spec.n_stages)


def n_layers(model: str, zoo_spec: Any) -> int:
    from trainsim.models.zoo import build

    m, _ = build(model, spec=zoo_spec)
    return len(list(m.children()))


def even_split(n: int, stages: int) -> list[int]:
    if stages > n:
        raise UserError(f"{stages} stages but the model has only {n} layers; a stage would be empty")
    base = [n // stages] * stages
    base[-1] += n - sum(base)
    return base


def _worker(cfg: PipeRunConfig, rank: int, master: str, port: int, out: Path) -> None:

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage

    from trainsim.models.zoo import build_with_batches
    from trainsim.transform.pipeline import make_runtime

    spec = cfg.pipe_spec()
    pin_error = init_gloo(rank, cfg.n_ranks, master, port, cfg.timeout_s, pin=cfg.pin)
    model, batches = build_with_batches(cfg.model, seed=cfg.seed, spec=cfg.zoo_spec())
    children = list(model.children())
    s2r = spec.stage_to_rank()
    mine = [s for s in range(spec.n_stages) if s2r[s] == rank]
    mods = {s: nn.Sequential(*[children[i] for i in cfg.layers(spec)[s]]) for s in mine}
    stages = [PipelineStage(mods[s], s, spec.n_stages, torch.device("cpu")) for s in mine]
    inside = _time_stage_calls(stages)  # wall time spent in the stages' compute calls, per kind
    p2p: dict[str, float] = {}
    p2p_ops: dict[str, float] = {}  # operations posted, by kind
    _time_p2p_calls(p2p, p2p_ops)  # and in posting and waiting for the runtime's transfers
    p2p_ms: dict[str, float] = {}
    ops: dict[str, float] = {}
    rt = make_runtime(stages, spec, nn.CrossEntropyLoss())
    params = [p for s in mine for p in mods[s].parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    has_first, has_last = 0 in mine, spec.n_stages - 1 in mine
    losses: list[float] = []
    step_ms: list[float] = []
    cpu_ms: list[float] = []  # process CPU time (all threads: compute and gloo's)
    main_ms: list[float] = []  # this (the compute) thread's CPU time
    clock = ThreadClock()  # every thread's CPU and run-queue wait over the measured steps
    inside_ms: dict[str, float] = {}
    faults: dict[str, int] = {}  # page faults and involuntary context switches over the measured steps
    parts: dict[str, float] = {}  # seconds in the runtime's step call and in the optimizer update
    parts_ms: dict[str, float] = {}
    step = 0

    def pipeline_step() -> None:
        nonlocal step
        if step == 1 and rank == cfg.crash_rank:
            os._exit(3)
        x, y = batches(step)
        mb_losses: list[torch.Tensor] = []
        args = (x,) if has_first else ()
        kw: dict[str, Any] = {"target": y, "losses": mb_losses} if has_last else {}
        t0 = time.perf_counter()
        rt.step(*args, **kw)
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        parts["runtime"] = parts.get("runtime", 0.0) + t1 - t0
        parts["optimizer"] = parts.get("optimizer", 0.0) + t2 - t1
        if has_last:
            losses.append(float(torch.stack(mb_losses).mean()))
        step += 1

    for warm, n in segments(cfg.steps, cfg.warmup, 0):
        for _ in range(warm):
            pipeline_step()
        inside.clear()
        parts.clear()
        p2p.clear()
        p2p_ops.clear()
        stamps = [(time.perf_counter(), time.process_time(), time.thread_time())]
        use0 = resource.getrusage(resource.RUSAGE_SELF)
        clock.start()
        for _ in range(n):
            pipeline_step()
            stamps.append((time.perf_counter(), time.process_time(), time.thread_time()))
        clock.stop()
        use1 = resource.getrusage(resource.RUSAGE_SELF)
        for k, a, b in (("minor_faults", use0.ru_minflt, use1.ru_minflt), ("major_faults", use0.ru_majflt, use1.ru_majflt),
                        ("involuntary_switches", use0.ru_nivcsw, use1.ru_nivcsw)):  # fmt: skip
            faults[k] = faults.get(k, 0) + b - a
        for total, part, scale in ((inside_ms, inside, 1e3), (parts_ms, parts, 1e3), (p2p_ms, p2p, 1e3),
                                   (ops, p2p_ops, 1.0)):  # fmt: skip
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + scale * v
        for out_list, j in ((step_ms, 0), (cpu_ms, 1), (main_ms, 2)):
            out_list += [1e3 * (b[j] - a[j]) for a, b in itertools.pairwise(stamps)]
    dist.barrier()
    out.write_text(
        json.dumps(
            {
                "rank": rank,
                "stages": mine,
                "losses": losses,
                "step_ms": step_ms,
                "cpu_ms": cpu_ms,
                "main_thread_cpu_ms": main_ms,
                "compute_ms_per_step": {k: v / cfg.steps for k, v in inside_ms.items()},
                "p2p_ms_per_step": {k: v / cfg.steps for k, v in p2p_ms.items()},
                "p2p_ops_per_step": {k: v / cfg.steps for k, v in ops.items()},
                "step_parts_ms_per_step": {k: v / cfg.steps for k, v in parts_ms.items()},
                "rusage_per_step": {k: v / cfg.steps for k, v in faults.items()},
                "threads": clock.per_step(cfg.steps),
                "order": [str(a) for a in rt.pipeline_order_with_comms[rank]],
                "cores": sorted(os.sched_getaffinity(0)),
                "pin_error": pin_error,
            }
        )
    )
    dist.destroy_process_group()


def _time_stage_calls(stages: list[Any]) -> dict[str, float]:
    """Wrap each stage's forward / backward / weight-gradient call with timers; the returned dict
    accumulates seconds of wall time per call kind (``F``, ``B``, ``W``: what the rank spent computing,
    as opposed to posting, waiting for and finishing transfers) and of the calling thread's CPU time
    (``cpu:F`` ...; below the wall time when the thread waited for a core)."""
    acc: dict[str, float] = {}
    for st in stages:
        for kind, attr in (("F", "forward_one_chunk"), ("B", "backward_one_chunk"), ("W", "backward_weight_one_chunk")):
            setattr(st, attr, _timed(getattr(st, attr), kind, acc))
    return acc


def _timed(fn: Any, key: str, acc: dict[str, float]) -> Any:
    """``fn`` wrapped to add its wall time to ``acc[key]`` and the calling thread's CPU time in it to
    ``acc["cpu:" + key]`` (seconds)."""

    def call(*a: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
            acc["cpu:" + key] = acc.get("cpu:" + key, 0.0) + time.thread_time() - c0

    return call


def _time_p2p_calls(acc: dict[str, float], ops: dict[str, float]) -> None:
    """Accumulate into ``acc`` the wall time the runtime spends posting its sends and receives
    (``post``; ``cpu:post``, the thread's CPU time in it) and waiting for them (``wait``), by wrapping
    the two module-level helpers that ``torch.distributed.pipelining.schedules`` calls for every
    transfer (``_batch_p2p``, ``_wait_batch_p2p``); nothing when a torch release lacks them. The
    posting is also split by what a batch posts: ``post:send``, ``post:recv`` (``post:send+recv`` for a
    batch of both), and ``ops`` counts the operations posted by the same kinds: what a post costs differs
    between sends and receives and from one schedule to another (docs/ooo.md, "Posting by kind")."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    post, wait = getattr(schedules, "_batch_p2p", None), getattr(schedules, "_wait_batch_p2p", None)
    if post is None or wait is None:
        return

    def post_by_kind(p2p_ops: list[Any], desc: str | None = None) -> Any:
        sends = sum(o.op is dist.isend for o in p2p_ops)
        kind = "+".join(k for k, n in (("send", sends), ("recv", len(p2p_ops) - sends)) if n)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return post(p2p_ops, desc)
        finally:
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            if p2p_ops:
                for key, v in (("post", wall), ("cpu:post", cpu), ("post:" + kind, wall)):
                    acc[key] = acc.get(key, 0.0) + v
                ops[kind] = ops.get(kind, 0.0) + len(p2p_ops)

    schedules._batch_p2p = post_by_kind
    schedules._wait_batch_p2p = _timed(wait, "wait", acc)


def run_pipeline(
    cfg: PipeRunConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1", port: int | None = None
) -> dict[str, Any]:
    """Run ``cfg`` on ``n_ranks`` processes; per-rank results and the time per step over the measured
    window (ms; ``window_step_ms``), with the median and minimum of the slowest rank's steps."""
    ranks = run_workers("trainsim.run.pipeline", cfg, cfg.n_ranks, popen=popen, master=master, port=port,
                        timeout_s=3 * cfg.timeout_s)  # fmt: skip
    per_step = slowest_rank_steps(ranks, cfg.steps)
    losses = next(r["losses"] for r in ranks if r["losses"])
    return {
        "config": asdict(cfg),
        "step_ms": window_step_ms(ranks, cfg.steps),
        "step_median_ms": statistics.median(per_step),
        "step_min_ms": min(per_step),
        "ranks": ranks,
        "losses": losses,
        "split": cfg.layers(),
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class ExchangeConfig:
    """A generic exchange of one message size between two ranks (no model, no schedule): what torch's
    pipeline runtime does for each SEND and RECV action, timed apart from the posting call itself."""

    size_bytes: int
    messages: int = 120
    warmup: int = 20
    pin: bool = True
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.size_bytes < 4 or self.messages < 1 or self.warmup < 0:
            raise UserError(f"exchange: size_bytes={self.size_bytes}, messages={self.messages}, warmup={self.warmup}; "
                            "expected >= 4, >= 1, >= 0")  # fmt: skip


def run_exchange(cfg: ExchangeConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1",
                 port: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``cfg`` on two ranks; per action kind (``send``, ``recv``) the median over the measured
    messages of the runtime's own work per action outside posting (``book_us``) and of posting it
    (``post_us``), the mean of the two ranks, and each rank's record."""
    ranks = run_workers("trainsim.run.pipeline", cfg, 2, popen=popen, master=master, port=port,
                        timeout_s=3 * cfg.timeout_s)  # fmt: skip
    out: dict[str, Any] = {"ranks": ranks}
    for kind in ("send", "recv"):
        for part in ("book_us", "post_us"):
            out[f"{kind}_{part}"] = statistics.fmean(statistics.median(r[kind][part]) for r in ranks)
    return out


def _exchange_worker(cfg: ExchangeConfig, rank: int, master: str, port: int, out: Path) -> None:
    """Per message: this rank posts a RECV action, then a SEND action of the same size to its peer, as
    the runtime's ``_perform_action`` does (its profiler range named after the action, the stage's
    operation list built, ``schedules._batch_p2p`` posting it, the work handles kept); it waits for the
    receive before the next message (the runtime waits before the compute that consumes it) and for
    its sends at the end (as the runtime does at the end of its step)."""
    import torch
    import torch.distributed as dist
    from torch.autograd.profiler import record_function
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    pin_error = init_gloo(rank, 2, master, port, cfg.timeout_s, pin=cfg.pin)
    peer = 1 - rank
    n = cfg.size_bytes // 4
    x, buf = torch.ones(n), torch.empty(n)
    recv_kind, send_kind = (_ComputationType.RECV_B, _ComputationType.SEND_F) if rank == 0 else (
        _ComputationType.RECV_F, _ComputationType.SEND_B)  # fmt: skip
    name = getattr(schedules, "_get_profiler_function_name", str)
    times: dict[str, dict[str, list[float]]] = {k: {"book_us": [], "post_us": []} for k in ("send", "recv")}
    recv_works: dict[tuple[int, int], list[Any]] = {}
    send_works: list[list[Any]] = []

    def action(kind: Any, mb: int, build: Any, keep: Any, label: str, measured: bool) -> None:
        a = _Action(rank, kind, mb)
        t0 = time.perf_counter()
        with record_function(name(a)):
            ops = build()
            t1 = time.perf_counter()
            works = schedules._batch_p2p(ops)
            t2 = time.perf_counter()
            keep(a, works)
        t3 = time.perf_counter()
        if measured:
            times[label]["book_us"].append(1e6 * ((t1 - t0) + (t3 - t2)))
            times[label]["post_us"].append(1e6 * (t2 - t1))

    for i in range(cfg.warmup + cfg.messages):
        measured = i >= cfg.warmup
        action(recv_kind, i, lambda: [dist.P2POp(dist.irecv, buf, peer, None)],
               lambda a, w: recv_works.__setitem__((a.stage_index, a.microbatch_index), w), "recv", measured)  # fmt: skip
        action(send_kind, i, lambda: [dist.P2POp(dist.isend, x.detach(), peer, None)],
               lambda a, w: send_works.append(w), "send", measured)  # fmt: skip
        schedules._wait_batch_p2p(recv_works.pop((rank, i)))
    while send_works:
        schedules._wait_batch_p2p(send_works.pop())
    dist.barrier()
    out.write_text(json.dumps({"rank": rank, "pin_error": pin_error, **times}))
    dist.destroy_process_group()


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    if "size_bytes" in cfg:  # run_exchange's generic exchange
        _exchange_worker(ExchangeConfig(**cfg), rank, master, port, Path(out))
        return
    _worker(PipeRunConfig(**{**cfg, "split": tuple(cfg.get("split", ()))}), rank, master, port, Path(out))


if __name__ == "__main__":
    rank_main(_rank, "one rank of a trainsim pipeline run (started by run_pipeline)")
