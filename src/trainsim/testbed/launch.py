"""Start one torch.distributed (gloo) process per rank, each in its own namespace or on loopback.

    >>> from trainsim.testbed.launch import launch
    >>> outs = launch(2, ["-m", "trainsim.testbed.calibrate_worker", "--worker", "1024"], net=None)  # doctest: +SKIP

Each rank runs ``python <args>`` with the environment torchrun would give it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), one intra-op thread (``OMP_NUM_THREADS=1``) and
``GLOO_SOCKET_IFNAME`` set to the namespace's interface (``lo`` on loopback). ``launch`` returns every
rank's stdout; when a rank fails or the timeout passes, all ranks are killed and ``RuntimeError`` says
which rank failed and shows the end of its stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from trainsim.run.ranks import free_port
from trainsim.testbed.netns import Netns


def rank_env(rank: int, world: int, master: str, port: int, ifname: str, threads: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(world),
        MASTER_ADDR=master,
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME=ifname,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    return env


def launch(
    world: int,
    args: Sequence[str],
    *,
    net: Netns | None,
    timeout_s: float = 300.0,
    threads: int = 1,
    torchrun: bool = False,
) -> list[str]:
    """Run ``python args`` on ``world`` ranks; return each rank's stdout (see module docstring).

    ``torchrun=True`` starts each rank through ``python -m torch.distributed.run`` (one node per rank,
    static rendezvous at rank 0) instead of setting its variables directly; slower to start.
    """
    if net is not None and net.n < world:
        raise ValueError(f"{world} ranks but the network has {net.n} namespaces")
    port = 29500 if net is not None else free_port()
    master = net.addr(0) if net is not None else "127.0.0.1"
    ifname = net.ifname if net is not None else "lo"
    procs: list[subprocess.Popen[Any]] = []
    files = []
    try:
        for r in range(world):
            out = tempfile.TemporaryFile(mode="w+")
            err = tempfile.TemporaryFile(mode="w+")
            files.append((out, err))
            argv = [sys.executable, *args]
            env = rank_env(r, world, master, port, ifname, threads)
            if torchrun:
                argv = [
                    sys.executable, "-m", "torch.distributed.run", f"--nnodes={world}", f"--node-rank={r}",
                    "--nproc-per-node=1", f"--master-addr={master}", f"--master-port={port}", *args,
                ]  # fmt: skip
                for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                    env.pop(k)
            kw: dict[str, Any] = {"stdout": out, "stderr": err, "env": env}
            if net is not None:
                procs.append(net.popen(r, argv, **kw))
            else:
                procs.append(subprocess.Popen(argv, start_new_session=True, **kw))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r = failed[0]
                raise RuntimeError(f"rank {r} exited with {codes[r]}: {_tail(files[r][1])}")
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks still running after {timeout_s:.0f} s; killed. rank 0: {_tail(files[0][1])}")
            time.sleep(0.05)
        outs = []
        for out, _ in files:
            out.seek(0)
            outs.append(out.read())
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    p.wait(timeout=5)
        for out, err in files:
            out.close()
            err.close()


def _tail(f: Any, n: int = 1500) -> str:
    f.seek(0)
    text: str = f.read()
    return text[-n:].strip() or "(no stderr)"
