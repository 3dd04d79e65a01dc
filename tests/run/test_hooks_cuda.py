"""The compression hooks on CUDA buckets (marked ``gpu``; CI has no GPU, run it on a GPU machine).

    python -m pytest -m gpu tests/run/test_hooks_cuda.py -q -x -p no:cacheprovider

One GPU is enough: 2 gloo processes share cuda:0 (gloo takes CUDA tensors for all-reduce, broadcast,
gather and all-gather; CaSync stages its point-to-point hops through the host), and 1 NCCL process
(NCCL refuses two ranks on one GPU). Each configuration runs twice, on CUDA and on CPU buckets, from
the same weights and batches, and the two are compared. Two spawns in all (a few seconds each).

Tolerances. The model's weights, inputs and loss are small dyadic numbers (weights k/64, inputs and
targets integers in [-2, 2], loss sum(out * t) / 16), so every product and partial sum of forward and
backward is exactly representable in fp32: the first step's gradients are bit-identical on both
devices, whatever order cuBLAS sums in. Random draws are the same too (seeded CPU generators, copied
to the device). What remains is the codecs' own float work (reductions in another order, fused
multiply-adds): an ulp here and there, which the SGD steps carry on. On an H100 with torch 2.11
(2026-11-24) the largest relative L2 difference of the decoded gradients was 1.8e-7 at step 1 and
1.2e-6 over 3 steps (PowerSGD; 3.6e-6 for fp16 PowerSGD), and no quantiser or sparsifier changed a
single code. ``TOL`` keeps 8x margin over that. A quantiser could still turn an ulp into another
code for an element on a rounding boundary on another GPU or library version, which moves the result
by ~2/sqrt(n) of its norm (n ~ 3000 here): ``TOL_QUANT`` allows one such flip, not a wrong decode.
"""

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.run.test_hooks import ALGOS, BOUND, CpuBucket, _exit, _init, _rel, _run, free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

STEPS = 3
TOL = 1e-5  # relative L2 of CUDA against CPU buckets (gradients of every step, final weights)
TOL_QUANT = 0.05  # quantisers and sparsifiers: one code flipped on a rounding boundary (docstring)
SMOOTH = {"none", "fp16", "bf16", "randomk", "powersgd"}  # output moves smoothly with the input
HALF_TOL = 1e-4  # fp16/bf16 models, smooth codecs: 3.6e-6 measured (fp16 PowerSGD)


