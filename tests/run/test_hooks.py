"""DDP compression hooks on 2 gloo processes against plain all-reduce.

One spawn of 2 processes runs every check (starting processes costs seconds on this machine);
the tests below read its per-rank results.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ALGOS = [
    "none", "fp16", "bf16", "onebit", "signsgd", "efsignsgd", "tbq", "terngrad", "terngrad_minmax",
    "qsgd", "topk", "randomk", "dgc", "graddrop", "powersgd",
]  # fmt: skip
# how far the averaged compressed gradient may be from the true average (relative L2)
BOUND = {"none": 1e-6, "fp16": 1e-3, "bf16": 1e-2, "powersgd": 1.0, "signsgd": float("inf")}  # signSGD: +-1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(rank: int, port: int, timeout_s: float = 30.0) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _exit() -> None:
    """Leave without tearing gloo down: gloo's threads sometimes abort at interpreter exit on 2.13."""
    dist.barrier()
    os._exit(0)


def _model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10)).to(dtype)


def _batch(rank: int, step: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 64, generator=g).to(dtype), torch.randint(0, 10, (16,), generator=g)


def _grads(
    algo: str | None, rank: int, *, steps: int = 1, dtype: torch.dtype = torch.float32, **kw: Any
) -> list[torch.Tensor]:
    from trainsim.run.hooks import CompressionState, hook_for

    model = _model(dtype)
    ddp = DDP(model, bucket_cap_mb=0.01)  # several small buckets
    if algo is not None:
        ddp.register_comm_hook(CompressionState(algo, model=model, min_numel=64, **kw), hook_for(algo))
    for step in range(steps):
        ddp.zero_grad()
        x, y = _batch(rank, step, dtype)
        nn.functional.cross_entropy(ddp(x).float(), y).backward()
    return [p.grad.detach().float().clone() for p in model.parameters()]


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).norm() ** 2) for x, y in zip(a, b, strict=True)) ** 0.5
    den = sum(float(y.norm() ** 2) for y in b) ** 0.5
    return num / max(den, 1e-12)


def _worker(rank: int, port: int, out_dir: str) -> None:
    _init(rank, port)
    res: dict[str, Any] = {}
    ref = _grads(None, rank)
    for algo in ALGOS:
        got = _grads(algo, rank)
        other = [torch.empty_like(t) for t in got]
        for t, o in zip(got, other, strict=True):  # replicas must agree exactly
            dist.broadcast(o.copy_(t), src=0)
        res[algo] = {
            "rel": _rel(got, ref),
            "same": all(torch.equal(t, o) for t, o in zip(got, other, strict=True)),
            "bias_exact": all(torch.allclose(got[i], ref[i], atol=1e-6) for i in (1, 3)),
            "finite": all(bool(torch.isfinite(t).all()) for t in got),
        }
    # fp16 and bf16 models (DDP buckets in half precision)
    for dt in (torch.float16, torch.bfloat16):
        ref_h = _grads(None, rank, dtype=dt)
        got_h = _grads("onebit", rank, dtype=dt)
        res[f"half_{dt}"] = {
            "finite": all(bool(torch.isfinite(t).all()) for t in got_h),
            "rel": _rel(got_h, ref_h),
        }
    # several steps: bucket rebuild after iteration 1, memories keyed by parameter
    for algo in ("dgc", "powersgd", "topk"):
        got = _grads(algo, rank, steps=4)
        res[f"steps_{algo}"] = all(bool(torch.isfinite(t).all()) for t in got)
    got = _grads("dgc", rank, steps=4, warmup_steps=3, ratio=0.01)  # wire sizes change every step
    res["steps_dgc_warmup"] = all(bool(torch.isfinite(t).all()) for t in got)
    # NaN on one rank must show on both
    from trainsim.run.hooks import CompressionState, compress_hook

    for algo in ("signsgd", "tbq", "topk", "onebit", "randomk", "fp16"):
        model = _model()
        ddp = DDP(model)
        ddp.register_comm_hook(CompressionState(algo, model=model, min_numel=64), compress_hook)
        x, y = _batch(rank, 0)
        if rank == 0:
            with torch.no_grad():
                model[0].weight[3, 5] = float("nan")
        nn.functional.cross_entropy(ddp(x), y).backward()
        res[f"nan_{algo}"] = bool(torch.isnan(model[0].weight.grad).any())
    # no_sync accumulation with the exact codec equals plain accumulation
    outs = []
    for algo in (None, "none"):
        model = _model()
        ddp = DDP(model)
        if algo:
            ddp.register_comm_hook(CompressionState(algo, model=model, min_numel=1), compress_hook)
        with ddp.no_sync():
            x, y = _batch(rank, 0)
            nn.functional.cross_entropy(ddp(x), y).backward()
        x, y = _batch(rank, 1)
        nn.functional.cross_entropy(ddp(x), y).backward()
        outs.append([p.grad.clone() for p in model.parameters()])
    res["no_sync"] = _rel(outs[1], outs[0])
    # momentum in the hook (momentum correction) + plain SGD == SGD with momentum, for the exact codec
    finals = []
    for in_hook in (False, True):
        model = _model()
        ddp = DDP(model, bucket_cap_mb=0.01)
        if in_hook:
            ddp.register_comm_hook(CompressionState("none", model=model, momentum=0.9), compress_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if in_hook else 0.9)
        for step in range(4):
            opt.zero_grad()
            x, y = _batch(rank, step)
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        finals.append([p.detach().clone() for p in model.parameters()])
    res["momentum_correction"] = _rel(finals[1], finals[0])
    # the all-gather by receives posted first and by gloo's own all-gather: the same gradients
    by_gather = [_grads("onebit", rank, steps=2, gather=m) for m in ("exchange", "collective")]
    res["gather_same"] = all(torch.equal(a, b) for a, b in zip(*by_gather, strict=True))
    # PS and ring schemes inside the hook
    for scheme in ("ps", "ring"):
        got = _grads("none", rank, scheme=scheme)
        res[f"scheme_{scheme}"] = _rel(got, ref)
        got = _grads("tbq", rank, scheme=scheme)
        other = [torch.empty_like(t) for t in got]
        for t, o in zip(got, other, strict=True):
            dist.broadcast(o.copy_(t), src=0)
        res[f"scheme_{scheme}_same"] = all(torch.equal(t, o) for t, o in zip(got, other, strict=True))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))
    _exit()


