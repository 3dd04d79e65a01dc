"""DDP buckets (against torch DDP itself) and the data-parallel graph transformation."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, Steps, TaskGraph, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.dataparallel import (
    DPConfig,
    ParamInfo,
    chained_bucket_us,
    data_parallel,
    ddp_buckets,
    dp_step_ms,
    read_params,
    step_anchors,
)

MiB = 1 << 20


def test_buckets_by_hand() -> None:
    # reverse order 3,2,1,0; first bucket closes at >= 1 MiB, later ones at >= 2 MiB
    sizes = [MiB, MiB, 512 << 10, 600 << 10]
    assert ddp_buckets(sizes, cap_bytes=2 * MiB) == [[3, 2], [1, 0]]
    assert ddp_buckets(sizes, order=[0, 1, 2, 3], cap_bytes=2 * MiB) == [[0], [1, 2, 3]]
    assert ddp_buckets([10, 10]) == [[1, 0]]
    with pytest.raises(UserError):
        ddp_buckets([1, 2], order=[0, 0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gloo_world1() -> object:
    dist = pytest.importorskip("torch.distributed")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_buckets_match_torch_ddp(model: str, gloo_world1: object) -> None:
    """What torch DDP builds (after its first-iteration rebuild) is what ddp_buckets builds from the
    same gradient-ready order; with the reverse-parameter-order default the bucket sizes match too
    for the models whose grad order is reverse order at bucket boundaries (mlp, cnn)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainsim.models.zoo import build

    net, (x, y) = build(model)
    ddp = DDP(net)
    for _ in range(3):  # DDP rebuilds its buckets from the observed order after the first iteration
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    data = ddp._get_ddp_logging_data()
    real = [[int(i) for i in b.split()] for b in str(data["rebuilt_per_bucket_param_indices"]).split(",")]
    real_sizes = [int(s) for s in str(data["rebuilt_bucket_sizes"]).split(",")]
    order = [int(i) for i in str(data["prev_iteration_grad_ready_order_indices"]).split(",")]
    sizes = [p.numel() * p.element_size() for p in net.parameters()]
    assert ddp_buckets(sizes, order) == real
    ours = [sum(sizes[i] for i in b) for b in ddp_buckets(sizes)]
    if model in ("mlp", "cnn"):
        assert ours == real_sizes
    assert sum(ours) == sum(real_sizes)