def _model(device: str, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
    with torch.no_grad():
        for p in model.parameters():  # k/64 in [-1/4, 1/4]: products and sums stay exact in fp32
            p.copy_(torch.randint(-16, 17, p.shape, generator=g) / 64)
    return model.to(device=device, dtype=dtype)


def _batch(rank: int, step: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randint(-2, 3, (16, 64), generator=g).to(device=device, dtype=dtype)
    t = torch.randint(-2, 3, (16, 10), generator=g).to(device=device, dtype=torch.float32)
    return x, t


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad.detach()


def _watch(hook: Any, seen: list[tuple[Any, torch.Tensor]]) -> Any:
    """``hook`` with its futures and buckets kept, to check what DDP got (no annotations: DDP
    compares them with GradBucket and Future[Tensor] as objects)."""

    def watched(state, bucket):
        fut = hook(state, bucket)
        seen.append((fut, bucket.buffer()))
        return fut

    return watched


def _train(
    algo: str | None,
    rank: int,
    device: str,
    *,
    steps: int = STEPS,
    dtype: torch.dtype = torch.float32,
    group: Any = None,
    **kw: Any,
) -> dict[str, Any]:
    """DDP with ``algo``'s hook (None: plain DDP) and SGD for ``steps`` steps on ``device``."""
    from trainsim.run.hooks import CompressionState, hook_for

    model = _model(device, dtype)
    ids = [torch.device(device).index or 0] if device != "cpu" else None
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=0.002, process_group=group)  # 2 buckets once rebuilt
    seen: list[tuple[Any, torch.Tensor]] = []
    if algo is not None:
        state = CompressionState(algo, group, model=model, min_numel=64, **kw)
        ddp.register_comm_hook(state, _watch(hook_for(algo), seen))
    opt = torch.optim.SGD(model.parameters(), lr=1 / 16)
    grads = []
    for step in range(steps):
        opt.zero_grad()
        x, t = _batch(rank, step, device, dtype)
        (ddp(x).float() * t).sum().div(16).backward()
        grads.append([_grad(p).float().cpu() for p in model.parameters()])
        opt.step()
    torch.cuda.synchronize()
    futures_ok = all(
        fut.wait().device == buf.device and fut.wait().dtype == buf.dtype for fut, buf in seen
    )
    return {
        "grads": grads,
        "params": [p.detach().float().cpu() for p in model.parameters()],
        "hook_calls": len(seen),
        "futures_ok": futures_ok,
        "devices": sorted({str(buf.device) for _, buf in seen}),
    }


def _finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _compare(cuda: dict[str, Any], cpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "step1": _rel(cuda["grads"][0], cpu["grads"][0]),
        "steps": max(_rel(a, b) for a, b in zip(cuda["grads"], cpu["grads"], strict=True)),
        "params": _rel(cuda["params"], cpu["params"]),
        "finite": all(_finite(g) for g in cuda["grads"]) and _finite(cuda["params"]),
        "hook_calls": cuda["hook_calls"],
        "futures_ok": cuda["futures_ok"],
        "devices": cuda["devices"],
    }


def _same_on_ranks(tensors: list[torch.Tensor]) -> bool:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    first = flat.clone()
    dist.broadcast(first, src=0)  # CPU tensors on the gloo group
    return bool(torch.equal(flat, first))


# ---- (a) 2 gloo processes, both on cuda:0 ---------------------------------------------------------


def _gloo_worker(rank: int, port: int, out_dir: str) -> None:
    _init(rank, port)
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    res: dict[str, Any] = {}
    for algo in ALGOS:
        cuda, cpu = _train(algo, rank, "cuda:0"), _train(algo, rank, "cpu")
        res[algo] = _compare(cuda, cpu) | {"same": _same_on_ranks(cuda["params"])}
    # CaSync's PS (gloo's gather and broadcast on CUDA) and ring (point-to-point staged) schemes,
    # and the all-gather by gloo's own collective instead of the exchange
    cases: list[tuple[str, dict[str, Any]]] = [
        ("none", {"scheme": "ps"}), ("tbq", {"scheme": "ps"}), ("none", {"scheme": "ring"}),
        ("tbq", {"scheme": "ring"}), ("onebit", {"gather": "collective"}),
    ]  # fmt: skip
    for algo, kw in cases:
        name = f"{algo}/" + "/".join(f"{k}={v}" for k, v in kw.items())
        cuda, cpu = _train(algo, rank, "cuda:0", **kw), _train(algo, rank, "cpu", **kw)
        res[name] = _compare(cuda, cpu) | {"same": _same_on_ranks(cuda["params"])}
    # (c) fp16 and bf16 buckets
    for dt in (torch.float16, torch.bfloat16):
        ref = _train(None, rank, "cuda:0", steps=1, dtype=dt)
        for algo in ("none", "onebit", "topk", "fp16"):
            cuda = _train(algo, rank, "cuda:0", steps=1, dtype=dt)
            cpu = _train(algo, rank, "cpu", steps=1, dtype=dt)
            to_plain = _rel(cuda["grads"][0], ref["grads"][0])
            res[f"half/{dt}/{algo}"] = _compare(cuda, cpu) | {"to_plain": to_plain}
    # NaN on one rank shows on both (the non-finite markers on the device): a NaN weight of layer 0
    # makes hidden unit 3 NaN, hence column 3 of layer 2's gradient (compressed) on rank 0 only
    from trainsim.run.hooks import CompressionState, compress_hook

    for algo in ("signsgd", "tbq", "topk", "onebit", "randomk", "fp16"):
        model = _model("cuda:0")
        ddp = DDP(model, device_ids=[0])
        ddp.register_comm_hook(CompressionState(algo, model=model, min_numel=64), compress_hook)
        x, t = _batch(rank, 0, "cuda:0", torch.float32)
        first, last = (m for m in model if isinstance(m, nn.Linear))
        if rank == 0:
            with torch.no_grad():
                first.weight[3, 5] = float("nan")
        (ddp(x) * t).sum().backward()
        res[f"nan/{algo}"] = bool(torch.isnan(_grad(last.weight)).any())
    # no_sync accumulation with the exact codec equals plain DDP's
    outs = []
    for hooked in (False, True):
        model = _model("cuda:0")
        ddp = DDP(model, device_ids=[0])
        if hooked:
            ddp.register_comm_hook(CompressionState("none", model=model, min_numel=1), compress_hook)
        with ddp.no_sync():
            x, t = _batch(rank, 0, "cuda:0", torch.float32)
            (ddp(x) * t).sum().backward()
        x, t = _batch(rank, 1, "cuda:0", torch.float32)
        (ddp(x) * t).sum().backward()
        outs.append([_grad(p).cpu() for p in model.parameters()])
    res["no_sync"] = _rel(outs[1], outs[0])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))
    _exit()


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _run(_gloo_worker, tmp_path_factory.mktemp("gloo_cuda"))


def _tol(algo: str) -> float:
    return TOL if algo in SMOOTH else TOL_QUANT


def _check(r: dict[str, Any], algo: str) -> None:
    assert r["hook_calls"] > 0 and r["devices"] == ["cuda:0"], r
    assert r["futures_ok"], "the hook's future must hold the bucket's tensor: its device and dtype"
    assert r["finite"], r
    assert r["steps"] < _tol(algo) and r["params"] < _tol(algo), r