def _run(worker: Any, tmp: Path, *args: Any) -> list[dict[str, Any]]:
    mp.start_processes(worker, args=(free_port(), str(tmp), *args), nprocs=2, start_method="spawn")
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _run(_worker, tmp_path_factory.mktemp("hooks"))


pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("algo", ALGOS)
def test_hook_against_allreduce(results: list[dict[str, Any]], algo: str) -> None:
    for res in results:
        r = res[algo]
        assert r["same"], "replicas disagree"
        assert r["bias_exact"], "1-D gradients must be all-reduced exactly"
        assert r["finite"]
        assert r["rel"] < BOUND.get(algo, 2.0), r


def test_half_precision_buckets(results: list[dict[str, Any]]) -> None:
    for res in results:
        for dt in ("torch.float16", "torch.bfloat16"):
            assert res[f"half_{dt}"]["finite"]
            assert res[f"half_{dt}"]["rel"] < 1.0


def test_bucket_rebuild_steps(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert res["steps_dgc"] and res["steps_powersgd"] and res["steps_topk"] and res["steps_dgc_warmup"]


@pytest.mark.parametrize("algo", ["signsgd", "tbq", "topk", "onebit", "randomk", "fp16"])
def test_nan_propagates(results: list[dict[str, Any]], algo: str) -> None:
    assert all(res[f"nan_{algo}"] for res in results)


def test_momentum_correction_equals_optimizer_momentum(results: list[dict[str, Any]]) -> None:
    assert all(res["momentum_correction"] < 1e-5 for res in results)


def test_no_sync_accumulation(results: list[dict[str, Any]]) -> None:
    assert all(res["no_sync"] < 1e-6 for res in results)


def test_gather_methods_give_the_same_gradients(results: list[dict[str, Any]]) -> None:
    assert all(r["gather_same"] for r in results)


def test_ps_and_ring_schemes(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert res["scheme_ps"] < 1e-6 and res["scheme_ring"] < 1e-6
        assert res["scheme_ps_same"] and res["scheme_ring_same"]


# ---- a failure inside the hook is an exception on both ranks, not a hang -------------------------


def _failing_worker(rank: int, port: int, out_dir: str) -> None:
    _init(rank, port, timeout_s=5.0)
    from trainsim.compress.algorithms import TopK
    from trainsim.compress.base import Compressor
    from trainsim.run.hooks import CompressionState, compress_hook

    class Broken(TopK):
        def encode(self, x: torch.Tensor, wire: torch.Tensor, ws: Any, key: int) -> None:
            if self.rank == 0 and self.step >= 1:
                raise RuntimeError("encode failed on purpose")
            super().encode(x, wire, ws, key)

    model = _model()
    ddp = DDP(model)
    ddp.register_comm_hook(CompressionState(Compressor(Broken(), rank=rank), model=model), compress_hook)
    error = ""
    try:
        for step in range(3):
            x, y = _batch(rank, step)
            nn.functional.cross_entropy(ddp(x), y).backward()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"error": error}))
    os._exit(0)


def test_failure_in_hook_raises_not_hangs(tmp_path: Path) -> None:
    res = _run(_failing_worker, tmp_path)
    assert "encode failed on purpose" in res[0]["error"]
    assert res[1]["error"], "the peer must fail by the process group's timeout"


# ---- hundreds of PowerSGD iterations (PyTorch 2.13's own hook hits a collective mismatch on gloo) --


def _powersgd_long(rank: int, port: int, out_dir: str, steps: int) -> None:
    _init(rank, port)
    from trainsim.run.hooks import CompressionState, powersgd_hook

    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.005)
    ddp.register_comm_hook(CompressionState("powersgd", model=model, min_numel=16, rank=2), powersgd_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad()
        x, y = _batch(rank, step)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    other = flat.clone()
    dist.broadcast(other, src=0)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"same": bool(torch.equal(flat, other))}))
    _exit()


