"""Out-of-order backprop what-ifs: the simulated order is the runtime's, and the numbers add up."""

from __future__ import annotations

import pytest

from trainsim.capture.layerprofile import LayerProfile
from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import AlphaBeta
from trainsim.errors import UserError
from trainsim.graph.ir import ResourceKind
from trainsim.transform.ooo import (
    HostTerms,
    dp_graph,
    interpolated_terms,
    predict_dp,
    predict_multistream,
    search_k,
    search_schedule_map,
)


def _net(gbit_s: float = 1.0, latency_us: float = 100.0) -> AlphaBeta:
    return AlphaBeta(Link(name="t", bw_gbyte_s=gbit_s / 8, latency_us=latency_us))


def _profile(n: int = 5, fwd: float = 1000.0, param_bytes: int = 1_000_000) -> LayerProfile:
    rows = [
        {
            "name": f"l{i}",
            "fwd_us": fwd,
            "bwd_us": 2 * fwd,
            "bwd_input_us": fwd,
            "bwd_weight_us": fwd,
            "opt_us": 50.0,
            "pack_us": 0.0,
            "unpack_us": 0.0,
            "param_bytes": param_bytes,
            "out_bytes": 1000,
        }
        for i in range(n)
    ]
    return LayerProfile("synthetic", 1, 1, "test", {32: {"loss_us": 100.0, "layers": rows}})


def test_allreduce_order_is_the_wrappers_issue_order() -> None:
    prof = _profile()
    net = _net(1.0)
    for k, want in (
        (0, ["l4", "l3", "l2", "l1", "l0"]),
        (2, ["l4", "l3", "l2", "l0", "l1"]),
        (5, ["l0", "l1", "l2", "l3", "l4"]),
    ):
        g = dp_graph(prof, 32, k, net, steps=1)
        chan = next(i for i, r in enumerate(g.resources) if r.kind == ResourceKind.COMM_CHANNEL)
        q = [int(t) for t in g.queue_order() if g.resource[t] == chan]
        assert [g.symbols[g.layer[t]] for t in q] == want


def test_free_network_gives_the_compute_time() -> None:
    prof = _profile()
    net = _net(1e9, 0.0)
    compute_ms = (5 * (3 * 1000.0 + 50.0) + 100.0) / 1e3
    for k in range(6):
        assert predict_dp(prof, 32, k, net) == pytest.approx(compute_ms, rel=1e-6)


def test_comm_bound_reordering_helps_and_search_finds_it() -> None:
    prof = _profile()
    net = _net(4.0, 100.0)  # 1 MB in 2 ms: comparable with a layer's work
    best, pred = search_k(prof, 32, net)
    assert best > 0 and pred[best] < pred[0] * 0.97
    assert set(pred) == set(range(6))


def test_search_with_host_terms_per_k() -> None:
    """Host work that grows with k (``interpolated_terms``) moves the search: terms at k = 0 and k = n,
    linear between; with a large enough cost per reordered layer, k = 0 wins."""
    prof = _profile()
    net = _net(4.0, 100.0)
    lo, hi = HostTerms(factor=1.0, extra_us=0.0), HostTerms(factor=1.5, extra_us=5000.0)
    at = interpolated_terms(lo, hi, 5)
    assert at(0) == lo and at(5) == hi
    assert at(2).factor == pytest.approx(1.2) and at(2).extra_us == pytest.approx(2000.0)
    free, _ = search_k(prof, 32, net, host=lo)
    assert free > 0
    costly, pred = search_k(prof, 32, net, host=at)
    assert costly == 0
    assert pred[5] == pytest.approx(predict_dp(prof, 32, 5, net, host=hi))


def test_bad_k() -> None:
    with pytest.raises(UserError, match="has 5 layers"):
        predict_dp(_profile(), 32, 6, _net())
    with pytest.raises(UserError, match="bandwidth"):
        _net(0.0)


def test_multistream_overlaps_weight_gradients() -> None:
    prof = _profile()
    single = predict_multistream(prof, 32, None)
    assert single == pytest.approx((5 * 3050.0 + 100.0) / 1e3)
    smap, best = search_schedule_map(prof, 32)
    assert len(smap) == 5 and best < single
    with pytest.raises(UserError, match="defers W of layer 1 past"):
        predict_multistream(prof, 32, [("BWD", 0), ("FWD", 3), ("BWD", 2), ("BWD", 3), ("BWD", 4)])
    with pytest.raises(UserError, match="schedule map has 2 entries"):
        predict_multistream(prof, 32, [("BWD", 0), ("BWD", 1)])


def test_host_terms_stretch_compute_and_add_per_step_work() -> None:
    from trainsim.transform.ooo import HostTerms

    prof = _profile()
    net = _net(1e9, 0.0)
    compute_ms = (5 * (3 * 1000.0 + 50.0) + 100.0) / 1e3
    host = HostTerms(factor=1.5, extra_us=2000.0)
    for k in (0, 3):
        # every CPU task 1.5x slower, plus 2 ms per step that the factor does not stretch
        assert predict_dp(prof, 32, k, net, host=host) == pytest.approx(1.5 * compute_ms + 2.0, rel=1e-6)
    with pytest.raises(ValueError, match="HostTerms"):
        HostTerms(factor=0.0)


def test_the_runtime_s_extra_work_delays_the_last_all_reduce() -> None:
    """The extra work is spread over the step's CPU tasks, so the all-reduce issued last (and the step)
    ends later by about all of it, even where that all-reduce outlasts it (one task after the last
    issue would hide behind the transfer)."""
    prof = _profile()
    net = _net(8.0, 0.0)  # 1 ms per layer: the input layer's all-reduce is the tail
    plain = predict_dp(prof, 32, 0, net)
    assert plain == pytest.approx((5 * 3000.0 + 100.0 + 1000.0 + 5 * 50.0) / 1e3, rel=1e-6)
    slower = predict_dp(prof, 32, 0, net, host=HostTerms(factor=1.0, extra_us=500.0))
    # the tasks before the last issue and the updates after its end: all of the 0.5 ms (as one task
    # queued after the last issue it would have ended with that 1 ms all-reduce: +0)
    assert slower - plain == pytest.approx(0.5, rel=1e-6)