@pytest.mark.parametrize("algo", ALGOS)
def test_gloo_cuda_buckets_match_cpu(gloo: list[dict[str, Any]], algo: str) -> None:
    for res in gloo:
        _check(res[algo], algo)
        assert res[algo]["same"], "replicas disagree"


@pytest.mark.parametrize(
    "name",
    ["none/scheme=ps", "tbq/scheme=ps", "none/scheme=ring", "tbq/scheme=ring", "onebit/gather=collective"],
)
def test_gloo_cuda_schemes_match_cpu(gloo: list[dict[str, Any]], name: str) -> None:
    for res in gloo:
        _check(res[name], name.split("/")[0])
        assert res[name]["same"], "replicas disagree"


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
@pytest.mark.parametrize("algo", ["none", "onebit", "topk", "fp16"])
def test_gloo_half_precision_cuda_buckets(gloo: list[dict[str, Any]], dtype: str, algo: str) -> None:
    for res in gloo:
        r = res[f"half/{dtype}/{algo}"]
        assert r["futures_ok"] and r["finite"] and r["devices"] == ["cuda:0"], r
        assert r["to_plain"] < BOUND.get(algo, 2.0), r  # as on CPU (tests/run/test_hooks.py)
        assert r["step1"] < (HALF_TOL if algo in SMOOTH else TOL_QUANT), r


@pytest.mark.parametrize("algo", ["signsgd", "tbq", "topk", "onebit", "randomk", "fp16"])
def test_gloo_cuda_nan_propagates(gloo: list[dict[str, Any]], algo: str) -> None:
    assert all(res[f"nan/{algo}"] for res in gloo)


def test_gloo_cuda_no_sync_accumulation(gloo: list[dict[str, Any]]) -> None:
    assert all(res["no_sync"] < 1e-6 for res in gloo)


# ---- (b) 1 NCCL process: every algorithm and scheme against a gloo group on CPU buckets -----------


def _cases() -> list[tuple[str, str]]:
    return [(a, s) for a in ALGOS for s in ("allgather", "ps", "ring") if a != "powersgd" or s == "allgather"]


def _nccl_worker(rank: int, port: int, out_dir: str) -> None:
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    cpu_group = dist.new_group(backend="gloo")
    from trainsim.errors import UserError
    from trainsim.run.hooks import CompressionState, compress_hook

    res: dict[str, Any] = {}
    start = [p.detach() for p in _model("cpu").parameters()]
    for algo, scheme in _cases():
        cuda = _train(algo, 0, "cuda:0", scheme=scheme)
        cpu = _train(algo, 0, "cpu", scheme=scheme, group=cpu_group)
        res[f"{algo}/{scheme}"] = _compare(cuda, cpu) | {"moved": _rel(cuda["params"], start)}
    for dt in (torch.float16, torch.bfloat16):
        for algo in ("none", "onebit", "powersgd"):
            cuda = _train(algo, 0, "cuda:0", steps=1, dtype=dt)
            cpu = _train(algo, 0, "cpu", steps=1, dtype=dt, group=cpu_group)
            res[f"half/{dt}/{algo}"] = _compare(cuda, cpu)

    try:
        compress_hook(CompressionState("onebit"), CpuBucket())  # type: ignore[arg-type]
        res["nccl_cpu_bucket"] = "no error"
    except UserError as exc:
        res["nccl_cpu_bucket"] = str(exc)
    Path(out_dir, "rank0.json").write_text(json.dumps(res))
    os._exit(0)


@pytest.fixture(scope="module")
def nccl(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("nccl")
    mp.start_processes(_nccl_worker, args=(free_port(), str(tmp)), nprocs=1, start_method="spawn")
    return dict(json.loads(Path(tmp, "rank0.json").read_text()))


@pytest.mark.parametrize(("algo", "scheme"), _cases())
def test_nccl_matches_cpu(nccl: dict[str, Any], algo: str, scheme: str) -> None:
    r = nccl[f"{algo}/{scheme}"]
    _check(r, algo)
    assert r["moved"] > 0.0, "SGD did not move the weights"


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
@pytest.mark.parametrize("algo", ["none", "onebit", "powersgd"])
def test_nccl_half_precision_buckets(nccl: dict[str, Any], dtype: str, algo: str) -> None:
    r = nccl[f"half/{dtype}/{algo}"]
    assert r["futures_ok"] and r["finite"] and r["devices"] == ["cuda:0"], r
    assert r["step1"] < (HALF_TOL if algo in SMOOTH else TOL_QUANT), r


def test_nccl_refuses_cpu_buckets(nccl: dict[str, Any]) -> None:
    msg = nccl["nccl_cpu_bucket"]
    assert "'nccl'" in msg and "cpu" in msg, msg