# --------------------------------------------------------------------------- a synthetic profile
def _profile_like(steps: int = 3) -> tuple[TaskGraph, list[ParamInfo], list[str]]:
    """Per step: fwd a 10, fwd b 10, bwd b 20, AccumulateGrad 1, bwd a 20, AccumulateGrad 1, opt 5 (us)."""
    b = GraphBuilder("synthetic")
    cpu = b.resource("cpu:main", ResourceKind.CPU_THREAD)
    acc_op = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    t0 = []
    for s in range(steps):
        t0.append(b.task("ProfilerStep", TaskKind.CPU, cpu, 0.0, step=s))
        b.task("aten::linear", TaskKind.CPU, cpu, 10.0, step=s, layer="layer:a")
        b.task("aten::linear", TaskKind.CPU, cpu, 10.0, step=s, layer="layer:b")
        b.task("AddmmBackward0", TaskKind.CPU, cpu, 20.0, step=s, layer="layer:b")
        b.task("aten::add_", TaskKind.CPU, cpu, 1.0, step=s, op=acc_op)
        b.task("AddmmBackward0", TaskKind.CPU, cpu, 20.0, step=s, layer="layer:a")
        b.task("aten::add_", TaskKind.CPU, cpu, 1.0, step=s, op=acc_op)
        b.task("aten::add_", TaskKind.CPU, cpu, 5.0, step=s, op="Optimizer.step#SGD.step")
    g = b.build(Steps(ids=np.arange(steps, dtype=np.int32), start_us=np.zeros(steps), end_us=np.zeros(steps), anchor=0))
    params = [ParamInfo(name="a.w", layer="a", numel=MiB // 2, size_bytes=2 * MiB),
              ParamInfo(name="b.w", layer="b", numel=MiB // 2, size_bytes=2 * MiB)]  # fmt: skip
    return g, params, ["a", "b"]


def test_anchors_found() -> None:
    g, _params, layers = _profile_like()
    a = step_anchors(g, layers)[0]
    assert sorted(a.ready) == ["a", "b"] and a.opt_start >= 0 and sorted(a.fwd_start) == ["a", "b"]


def test_ddp_step_by_hand() -> None:
    g, params, layers = _profile_like()
    dp = data_parallel(g, params, layers, DPConfig(world=2), comm_us=lambda nbytes: 100.0)
    res = simulate(dp)
    # b ready at 41 -> bucket0 41..141; a ready at 62 -> bucket1 141..241; optimizer 241..246
    assert res.step_ms[:-1] * 1e3 == pytest.approx([246.0, 246.0])
    assert dp_step_ms(res.step_ms, "ddp") == pytest.approx(0.246)
    assert int((dp.kind == TaskKind.COMM).sum()) == 2 * 3


def test_p3_sends_input_layer_first() -> None:
    g, params, layers = _profile_like()
    cfg = DPConfig(world=2, mode="p3", slice_bytes=MiB)
    dp = data_parallel(g, params, layers, cfg, comm_us=lambda nbytes: 100.0)
    res = simulate(dp)
    comm = np.flatnonzero((dp.kind == TaskKind.COMM) & (dp.step == 0))
    names = [dp.task_name(int(t)) for t in comm[np.argsort(res.start_us[comm])]]
    # b.0 is alone when b's gradients are ready; once a's are ready too, a goes first
    assert names == ["allreduce:b.0", "allreduce:a.0", "allreduce:a.1", "allreduce:b.1"]
    bs = data_parallel(g, params, layers, DPConfig(world=2, mode="bytescheduler"), comm_us=lambda n: 100.0)
    assert simulate(bs).makespan_us > 0


def test_world_one_and_no_params() -> None:
    g, params, layers = _profile_like()
    assert data_parallel(g, params, layers, DPConfig(world=1), comm_us=lambda n: 1.0) is g
    with pytest.raises(UserError, match="no parameters"):
        data_parallel(g, [], layers, DPConfig(world=2), comm_us=lambda n: 1.0)
    with pytest.raises(UserError, match="no parameters"):
        read_params({"model": "x", "params": []})
    with pytest.raises(UserError, match=r"params\[0\] \(w\): numel=-5, bytes=-20; expected >= 0"):
        read_params({"params": [{"name": "w", "layer": "fc", "numel": -5, "bytes": -20}]})
    with pytest.raises(UserError):
        DPConfig(world=0)


def test_host_overhead_delays_the_last_bucket() -> None:
    g, params, layers = _profile_like()
    plain = simulate(data_parallel(g, params, layers, DPConfig(world=2), comm_us=lambda n: 10.0))
    # b ready at 41 -> bucket0 41..51; a's backward ends at 61, then 30 us of DDP's own work, then its
    # AccumulateGrad: a ready at 92 -> bucket1 92..102 -> optimizer 102..107 (77 without the overhead)
    cfg = DPConfig(world=2, host_overhead_us=30.0)
    dp = data_parallel(g, params, layers, cfg, comm_us=lambda n: 10.0)
    res = simulate(dp)
    assert plain.step_ms[:-1] * 1e3 == pytest.approx([77.0, 77.0])
    assert res.step_ms[:-1] * 1e3 == pytest.approx([107.0, 107.0])
    assert sum(dp.task_name(t) == "ddp:host-overhead" for t in range(dp.n_tasks)) == 3
    with pytest.raises(UserError, match="host_overhead_us"):
        DPConfig(world=2, host_overhead_us=-1.0)


def test_finalize_follows_the_last_collective() -> None:
    """DDP copies the reduced buckets back into the gradients once the last one is done: that part
    of its own work (``finalize_us``) runs after the last all-reduce, before the optimizer, and the
    rest keeps its place before the input-most gradient."""
    g, params, layers = _profile_like()
    # 30 us of DDP's work, 12 of it after the collectives: a's backward ends at 61, 18 us of work, its
    # AccumulateGrad: a ready at 80 -> bucket1 (100 us) 141..241 behind bucket0 41..141 -> finalize
    # 241..253 -> optimizer 253..258 (without the split the 30 us hide behind bucket0: 246)
    cfg = DPConfig(world=2, host_overhead_us=30.0, finalize_us=12.0)
    dp = data_parallel(g, params, layers, cfg, comm_us=lambda n: 100.0)
    res = simulate(dp)
    assert res.step_ms[:-1] * 1e3 == pytest.approx([258.0, 258.0])
    whole = simulate(data_parallel(g, params, layers, DPConfig(world=2, host_overhead_us=30.0),
                                   comm_us=lambda n: 100.0))  # fmt: skip
    assert whole.step_ms[:-1] * 1e3 == pytest.approx([246.0, 246.0])
    names = np.array([dp.task_name(t) for t in range(dp.n_tasks)])
    fin = np.flatnonzero(names == "ddp:finalize")
    assert fin.size == 3 and dp.dur_us[fin] == pytest.approx(12.0)
    assert dp.dur_us[names == "ddp:host-overhead"] == pytest.approx(18.0)
    for s, t in enumerate(fin):
        comm = np.flatnonzero((dp.kind == TaskKind.COMM) & (dp.step == s))
        assert res.start_us[t] == pytest.approx(res.end_us[comm].max())
    with pytest.raises(UserError, match="finalize_us"):
        DPConfig(world=2, host_overhead_us=10.0, finalize_us=20.0)


def test_chained_buckets_end_as_one_all_reduce_of_their_bytes() -> None:
    def comm(n: int) -> float:
        return 60.0 + n / 1000

    # the second is ready (at 50) while the first (0..160) is in flight: it takes comm(200k) - comm(100k);
    # the third is ready at 500, after the chain ended at 260: on its own
    assert chained_bucket_us([0.0, 50.0, 500.0], [100_000, 100_000, 100_000], comm) == pytest.approx([160.0, 100.0, 160.0])
    # a chain of three: each after the first pays its bytes only
    assert chained_bucket_us([0.0, 1.0, 2.0], [1000, 2000, 3000], comm) == pytest.approx([61.0, 2.0, 3.0])
    assert chained_bucket_us([], [], comm) == []


def test_chained_transfers_wait_for_a_worker_thread_and_their_own_start_up() -> None:
    """With ``lanes``: three collectives of 100 bytes issued at 0 on two worker threads (comm 100 us +
    1 us per 100 bytes): the first 0-101, the second joins it (its bytes: 101-102), the third waits
    for the first's thread (issued at 101) and then takes its own 101 us (ends at 202, not 103). A
    transfer not on a worker thread (gloo's point-to-point) never waits. Without ``lanes``, the old rule."""

    def comm(n: int) -> float:
        return 100.0 + n / 100

    ready, sizes = [0.0, 0.0, 0.0], [100, 100, 100]
    assert chained_bucket_us(ready, sizes, comm) == pytest.approx([101.0, 1.0, 1.0])
    assert chained_bucket_us(ready, sizes, comm, lanes=2) == pytest.approx([101.0, 1.0, 100.0])
    assert chained_bucket_us(ready, sizes, comm, lanes=2, collective=[True, True, False]) == pytest.approx(
        [101.0, 1.0, 1.0]
    )
    assert chained_bucket_us(ready, sizes, comm, lanes=3) == pytest.approx([101.0, 1.0, 1.0])
    # one cost per transfer: a short one (20 us + its bytes) issued at 10 joins the chain for its bytes, a
    # long one (500 us + its bytes) issued at 20 ends no sooner than 521, its own time after it was issued
    short, long_ = (lambda n: 20.0 + n / 100), (lambda n: 500.0 + n / 100)
    durs = chained_bucket_us([0.0, 10.0, 20.0], sizes, [comm, short, long_], lanes=2, collective=[True, False, False])
    assert durs == pytest.approx([101.0, 1.0, 521.0 - 102.0])
    with pytest.raises(UserError, match="lanes"):
        chained_bucket_us(ready, sizes, comm, lanes=0)


def test_lanes_chain_ddp_buckets_in_flight_together() -> None:
    g, params, layers = _profile_like()

    def comm(n: int) -> float:
        return 60.0 + n / (64 * 1024)  # 2 MiB: 92 us

    one = simulate(data_parallel(g, params, layers, DPConfig(world=2), comm_us=comm))
    dp = data_parallel(g, params, layers, DPConfig(world=2, lanes=2), comm_us=comm)
    two = simulate(dp)
    # b ready at 41 -> bucket0 41..133; a ready at 62, in flight with it -> 32 us more (its bytes alone),
    # not 92: 133..165, optimizer 165..170 (one lane: 133..225, 225..230)
    assert one.step_ms[:-1] * 1e3 == pytest.approx([230.0, 230.0])
    assert two.step_ms[:-1] * 1e3 == pytest.approx([170.0, 170.0])
    # buckets that do not overlap keep their own time
    fast = simulate(data_parallel(g, params, layers, DPConfig(world=2, lanes=2), comm_us=lambda n: 10.0))
    assert fast.step_ms[:-1] * 1e3 == pytest.approx([77.0, 77.0])
    with pytest.raises(UserError, match="lanes"):
        DPConfig(world=2, lanes=0)
