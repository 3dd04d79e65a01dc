"""Real data-parallel training runs, profiled on every rank: the raw material of what-if pairs.

    >>> from trainsim.run.traced import TracedRunConfig, traced_run
    >>> res = traced_run(TracedRunConfig(model="mlp", world=2, rate_mbit=100), "out/run-a")  # doctest: +SKIP
    >>> res["step_ms"], res["traces"]                                                       # doctest: +SKIP

Each rank is one process with one intra-op thread: torch DDP over gloo (no DDP when ``world`` is 1)
around a zoo model, the optimizer of ``trainsim.capture.profile``, ``warmup`` steps, then ``steps``
timed steps *without* the profiler (what the user's job experiences), then ``profiled`` steps under
``torch.profiler`` whose Kineto trace each rank writes to ``<out>/rank<R>.json.gz`` (with the
parameter sidecar of ``trainsim.capture.profile`` beside it). With ``rate_mbit`` the ranks run where
``network`` puts them (the test bed's shaped namespaces: ``trainsim.testbed.netns.shaped_ranks``, needs
root); without it, on loopback.

The result (``traced_run``) is a dict: ``step_ms`` (per timed step, the slowest rank's time over the
window, as ``run.ranks.window_step_ms``), ``rank_step_ms`` (each rank's timed steps), ``traces`` (paths,
by rank), ``config`` and ``allocator`` (what ``keep_freed_memory`` did on the ranks).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainsim.capture.profile import OPTIMIZERS
from trainsim.errors import UserError
from trainsim.run.ranks import rank_main

Network = Callable[[int, float | None, float], AbstractContextManager[tuple[Any, str]]]
"""``network(world, rate_mbit, delay_ms)``: a context that places ``world`` ranks on links of that rate
and delay, as ``(popen, master address)`` (``popen`` as ``trainsim.run.ranks.launch`` takes it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TracedRunConfig:
    """One real run: the model, the optimizer, the ranks and the network between them."""

    model: str = "mlp"
    """zoo model: mlp, cnn or transformer"""
    batch_size: int = 32
    """samples per step and rank"""
    width: int = 1024
    """hidden width of the MLP"""
    depth: int = 4
    """linear layers of the MLP"""
    optimizer: str = "sgd"
    """an optimizer name of ``trainsim.capture.profile.OPTIMIZERS`` (e.g. adam-loop, adam-fused)"""
    world: int = 2
    """ranks (processes); 1 runs without DDP"""
    rate_mbit: float | None = None
    """link rate of each rank's link to the hub (None: loopback, unshaped)"""
    delay_ms: float = 0.0
    """added one-way latency of each link"""
    bucket_cap_mb: float = 25.0
    """DDP's gradient bucket size (torch's default: 25 MB)"""
    warmup: int = 3
    """untimed steps first"""
    steps: int = 8
    """timed steps without the profiler (at least)"""
    min_timed_s: float = 0.0
    """time at least this long: more timed steps than ``steps`` when steps are short (their number is
    chosen from the fastest warm-up step, the same on every rank), so that a millisecond step's median is
    not read off a tenth of a second of a shared host"""
    profiled: int = 3
    """steps recorded by the profiler (after one profiler warm-up step)"""
    seed: int = 0
    timeout_s: float = 300.0
    """the whole run, and each collective"""

    def __post_init__(self) -> None:
        for f in ("batch_size", "width", "depth", "world", "steps", "profiled"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"traced run: {f}={v!r}; expected a positive integer")
        if self.warmup < 0:
            raise UserError(f"traced run: warmup={self.warmup!r}; expected >= 0")
        if not (self.min_timed_s >= 0 and math.isfinite(self.min_timed_s)):
            raise UserError(f"traced run: min_timed_s={self.min_timed_s!r}; expected seconds >= 0")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"traced run: optimizer {self.optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise UserError(f"traced run: rate_mbit={self.rate_mbit!r}; expected a rate > 0 Mbit/s or None")
        if self.delay_ms < 0 or self.bucket_cap_mb <= 0:
            raise UserError(f"traced run: delay_ms={self.delay_ms!r}, bucket_cap_mb={self.bucket_cap_mb!r}; "
                            "expected delay >= 0 and a bucket size > 0")  # fmt: skip


def traced_run(cfg: TracedRunConfig, out: str | Path, *, network: Network | None = None) -> dict[str, Any]:
    """Run ``cfg`` for real and write each rank's trace into folder ``out`` (see the module docstring).
    ``network``: where the ranks of a shaped link (``rate_mbit`` or ``delay_ms``) run.

    ``out`` must not hold traces already (nothing of the user's is overwritten)."""
    from trainsim.run.ranks import RankFailed, run_workers

    folder = Path(out)
    old = sorted(folder.glob("rank*.json.gz")) if folder.exists() else []
    if old:
        raise UserError(f"{folder}: already holds traces ({old[0].name}); expected an empty or new folder")
    folder.mkdir(parents=True, exist_ok=True)
    retried: list[str] = []
    with _network(cfg, network) as (popen, master):
        for attempt in range(2):
            try:
                ranks = run_workers(
                    "trainsim.run.traced", _WorkerConfig(run=asdict(cfg), out=str(folder.resolve())), cfg.world,
                    popen=popen, master=master, port=None, timeout_s=cfg.timeout_s,
                )  # fmt: skip
                break
            except RankFailed as e:
                # A rank aborted by a signal inside torch (seen once in ~20 CI runs: "malloc(): unsorted
                # double linked list corrupted" right after the profiler stopped) yields no measurement:
                # the run is repeated once, and says so. A rank that fails by itself is not retried.
                if attempt or e.code is None or e.code >= 0:
                    raise
                retried.append(str(e))
                for f in folder.glob("rank*.json.gz"):
                    f.unlink()
    per_rank = [r["step_ms"] for r in ranks]
    window = max(sum(s) / len(s) for s in per_rank)
    return {
        "config": asdict(cfg),
        "step_ms": window,
        "rank_step_ms": per_rank,
        "traces": [r["trace"] for r in ranks],
        "retried": retried,
        "allocator": sorted({str(r.get("allocator")) for r in ranks}),
    }


@dataclass(frozen=True, slots=True)
class _WorkerConfig:
    run: dict[str, Any]
    out: str


@contextlib.contextmanager
def _network(cfg: TracedRunConfig, network: Network | None) -> Iterator[tuple[Any, str]]:
    """``(popen, master address)`` for the ranks: ``network``'s when a rate or a delay is given."""
    from trainsim.run.ranks import local_popen

    if cfg.rate_mbit is None and cfg.delay_ms == 0:
        yield local_popen, "127.0.0.1"
        return
    if network is None:
        raise UserError("traced run: a shaped link needs a network to run the ranks in; expected network= "
                        "(trainsim.testbed.netns.shaped_ranks)")  # fmt: skip
    with network(cfg.world, cfg.rate_mbit, cfg.delay_ms) as placed:
        yield placed


# --------------------------------------------------------------------------- the worker (one per rank)
def _worker(rank: int, master: str, port: int, wcfg: _WorkerConfig) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from trainsim.capture.profile import _annotate_layers, make_optimizer, record_steps, sidecar, sidecar_path
    from trainsim.models import zoo
    from trainsim.run.ranks import init_gloo

    cfg = TracedRunConfig(**wcfg.run)
    allocator = keep_freed_memory()
    torch.set_num_threads(1)
    if cfg.world > 1:
        init_gloo(rank, cfg.world, master, port, cfg.timeout_s)
    spec = zoo.ZooSpec(batch_size=cfg.batch_size, width=cfg.width, depth=cfg.depth)
    model, batch = zoo.build_with_batches(cfg.model, seed=cfg.seed, spec=spec)
    layers = _annotate_layers(model)
    net: Any = model
    if cfg.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb)
    opt = make_optimizer(cfg.optimizer, net.parameters(), 0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i: int) -> None:
        x, y = batch(rank * 100_003 + i)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        loss.detach().item()

    i, warm = 0, [math.inf]
    for _ in range(cfg.warmup):
        t0 = time.perf_counter()
        step(i)
        warm.append(time.perf_counter() - t0)
        i += 1
    n = timed_steps(cfg, min(warm[2:] or warm))
    if cfg.world > 1:
        agreed = torch.tensor([n])  # every rank times as many steps; the all-reduce is also the barrier
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        n = int(agreed.item())
    marks = [time.perf_counter()]
    for _ in range(n):
        step(i)
        i += 1
        marks.append(time.perf_counter())
    step_ms = [(b - a) * 1e3 for a, b in itertools.pairwise(marks)]
    prefault_heap()  # the profiled steps then take no page faults that the timed ones did not
    trace = Path(wcfg.out) / f"rank{rank}.json.gz"
    record_steps(lambda k: step(i + k), cfg.profiled + 1, warmup=1, out=trace)  # one profiler warm-up step
    side = sidecar(model, layers, cfg.model, cfg.batch_size)
    side.update(steps=cfg.profiled, optimizer=cfg.optimizer, rank=rank, world=cfg.world,
                rate_mbit=cfg.rate_mbit, delay_ms=cfg.delay_ms, bucket_cap_mb=cfg.bucket_cap_mb)  # fmt: skip
    sidecar_path(trace).write_text(json.dumps(side, indent=1))
    if cfg.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return {"rank": rank, "step_ms": step_ms, "trace": str(trace), "allocator": allocator}


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
"""``mallopt`` parameters (glibc's malloc.h)"""

