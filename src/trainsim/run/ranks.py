"""Start one process per rank, watch them all, and stop everything as soon as one fails.

    >>> from trainsim.run.ranks import launch, local_popen
    >>> argvs = [["python", "-m", "trainsim.run.ooo_dp", "--rank", str(r), ...] for r in range(2)]  # doctest: +SKIP
    >>> launch(argvs, popen=local_popen, timeout_s=120)                                            # doctest: +SKIP

A rank that exits with a non-zero code, or a run that passes ``timeout_s``, ends the whole run: the
other ranks are killed (their process groups), and ``RankFailed`` names the first failing rank with
the tail of its stderr. The workers set timeouts on their process groups as well (``init_gloo``), so
a peer that dies mid-collective makes the survivors fail fast instead of waiting forever.
``popen`` decides where a rank runs: ``local_popen`` on this machine (loopback), or
``trainsim.testbed.netns.Netns.popen`` inside a shaped network namespace.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import IO, Any

Popen = Callable[..., "subprocess.Popen[Any]"]
"""``popen(rank, argv, **subprocess_kwargs)`` starts rank ``rank``."""


RankBody = Callable[[dict[str, Any], int, str, int, str], None]
"""``body(config, rank, master, port, out)``: one rank's work, which writes its result to ``out``"""


