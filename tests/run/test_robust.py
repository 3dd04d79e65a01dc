"""Robust aggregation rules on hand-made gradients, the fault harness, the overhead model, bad input;
one real 4-rank gloo run (marked ``multiproc``)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainsim.run.robust import (
    Fault,
    FaultState,
    RobustState,
    aggregate,
    check_krum,
    check_trim,
    coordinate_median,
    corrupt,
    fault_hook,
    krum,
    krum_scores,
    sorted_rows,
    trimmed_mean,
    zeno_keep,
    zeno_scores,
)
from trainsim.run.robust_cost import (
    CollectiveCpu,
    RuleTimes,
    loglog,
    predict_overhead,
    skeleton,
    time_ops,
    time_rules,
    time_skeleton,
    zeno_parts,
    zeno_us,
)


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# --------------------------------------------------------------------------- rules
def test_median_even_is_mean_of_two_middle() -> None:
    rows = t([[1, 10], [2, 20], [3, -5], [100, 0]])
    # column 0 sorted 1 2 3 100 -> (2+3)/2; column 1 sorted -5 0 10 20 -> (0+10)/2
    assert coordinate_median(rows).tolist() == [2.5, 5.0]


def test_median_odd_and_nan_row() -> None:
    assert coordinate_median(t([[1], [5], [3]])).tolist() == [3.0]
    # a NaN counts as +inf: sorted 1 2 3 inf -> (2+3)/2, not NaN
    assert coordinate_median(t([[1], [2], [math.nan], [3]])).tolist() == [2.5]


def test_sorting_network_matches_sort() -> None:
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 4, 7, 16, 17):
        rows = torch.randn(n, 50, generator=g)
        assert torch.equal(sorted_rows(rows), rows.sort(dim=0).values), n


def test_trimmed_mean() -> None:
    rows = t([[1], [2], [3], [4], [100]])
    assert trimmed_mean(rows, 0.2).tolist() == [3.0]  # drop 1 and 100: (2+3+4)/3
    assert trimmed_mean(rows, 0.0).tolist() == [22.0]  # the plain mean
    four = t([[1, 10], [2, 20], [3, -5], [100, 0]])
    assert torch.equal(trimmed_mean(four, 0.25), coordinate_median(four))  # 4 ranks: the two middle values


def test_krum_scores_by_hand() -> None:
    # n=5, f=1: each row's 2 nearest others. r3=(.5,.5) is 0.5 from r0, r1, r2; r0..r2 have r3 (0.5) and
    # one unit neighbour (1); r4=(10,10) is 180.5 from r3 and 181 from r1, r2
    rows = t([[0, 0], [1, 0], [0, 1], [0.5, 0.5], [10, 10]])
    assert krum_scores(rows, 1).tolist() == pytest.approx([1.5, 1.5, 1.5, 1.0, 361.5])
    row, i = krum(rows, 1)
    assert i == 3 and row.tolist() == [0.5, 0.5]


def test_krum_ignores_a_nan_row() -> None:
    rows = t([[0, 0], [1, 0], [0, 1], [math.nan, 0]])
    _, i = krum(rows, 0)
    assert i in (0, 1, 2)


def test_zeno_keep_drops_lowest_and_nan() -> None:
    assert zeno_keep(torch.tensor([0.3, -1.0, 0.2, 0.5]), 1) == [0, 2, 3]
    assert zeno_keep(torch.tensor([0.3, math.nan, 0.2, 0.5]), 2) == [0, 3]


def _zeno_state(world: int = 3) -> RobustState:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    val = (torch.tensor([[1.0]]), torch.tensor([[0.0]]))
    return RobustState("zeno", world_size=world, rank=0, drop=1, lr=0.5, rho=0.1, model=model, validation=val,
                       loss_fn=F.mse_loss)  # fmt: skip


def test_zeno_scores_by_hand() -> None:
    # loss(w) = w^2 at x=1, y=0; w=1 -> 1. u=1: w=0.5, 0.25 -> 1-0.25-0.1*1 = 0.65; u=-1: w=1.5, 2.25 ->
    # 1-2.25-0.1 = -1.35; u=2: w=0, 0 -> 1-0-0.1*4 = 0.6
    state = _zeno_state()
    assert state.model is not None
    rows = t([[1.0], [-1.0], [2.0]])
    scores = zeno_scores(state, rows, list(state.model.parameters()))
    assert scores.tolist() == pytest.approx([0.65, -1.35, 0.6])
    assert aggregate(state, rows, list(state.model.parameters())).tolist() == [1.5]  # mean of rows 0 and 2
    assert state.dropped == [0, 1, 0]


def test_aggregate_mean_and_krum_counts() -> None:
    rows = t([[0, 0], [1, 0], [0, 1], [0.5, 0.5], [10, 10]])
    assert aggregate(RobustState("mean", world_size=5, rank=0), rows).tolist() == pytest.approx([2.3, 2.3])
    st = RobustState("krum", world_size=5, rank=0, f=1)
    aggregate(st, rows)
    assert st.dropped == [1, 1, 1, 0, 1]


# --------------------------------------------------------------------------- bad input
def test_impossible_settings_name_the_constraint() -> None:
    with pytest.raises(ValueError, match=r"2 floor\(trim \* world\) < world"):
        RobustState("trimmed_mean", world_size=4, rank=0, trim=0.5)
    with pytest.raises(ValueError, match=r"world >= 2f \+ 3"):
        RobustState("krum", world_size=4, rank=0, f=1)
    with pytest.raises(ValueError, match="0 <= drop < world"):
        RobustState("zeno", world_size=4, rank=0, drop=4)
    with pytest.raises(ValueError, match="median, trimmed_mean, krum, zeno"):
        RobustState("avg", world_size=4, rank=0)
    with pytest.raises(ValueError, match="model="):
        RobustState("zeno", world_size=4, rank=0, drop=1)
    with pytest.raises(ValueError, match="not initialised"):
        RobustState("median")
    with pytest.raises(ValueError, match=r"trim=-0\.1"):
        check_trim(-0.1, 4)
    assert check_trim(0.5, 5) == 2  # leaves the median
    check_krum(1, 5)
    with pytest.raises(ValueError, match="the largest f for 4 ranks is 0"):
        check_krum(1, 4)


def test_fault_bad_input() -> None:
    with pytest.raises(ValueError, match="scale, sign_flip, random"):
        Fault(kind="flip", ranks=(0,))
    with pytest.raises(ValueError, match="distinct"):
        Fault(kind="scale", ranks=(1, 1))
    with pytest.raises(ValueError, match="finite"):
        Fault(kind="scale", ranks=(1,), factor=math.inf)


# --------------------------------------------------------------------------- fault harness
def test_corrupt_kinds() -> None:
    assert corrupt(t([[1, 2]])[0], Fault(kind="scale", ranks=(0,), factor=3)).tolist() == [3, 6]
    assert corrupt(t([[1, 2]])[0], Fault(kind="sign_flip", ranks=(0,), factor=2)).tolist() == [-2, -4]
    fault = Fault(kind="random", ranks=(0,), factor=2.0)
    a = corrupt(torch.ones(20000), fault, torch.Generator().manual_seed(1))
    b = corrupt(torch.ones(20000), fault, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert float(a.std()) == pytest.approx(2.0, rel=0.05)  # factor x the gradient's RMS (1)
    assert fault.text() == "random x2 @ 0"


class _Bucket:
    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf

    def buffer(self) -> torch.Tensor:
        return self.buf


def test_fault_hook_only_on_bad_ranks() -> None:
    seen: list[list[float]] = []

    def inner(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        seen.append(bucket.buffer().tolist())
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    fault = Fault(kind="sign_flip", ranks=(2,), factor=10.0)
    for rank in (1, 2):
        fault_hook(FaultState(inner, None, fault, rank=rank), _Bucket(t([[1.0, -0.5]])[0]))  # type: ignore[arg-type]
    assert seen == [[1.0, -0.5], [-10.0, 5.0]]


# --------------------------------------------------------------------------- overhead model
class _Cal:
    world = 4

    def predict_us(self, size_bytes: float) -> float:
        return 100.0

    def allgather_us(self, size_bytes: float) -> float:
        return 300.0


def test_rule_times_interpolate_log_log() -> None:
    rt = RuleTimes(world=4, sizes=(1, 4, 16), us={"median": [1.0, 2.0, 4.0]})
    assert rt.at("median", 2) == pytest.approx(math.sqrt(2.0))
    assert rt.at("median", 64) == pytest.approx(8.0)  # the last slope held
    p = predict_overhead("median", 4, _Cal(), rt, cores=2)
    # no collective CPU times: link 300 - 100, then the rule on every rank at once, 2 ranks per core:
    # 200 + 2 x 2 = 204 against 2 x 2 us of the rule
    assert (p.link_us, p.contention, p.total_us) == (200.0, 2.0, pytest.approx(204.0))
    with pytest.raises(ValueError, match="zeno_compute_us"):
        predict_overhead("zeno", 4, _Cal(), rt)


def test_overhead_core_bound_by_hand() -> None:
    # 16 bytes per rank (numel 4), halfway in log size between the grid's 4 and 64 bytes: the all-reduce's
    # CPU sqrt(100 * 400) = 200 us, the all-gather's sqrt(250 * 1000) = 500 us
    coll = CollectiveCpu(world=4, sizes_bytes=(4, 64), allreduce_us=[1.0, 1.0], allgather_us=[1.0, 1.0],
                         allreduce_cpu_us=[100.0, 400.0], allgather_cpu_us=[250.0, 1000.0])  # fmt: skip
    assert coll.cpu_us("allreduce", 16) == pytest.approx(200.0)
    assert coll.cpu_us("allgather", 16) == pytest.approx(500.0)
    rt = RuleTimes(world=4, sizes=(1, 4, 16), us={"krum": [10.0, 40.0, 160.0]})
    p = predict_overhead("krum", 4, _Cal(), rt, coll=coll, cores=2)
    # cpu: 500 - 200 + 40 = 340 us per rank; 4 ranks on 2 cores: 680; wire: 300 - 100 + 2 x 40 = 280 (the
    # rule runs on the 4 ranks at once, 2 per core)
    assert (p.cpu_us, p.wire_us, p.total_us) == (pytest.approx(340.0), pytest.approx(280.0), pytest.approx(680.0))
    # as many cores as ranks: share 1, the link bound wins when it is the larger
    q = predict_overhead("krum", 4, _Cal(), rt, coll=coll, cores=8)
    assert q.total_us == pytest.approx(340.0)
    cheap = CollectiveCpu(world=4, sizes_bytes=(4, 64), allreduce_us=[1.0, 1.0], allgather_us=[1.0, 1.0],
                          allreduce_cpu_us=[100.0, 100.0], allgather_cpu_us=[100.0, 100.0])  # fmt: skip
    assert predict_overhead("krum", 4, _Cal(), rt, coll=cheap, cores=8).total_us == pytest.approx(240.0)
    with pytest.raises(ValueError, match="one world size"):
        predict_overhead("krum", 4, _Cal(), rt, coll=CollectiveCpu(world=2, sizes_bytes=(4, 64), allreduce_us=[1, 1],
                         allgather_us=[1, 1], allreduce_cpu_us=[1, 1], allgather_cpu_us=[1, 1]))  # fmt: skip


def test_loglog_and_skeleton() -> None:
    assert loglog([1, 100], [1.0, 100.0], 10) == pytest.approx(10.0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10, bias=False))
    sk = skeleton(model)
    assert [type(m) for m in sk] == [type(m) for m in model]
    assert [tuple(p.shape) for p in sk.parameters()] == [(1, 1), (1,), (1, 1)]
    assert model[0].weight.shape == (32, 64)  # the model itself untouched


class _Table:
    """An op-cost table by hand: every GEMM 10 us, elementwise work 1 us per 1,000 bytes."""

    def time_us(self, kind: str, point: tuple[float, ...]) -> float:
        return 10.0 if kind.startswith("matmul") else point[0] / 1000.0


def test_zeno_parts_by_hand() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))  # 9 + 8 = 17 parameters
    rules = RuleTimes(world=4, sizes=(1, 1000), us={"mean": [5.0, 5.0]}, stream_gbps=8.0)
    parts = zeno_parts(model, 4, 4, _Table(), 50.0, 2, rules)
    # one forward on 4 samples: 2 GEMMs (20 us), bias adds 144 + 96 bytes, ReLU 96 bytes, the loss 4 x 96
    # bytes: 20.72 us; world + 1 = 5 of them
    assert parts["forward"] == pytest.approx(5 * 20.72)
    # per row: lr g streams 2 x 4 x 17 bytes at 8 GB/s (0.017 us), p - that 204 bytes, |g|^2 136 bytes
    assert parts["rows"] == pytest.approx(4 * (0.017 + 0.204 + 0.136))
    assert (parts["machinery"], parts["combine"]) == (50.0, pytest.approx(5.0))  # the mean rule's time, flat on this grid
    assert zeno_us(model, 4, 4, _Table(), 50.0, 2, rules) == pytest.approx(sum(parts.values()))
    # no rule times: the first pass from the table too, nothing for the combine
    bare = zeno_parts(model, 4, 4, _Table(), 50.0, 2)
    assert (bare["rows"], bare["combine"]) == (pytest.approx(4 * (0.204 + 0.204 + 0.136)), 0.0)


class _BusyTable:
    """The same op costs on a busy host, by hand: every GEMM 30 us, elementwise 3 us per 1,000 bytes."""

    def time_us(self, kind: str, point: tuple[float, ...]) -> float:
        return 3 * _Table().time_us(kind, point)


def test_zeno_forward_and_rows_from_the_corun_table() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    rules = RuleTimes(world=4, sizes=(1, 1000), us={"mean": [5.0, 5.0]}, stream_gbps=8.0, ops=_BusyTable())
    parts = zeno_parts(model, 4, 4, _Table(), 50.0, 2, rules)
    # the GEMMs and adds of test_zeno_parts_by_hand, priced from the co-run table (3x): 5 x (60 + 2.16) us
    assert parts["forward"] == pytest.approx(5 * 62.16)
    # per row: the first pass still at the busy host's streaming rate, then 3 x (0.204 + 0.136) us
    assert parts["rows"] == pytest.approx(4 * (0.017 + 0.612 + 0.408))
    assert (parts["machinery"], parts["combine"]) == (50.0, pytest.approx(5.0))


@pytest.mark.slow
def test_ops_timed_on_busy_cores() -> None:
    axes = {"matmul_nt": ((1, 16), (4, 64), (4, 64)), "elementwise": ((192, 12 << 10),)}
    table = time_ops(reps=2, corun=2, axes=axes)
    assert table.axes["matmul_nt"] == axes["matmul_nt"] and table.us["elementwise"].shape == (2,)
    assert 0.0 < table.time_us("matmul_nt", (4, 16, 16)) < table.time_us("matmul_nt", (16, 64, 64)) * 10
    assert 0.0 < table.time_us("elementwise", (3000,)) < 1e5


@pytest.mark.slow
def test_skeleton_and_stream_timed_on_busy_cores() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    assert 0.0 < time_skeleton(model, 4, 8, reps=3, corun=2) < 1e6
    rules = time_rules(4, sizes=(16, 64), reps=2, corun=2)
    assert rules.corun == 2 and rules.stream_gbps > 0.1
    assert all(len(v) == 2 and min(v) > 0 for v in rules.us.values())


# --------------------------------------------------------------------------- real ranks
@pytest.mark.multiproc
def test_four_gloo_ranks_one_bad() -> None:
    from trainsim.run.robust_worker import RobustRunConfig, run_robust

    # 100 steps of the benchmark's MLP: clean training reaches ~0.95 (0.97 at 150 steps); a sign-flipping
    # rank of four drives the plain mean uphill (NaN weights, ~0.1)
    # a fourth item is the case's own fault factor: a rank that sends zeros leaves the mean finite
    cfg = RobustRunConfig(steps=100, cases=[["allreduce", 1, "sign_flip"], ["median", 1, "sign_flip"],
                                            ["zeno", 1, "sign_flip"], ["mean", 1, "scale", 0.0]],
                          timing_rounds=0, eval_every=50)  # fmt: skip
    out = run_robust(cfg, timeout_s=240)
    by = {c["aggregator"]: c for c in out["cases"]}
    assert all(c["ranks_agree"] for c in out["cases"])
    # the accuracy curve: every 50 steps, its last point the final accuracy (evaluating does not move the run)
    assert [[n, a] for n, a, _ in by["median"]["curve"]] == [[50, pytest.approx(by["median"]["curve"][0][1])],
                                                              [100, by["median"]["test_acc"]]]  # fmt: skip
    assert by["mean"]["factor"] == 0.0 and by["mean"]["test_acc"] > 0.8 and by["median"]["factor"] == 10.0
    assert by["median"]["test_acc"] > 0.8 and by["zeno"]["test_acc"] > 0.8
    assert by["allreduce"]["test_acc"] < 0.5
    assert by["zeno"]["dropped"][3] == cfg.steps  # rank 3 dropped at every step