HEAP_PAD_BYTES = 512 << 20
"""``prefault_heap``'s default: several times the heap growth seen over a run's profiled steps (~20 MiB per
step for the w1024 MLP with Adam's loop)"""


def prefault_heap(nbytes: int = HEAP_PAD_BYTES) -> bool:
    """Grow malloc's heap by ``nbytes``, write every page of it and free it, so that the heap's free top
    is memory already faulted in (``keep_freed_memory`` never trims it). Returns whether it was done.

    Why: under the profiler, the blocks a step frees can be split by the profiler's own small allocations,
    so the next step's tensors come from new heap memory, faulted in page by page. On this test bed
    (2026-11-29, docs/log/whatif.md) 3 of 8 processes of the w1024 MLP with Adam's loop took 3,000-5,000
    faults per profiled step, their optimizer 2-2.5x slower than in the timed steps (0 faults); with the
    heap's top faulted in first, 10 of 10 took none."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError, TypeError):
        return False
    block = libc.malloc(ctypes.c_size_t(nbytes))
    if not block:
        return False
    ctypes.memset(block, 1, nbytes)
    libc.free(block)
    return True


def keep_freed_memory() -> str:
    """Make glibc's malloc keep the memory a step frees for the next step, as a GPU's caching allocator does.

    By default glibc serves each block above its mmap threshold (128 KiB at first, raised as such blocks
    are freed) with a fresh ``mmap`` and returns it with ``munmap``: every step then page-faults its
    tensors in again. On this test bed (2026-11-29, docs/log/whatif.md) the w1024 MLP with Adam's loop
    took ~3,100 page faults and 8 ms of kernel time per 23 ms step, and 5 processes of it had medians
    26 % apart; with this setting 26 faults, 0.05 ms, a 15 ms step, 11 % apart. How many blocks take the
    mmap path drifts with a process's allocation history, so one run's step cost could not be read off
    another run's trace. Here nothing is mmapped on its own (``M_MMAP_MAX`` 0), the heap is never trimmed.

    Returns what was done: ``"glibc: mmap off, no trim"``, or why nothing was (not glibc)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return f"unchanged: no mallopt in {name or 'the C library'}"
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    return "glibc: mmap off, no trim" if ok else "unchanged: mallopt refused"


def timed_steps(cfg: TracedRunConfig, step_s: float) -> int:
    """How many steps to time: ``cfg.steps``, or more when ``step_s`` (a warm step's time) times that
    falls short of ``cfg.min_timed_s`` (at most 50x ``cfg.steps``)."""
    if not (cfg.min_timed_s > 0 and 0 < step_s < math.inf):
        return cfg.steps
    return min(50 * cfg.steps, max(cfg.steps, math.ceil(cfg.min_timed_s / step_s)))


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    Path(out).write_text(json.dumps(_worker(rank, master, port, _WorkerConfig(**cfg))))


if __name__ == "__main__":
    rank_main(_rank, "one rank of trainsim.run.traced (started by traced_run)")