@pytest.mark.slow
def test_powersgd_hundreds_of_iterations(tmp_path: Path) -> None:
    res = _run(_powersgd_long, tmp_path, 300)
    assert all(r["same"] for r in res)


# ---- bad input: clear UserErrors, in a 1-process gloo group --------------------------------------


class CpuBucket:
    """What ``compress_hook`` reads of a ``dist.GradBucket``: one 4x4 gradient on the CPU."""

    def __init__(self) -> None:
        self.param = nn.Parameter(torch.zeros(4, 4))

    def buffer(self) -> torch.Tensor:
        return torch.zeros(16)

    def parameters(self) -> list[torch.Tensor]:
        return [self.param]

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def _bad_input_worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    from trainsim.compress.secopa import GradientPlan, Plan
    from trainsim.errors import UserError
    from trainsim.run.hooks import CompressionState, state_from_plan

    model = _model()
    messages: dict[str, str] = {}

    def expect(label: str, fn: Any) -> None:
        try:
            fn()
            messages[label] = "no error"
        except UserError as exc:
            messages[label] = str(exc)

    expect("algo", lambda: CompressionState("nope", model=model))
    from trainsim.run.hooks import hook_for

    expect("hook_for", lambda: hook_for("nope"))  # it returned the generic hook for any name
    expect("ratio", lambda: CompressionState("topk", model=model, ratio=-1))
    expect("rank", lambda: CompressionState("powersgd", model=model, rank=0))
    expect("scheme", lambda: CompressionState("onebit", model=model, scheme="tree"))
    expect("powersgd_ps", lambda: CompressionState("powersgd", model=model, scheme="ps"))
    expect("gather", lambda: CompressionState("onebit", model=model, gather="ring"))
    ghost = Plan("tbq", "ps", 1, {"ghost.weight": GradientPlan("ghost.weight", 10, True, 1)})
    expect("plan", lambda: CompressionState("tbq", model=model, plan=ghost))
    expect("plan_world", lambda: state_from_plan(Plan("tbq", "ps", 4, {}), model))
    real = dist.get_backend
    dist.get_backend = lambda group=None: "mpi"  # type: ignore[assignment]
    expect("backend", lambda: CompressionState("onebit", model=model))
    # NCCL is accepted, but takes CUDA buckets only: a CPU bucket is refused before any collective
    from trainsim.run.hooks import compress_hook

    dist.get_backend = lambda group=None: "nccl"  # type: ignore[assignment,return-value]
    bucket: Any = CpuBucket()
    expect("nccl_cpu_bucket", lambda: compress_hook(CompressionState("onebit", model=model), bucket))
    dist.get_backend = lambda group=None: "cpu:gloo,cuda:nccl"  # type: ignore[assignment,return-value]
    expect("per_device_backend", lambda: CompressionState("onebit", model=model).backends)
    dist.get_backend = real
    Path(out_dir, "rank0.json").write_text(json.dumps(messages))
    os._exit(0)


@pytest.mark.parametrize(
    ("label", "needle"),
    [("algo", "unknown compression algorithm 'nope'"), ("ratio", "ratio=-1"), ("rank", "rank=0"),
     ("scheme", "unknown scheme 'tree'"), ("powersgd_ps", "scheme must be 'allgather'"), ("gather", "gather='ring'"),
     ("plan", "ghost.weight"), ("plan_world", "world_size=4"), ("backend", "backend 'mpi' is not supported"),
     ("nccl_cpu_bucket", "backend 'nccl' takes cuda tensors, but this DDP bucket is on cpu"),
     ("per_device_backend", "no error"), ("hook_for", "unknown compression algorithm 'nope'")],
)  # fmt: skip
def test_bad_input(bad_inputs: dict[str, str], label: str, needle: str) -> None:
    assert needle in bad_inputs[label]


def test_no_hard_coded_cpu_in_hooks_and_casync() -> None:
    """Every tensor the hooks and CaSync make names its device (the bucket's or the gradient's): a
    factory call without ``device=`` would put scratch or wires on the CPU beside a CUDA bucket."""
    import ast
    import inspect

    from trainsim.run import casync, hooks

    factories = {"empty", "zeros", "ones", "full", "arange", "rand", "randn", "randint", "tensor"}
    for module in (hooks, casync):
        source = inspect.getsource(module)
        assert 'device="cpu"' not in source and "device='cpu'" not in source and 'device("cpu")' not in source
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            base = node.func.value
            if isinstance(base, ast.Name) and base.id == "torch" and node.func.attr in factories:
                keywords = {k.arg for k in node.keywords}
                where = f"{module.__name__}:{node.lineno}"
                assert "device" in keywords, f"{where}: torch.{node.func.attr} without device="


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("bad")
    mp.start_processes(_bad_input_worker, args=(free_port(), str(tmp)), nprocs=1, start_method="spawn")
    return dict(json.loads(Path(tmp, "rank0.json").read_text()))