def rank_main(body: RankBody, description: str, argv: Sequence[str] | None = None) -> None:
    """The worker side of every multi-process run, the same for every rank entry point: ``python -m
    <module> --config JSON [--out FILE] [--rank R --master HOST --port P]`` runs ``body`` with the parsed
    config. The rank and rendezvous default to torchrun's variables (``RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``: what ``testbed.launch`` sets); ``--out -`` (the default) means stdout, one JSON
    line (``write_result``). Then it leaves without interpreter teardown (the result is written;
    gloo's and DDP's threads can abort in static destructors afterwards, "terminate called without an
    active exception", failing a finished rank)."""
    import argparse
    import json

    env = os.environ
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", required=True, help="the run's configuration, one JSON object")
    ap.add_argument("--out", default="-", help="where this rank writes its result (JSON); - for stdout")
    ap.add_argument("--rank", type=int, default=int(env.get("RANK", -1)))
    ap.add_argument("--master", default=env.get("MASTER_ADDR", ""))
    ap.add_argument("--port", type=int, default=int(env.get("MASTER_PORT", 0)))
    a = ap.parse_args(argv)
    if a.rank < 0 or not a.master or not a.port:
        ap.error("no --rank/--master/--port and no RANK/MASTER_ADDR/MASTER_PORT in the environment")
    body(json.loads(a.config), a.rank, a.master, a.port, a.out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write_result(out: str, result: Any) -> None:
    """A rank's result as JSON: to the file ``out``, or one line on stdout where ``out`` is ``-``."""
    import json

    if out == "-":
        print(json.dumps(result), flush=True)
    else:
        with open(out, "w") as f:
            json.dump(result, f)


class RankFailed(RuntimeError):
    """A rank crashed or the run timed out; the message names the rank."""

    def __init__(self, rank: int | None, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.code = code
        """the failed rank's exit code (negative: killed by that signal); None for a timeout"""


def local_popen(rank: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start a rank on this machine (gloo over loopback), in its own process group."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env.update(kwargs.pop("env", {}) or {})
    return subprocess.Popen(list(argv), env=env, start_new_session=True, **kwargs)


def free_port() -> int:
    """A TCP port that is free on loopback right now, drawn at random below the kernel's ephemeral range
    (``ip_local_port_range``), where no outgoing connection (gloo's pairs, another run's) can take it
    before rank 0 binds it. A port drawn from 20000-60000 did collide on this VM, ending a 10-minute
    benchmark with ``EADDRINUSE``; so can the kernel's own pick (bind to 0), which lies in that range.
    The kernel's pick where the range leaves no room below it."""
    import random
    from pathlib import Path

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(64 if low > 20000 + 64 else 0):
        port = random.randint(20000, low - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct ``free_port()`` ports, for runs started at once."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def python() -> str:
    return sys.executable


def launch(
    argvs: Sequence[Sequence[str]],
    *,
    popen: Popen = local_popen,
    timeout_s: float = 300.0,
    poll_s: float = 0.05,
    capture_stdout: bool = False,
) -> list[str]:
    """Run one command per rank (index = rank) until all exit 0; raise ``RankFailed`` otherwise.
    Returns each rank's stdout with ``capture_stdout`` (else empty strings: workers that write their
    result to a file)."""
    procs: list[subprocess.Popen[Any]] = []
    errs: list[IO[bytes]] = []
    outs: list[IO[bytes]] = []
    try:
        for rank, argv in enumerate(argvs):
            err = tempfile.TemporaryFile()
            errs.append(err)
            out: Any = subprocess.DEVNULL
            if capture_stdout:
                out = tempfile.TemporaryFile()
                outs.append(out)
            procs.append(popen(rank, list(argv), stdout=out, stderr=err))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                # several in one poll: a peer's crash makes the others fail on their next collective,
                # usually with code 1; name a rank with another code first when there is one
                r = min(failed, key=lambda x: (codes[x] == 1, x))
                also = [x for x in failed if x != r]
                stop_all(procs)
                more = f" (also failed: {', '.join(f'rank {x}' for x in also)})" if also else ""
                raise RankFailed(r, f"rank {r} exited with code {codes[r]}{more}: {stderr_tail(errs[r])}", codes[r])
            if all(c == 0 for c in codes):
                texts = []
                for o in outs:
                    o.seek(0)
                    texts.append(o.read().decode(errors="replace"))
                return texts or [""] * len(procs)
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                stop_all(procs)
                raise RankFailed(
                    running[0] if running else None,
                    f"timed out after {timeout_s:.0f} s; ranks still running: {running}: "
                    + (stderr_tail(errs[running[0]]) if running else ""),
                )
            time.sleep(poll_s)
    finally:
        stop_all(procs)
        for f in (*errs, *outs):
            f.close()


def run_workers(
    module: str, cfg: Any, n_ranks: int, *, popen: Popen, master: str, port: int | None, timeout_s: float
) -> list[dict[str, Any]]:
    """Start ``python -m module`` once per rank with ``cfg`` (a dataclass) as JSON; return each rank's JSON result.

    The worker's command line is ``--rank R --master M --port P --out FILE --config JSON``; it writes its
    result to FILE. ``launch`` stops every rank if one fails.
    """
    import json
    from dataclasses import asdict
    from pathlib import Path

    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="trainsim-ranks-") as tmp:
        outs = [Path(tmp) / f"rank{r}.json" for r in range(n_ranks)]
        argvs = [
            [python(), "-m", module, "--rank", str(r), "--master", master, "--port", str(port), "--out", str(outs[r]),
             "--config", json.dumps(asdict(cfg))]
            for r in range(n_ranks)
        ]  # fmt: skip
        launch(argvs, popen=popen, timeout_s=timeout_s)
        return [json.loads(o.read_text()) for o in outs]


def slowest_rank_steps(ranks: Sequence[dict[str, Any]], steps: int) -> list[float]:
    """Per step, the time of the slowest rank (ms). Its median is biased upwards where the ranks
    synchronise inside a step rather than at its end (a rank's long step i then pairs with the other's
    long step i only by chance): see ``window_step_ms``."""
    return [max(r["step_ms"][s] for r in ranks) for s in range(steps)]


def window_step_ms(ranks: Sequence[dict[str, Any]], steps: int) -> float:
    """Time per step over the measured window (ms): each rank's ``steps`` consecutive step times summed
    and divided by ``steps``, the slowest rank's. The job's throughput, whatever point of the step the
    ranks synchronise at. (On the reordered data-parallel runtime, where the ranks meet mid-forward, the
    median of the per-step maxima read 80-82 ms for a run whose every rank took 72-73 ms per step.)"""
    return max(sum(r["step_ms"][:steps]) / steps for r in ranks)


def stop_all(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """SIGKILL every rank's process group (its children too, also when the rank itself has exited) and
    reap the ranks."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if p.poll() is None:
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def stderr_tail(err: IO[bytes], n: int = 6) -> str:
    """The last ``n`` non-empty lines of a rank's captured stderr, on one line."""
    err.seek(0)
    lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "(no stderr)"


def pin_to_core(rank: int) -> str | None:
    """Keep this process, and every thread it starts from now on (gloo's, when called before joining
    the process group), on one core: ``rank`` modulo the cores it may use. ``None`` on success, else why not.

    Why: ranks emulated on one host share its cores, where real ranks on separate machines do not.
    Unpinned on this 2-vCPU VM, a rank's gloo thread, woken by an arriving message while both ranks'
    compute threads fill the cores, may wait for a scheduler slice (4 ms) behind the other rank's
    computation, and so does the rank that posts a receive meanwhile: 9-16 % of the receives of a GPipe
    run blocked 3-5 ms (docs/ooo.md, "One core per rank"). Pinned, a rank's threads wait only for its
    own."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    except (OSError, AttributeError, ValueError) as exc:
        return str(exc)
    return None


def _thread_names() -> dict[int, str]:
    """This process's threads by id: the name the kernel gives each (``/proc/self/task/*/comm``); a
    thread that ends while they are read is left out. Raises ``OSError`` where there is no
    ``/proc/self/task``."""
    out: dict[int, str] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:
            continue
    return out


def thread_sched() -> dict[str, tuple[float, float]]:
    """This process's threads, by ``"tid:name"`` (the main thread named ``main``): milliseconds spent
    on a CPU and milliseconds runnable but waiting for one, since each started (Linux's
    ``/proc/self/task/*/schedstat``); empty where the kernel does not keep them."""
    out: dict[str, tuple[float, float]] = {}
    try:
        names = _thread_names()
    except OSError:
        return out
    for tid, name in names.items():
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns = f.read().split()[:2]
        except (OSError, ValueError):  # the thread ended meanwhile, or no schedstat
            continue
        out[f"{tid}:{'main' if tid == os.getpid() else name}"] = (int(run_ns) / 1e6, int(wait_ns) / 1e6)
    return out


class ThreadClock:
    """CPU time and run-queue wait of a process's threads over chosen windows (``start`` / ``stop``,
    any number), summed by thread name (``per_step``). A thread started inside a window counts whole;
    one that ended inside it is gone from ``/proc`` and not counted (the runs' threads live throughout).

    Ranks emulated on one host share its cores with each other's threads: on the 2-vCPU VM a
    compressed-DDP rank runs ten threads (its training thread, gloo's socket loop and two work threads,
    the hook's helper), and at 1 Gbit/s the two ranks asked for 57-60 ms of CPU per 31-33 ms step,
    the training threads waiting 4-7 ms of it for a core (docs/compress.md, "The two ranks on two
    cores"). A validation run reports that wait beside its step time: the part of the measurement that
    the host's scheduler, not the modelled cluster, put there."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[float, float]] | None = None
        self._sum: dict[str, list[float]] = {}

    def start(self) -> None:
        self._at = thread_sched()

    def stop(self) -> None:
        if self._at is None:
            raise RuntimeError("ThreadClock.stop() without start()")
        for key, (run, wait) in thread_sched().items():
            run0, wait0 = self._at.get(key, (0.0, 0.0))  # a thread started inside the window: all of it
            acc = self._sum.setdefault(key.split(":", 1)[1], [0.0, 0.0])
            acc[0] += run - run0
            acc[1] += wait - wait0
        self._at = None

    def per_step(self, steps: int) -> dict[str, dict[str, float]]:
        """By thread name (threads of one name summed): ``run_ms`` and ``wait_ms`` per step over the
        windows, ``steps`` steps in all."""
        n = max(1, steps)
        return {name: {"run_ms": round(run / n, 3), "wait_ms": round(wait / n, 3)} for name, (run, wait) in self._sum.items()}


def run_queue_ms(per_rank: Sequence[dict[str, dict[str, float]]]) -> float | None:
    """The largest of the ranks' training-thread (``main``) run-queue waits per step, from each rank's
    ``ThreadClock.per_step``; None when no rank has one."""
    waits = [t["main"]["wait_ms"] for t in per_rank if "main" in t]
    return max(waits) if waits else None


def pin_refused_note(errors: Iterable[str | None]) -> str | None:
    """One line for a run's notes when ranks asked to pin (``pin_to_core``) could not: the distinct
    reasons; ``None`` when every rank pinned or none was asked to."""
    refused = sorted({e for e in errors if e})
    return f"pinning the ranks to cores refused ({'; '.join(refused)}): those ranks ran unpinned" if refused else None


def init_gloo(rank: int, world_size: int, master: str, port: int, timeout_s: float, *, pin: bool = False) -> str | None:
    """Join the gloo process group with a timeout on every collective (a dead peer fails fast); with
    ``pin``, first keep the rank on a core of its own (``pin_to_core``). Returns why pinning failed
    (``None``: pinned, or not asked for)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    pin_error = pin_to_core(rank) if pin else None
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{master}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return pin_error


def step_starts(net: Any, opt: Any, batch: Any, loss_fn: Any, data: Any) -> list[float]:
    """One training step of ``net`` per index in ``data`` (each step's batch is ``batch(index)``);
    each step's start (``time.perf_counter``, s)."""
    starts = []
    for i in data:
        starts.append(time.perf_counter())
        x, y = batch(i)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        loss.detach().item()
    return starts


def loop_marks(net: Any, batch: Any, loss_fn: Any, lr: float, warmup: int, steps: int) -> list[float]:
    """Start times (``time.perf_counter``, s) of ``warmup + steps + 1`` steps of the plain training loop
    on ``net`` (a module, or DDP around one): the last one is the end of the last step."""
    import torch

    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    return step_starts(net, opt, batch, loss_fn, range(warmup + steps + 1))


def slowest_and_in_sync(step_ms: Sequence[float], model: Any) -> tuple[list[float], bool, float]:
    """Over the default process group: each step's time on the slowest rank (ms), whether every rank
    ended with the same weights (their sums agree to 1e-6, relative: the gradients were synchronised),
    and this rank's weight sum. Every rank must call it."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(step_ms, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64)
    both = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(both, check)
    in_sync = all(abs(float(b) - float(check)) <= 1e-6 * max(1.0, abs(float(check))) for b in both)
    return t.tolist(), in_sync, float(check)


def segments(steps: int, warmup: int, rounds: int) -> list[tuple[int, int]]:
    """``(warm-up steps, measured steps)`` of each segment of a run: one segment without host-speed
    readings; else ``rounds`` of them (at most one per 3 measured steps), the first with ``warmup``
    steps, the others with one (the ranks meet again after the plain loop)."""
    rounds = max(1, min(rounds, steps // 3)) if rounds else 1
    per = -(-steps // rounds)
    out, left = [], steps
    for i in range(rounds):
        n = min(per, left)
        if n <= 0:
            break
        out.append((warmup if i == 0 else min(1, warmup), n))
        left -= n
    return out
