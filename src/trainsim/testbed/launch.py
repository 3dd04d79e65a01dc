"""Start one torch.distributed (gloo) process per rank, each in its own namespace or on loopback.

    >>> from trainsim.testbed.launch import launch
    >>> results = run_json(2, "trainsim.testbed.wirecost", {"sizes": [1024], "window_s": 1.0}, net=None)  # doctest: +SKIP

Each rank runs ``python <args>`` with the environment torchrun would give it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), one intra-op thread (``OMP_NUM_THREADS=1``) and
``GLOO_SOCKET_IFNAME`` set to the namespace's interface (``lo`` on loopback). ``launch`` returns every
rank's stdout. It is ``trainsim.run.ranks.launch`` with these variables: when a rank fails or the
timeout passes, all ranks are killed and ``RankFailed`` names the rank with the end of its stderr.
``run_json`` runs a worker module of the one worker protocol (``trainsim.run.ranks.rank_main``: a
``--config`` JSON in, each rank's JSON result as its last stdout line) and returns the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from trainsim.run import ranks
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
    argvs = []
    for r in range(world):
        argv = [sys.executable, *args]
        if torchrun:
            argv = [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={world}", f"--node-rank={r}",
                "--nproc-per-node=1", f"--master-addr={master}", f"--master-port={port}", *args,
            ]  # fmt: skip
        argvs.append(argv)

    def popen(rank: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        env = rank_env(rank, world, master, port, ifname, threads)
        if torchrun:  # torchrun sets these itself
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k)
        if net is not None:
            return net.popen(rank, argv, env=env, **kw)
        return subprocess.Popen(list(argv), env=env, start_new_session=True, **kw)

    return ranks.launch(argvs, popen=popen, timeout_s=timeout_s, capture_stdout=True)


def run_json(
    world: int, module: str, config: Any, *, net: Netns | None, timeout_s: float = 300.0, threads: int = 1
) -> list[Any]:
    """Run worker ``module`` (``rank_main``'s protocol; a module name, or a script's path ending in .py)
    with ``config`` on ``world`` ranks; return each rank's result (the JSON of its last stdout line; None
    for a rank that printed none)."""
    target = [module] if module.endswith(".py") else ["-m", module]
    outs = launch(world, [*target, "--config", json.dumps(config)], net=net, timeout_s=timeout_s, threads=threads)
    lines = [o.strip().splitlines() for o in outs]
    return [json.loads(ln[-1]) if ln else None for ln in lines]
