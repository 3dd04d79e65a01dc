"""CaSync schemes (all-gather, PS, ring) on 3 gloo processes against the exact sum."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.run.test_hooks import free_port

WORLD = 3
CASES = [(scheme, parts) for scheme in ("allgather", "ps", "ring") for parts in (1, 2, 5)]
CODECS = ["none", "fp16", "tbq", "topk", "onebit", "randomk", "qsgd"]


def _worker(rank: int, port: int, out_dir: str) -> None:
    import datetime

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    from trainsim.compress import make
    from trainsim.run.casync import sync

    res: dict[str, Any] = {}
    for n in (1, 7, 1003):
        xs = [torch.randn(n, generator=torch.Generator().manual_seed(10 * r + n)) for r in range(WORLD)]
        exact = sum(xs)
        assert isinstance(exact, torch.Tensor)
        for scheme, parts in CASES:
            for name in CODECS:
                x = xs[rank].clone()
                comp = make(name, process_rank=rank)
                sync(x, comp, key="g", scheme=scheme, partitions=parts)
                first = x.clone()
                dist.broadcast(first, src=0)
                res[f"{scheme}/{parts}/{name}/{n}"] = {
                    "rel": float((x - exact).norm() / exact.norm()),
                    "same": bool(torch.equal(x, first)),
                }
    from trainsim.run.casync import all_gather_bytes

    for method in ("exchange", "collective"):  # the hook's all-gather: two in flight, waited and by future
        a = torch.arange(5, dtype=torch.uint8) + 10 * rank
        b = torch.full((3,), float(rank))
        out_a, out_b = torch.empty(WORLD * 5, dtype=torch.uint8), torch.empty(WORLD * 3)
        h_a, h_b = all_gather_bytes(out_a, a, None, method), all_gather_bytes(out_b, b, None, method)
        h_b.get_future().wait()
        h_a.wait()
        res[f"gather/{method}"] = {"a": out_a.tolist(), "b": out_b.tolist()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    os._exit(0)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("casync")
    mp.start_processes(_worker, args=(free_port(), str(tmp)), nprocs=WORLD, start_method="spawn")
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(WORLD)]


pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize(("scheme", "parts"), CASES)
def test_exact_codec_gives_exact_sum(results: list[dict[str, Any]], scheme: str, parts: int) -> None:
    for res in results:
        for n in (1, 7, 1003):
            assert res[f"{scheme}/{parts}/none/{n}"]["rel"] < 1e-6
            assert res[f"{scheme}/{parts}/fp16/{n}"]["rel"] < 5e-3


@pytest.mark.parametrize(("scheme", "parts"), CASES)
@pytest.mark.parametrize("name", CODECS)
def test_replicas_agree_and_error_is_bounded(
    results: list[dict[str, Any]], scheme: str, parts: int, name: str
) -> None:
    for res in results:
        for n in (7, 1003):
            r = res[f"{scheme}/{parts}/{name}/{n}"]
            assert r["same"]
            # each hop of PS/ring re-encodes a partial sum: the error compounds a little
            assert r["rel"] < (3.0 if name == "qsgd" else 1.5)


@pytest.mark.parametrize("method", ["exchange", "collective"])
def test_all_gather_bytes_places_every_rank_in_order(results: list[dict[str, Any]], method: str) -> None:
    """Receives posted before sends (``exchange``, gloo) or gloo's own all-gather: each rank's tensor
    lands in its slot, with two gathers in flight and one of them completed through its future."""
    for res in results:
        got = res[f"gather/{method}"]
        assert got["a"] == [10 * r + i for r in range(WORLD) for i in range(5)]
        assert got["b"] == [float(r) for r in range(WORLD) for _ in range(3)]


def test_backends_by_device() -> None:
    """Which backend takes each device's tensors, for plain and per-device backend strings."""
    from trainsim.run.casync import backends_by_device

    assert backends_by_device("gloo") == {"cpu": "gloo", "cuda": "gloo"}
    assert backends_by_device("nccl") == {"cuda": "nccl"}
    assert backends_by_device("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    assert backends_by_device("mpi") == {}
