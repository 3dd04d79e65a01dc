"""The compression what-if on a synthetic profile, against a hand-computed timeline."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainsim.cluster.catalog import Link
from trainsim.compress.secopa import Linear, plan_gradients
from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, Steps, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.compression import CodecCost, CompressConfig, compression

MiB = 1 << 20
SHAPES = {"a.w": (512, 1024), "b.w": (512, 1024)}


def _profile(steps: int = 3):  # type: ignore[no-untyped-def]
    """Per step: fwd a 10, fwd b 10, bwd b 20, AccumulateGrad 1, bwd a 20, AccumulateGrad 1, opt 5 (us)."""
    from trainsim.transform.dataparallel import ParamInfo

    b = GraphBuilder("synthetic")
    cpu = b.resource("cpu:main", ResourceKind.CPU_THREAD)
    acc = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    for s in range(steps):
        b.task("ProfilerStep", TaskKind.CPU, cpu, 0.0, step=s)
        b.task("aten::linear", TaskKind.CPU, cpu, 10.0, step=s, layer="layer:a")
        b.task("aten::linear", TaskKind.CPU, cpu, 10.0, step=s, layer="layer:b")
        b.task("AddmmBackward0", TaskKind.CPU, cpu, 20.0, step=s, layer="layer:b")
        b.task("aten::add_", TaskKind.CPU, cpu, 1.0, step=s, op=acc)
        b.task("AddmmBackward0", TaskKind.CPU, cpu, 20.0, step=s, layer="layer:a")
        b.task("aten::add_", TaskKind.CPU, cpu, 1.0, step=s, op=acc)
        b.task("aten::add_", TaskKind.CPU, cpu, 5.0, step=s, op="Optimizer.step#SGD.step")
    g = b.build(
        Steps(
            ids=np.arange(steps, dtype=np.int32), start_us=np.zeros(steps), end_us=np.zeros(steps), anchor=0
        )
    )
    params = [ParamInfo(name="a.w", layer="a", numel=MiB // 2, size_bytes=2 * MiB),
              ParamInfo(name="b.w", layer="b", numel=MiB // 2, size_bytes=2 * MiB)]  # fmt: skip
    return g, params, ["a", "b"]


def _cost(summable: bool = False) -> CodecCost:
    return CodecCost(
        enc_us=lambda n: 10.0, dec_us=lambda n: 5.0, wire_bytes=lambda n: n // 8, summable=summable, low_rank=False,
        fits={"enc": Linear(0, 0.01, 0.01), "dec": Linear(0, 0.005, 0.005), "aggr": Linear(0, 0, 0), "ratio": 1 / 32},
    )  # fmt: skip


# wire per gradient: 65,536 + 8 (marker) bytes; all-gather of 2x that over 2 ranks moves 65,544 bytes: 1000 us
LINK = Link(name="test", bw_gbyte_s=0.065544, latency_us=0.0)


def test_allgather_timeline_by_hand() -> None:
    g, params, layers = _profile()
    out = compression(g, params, layers, SHAPES, CompressConfig(algorithm="onebit"), _cost(), LINK)
    res = simulate(out)
    # fwd 0-20, bwd b 20-40, acc 40-41, encode b 41-51, bwd a 51-71, acc 71-72, encode a 72-82;
    # all-gather b 51-1051, a 1051-2051; decode 2 x 5 us each: b 1051-1061, a 2051-2061; optimizer 2061-2066
    assert res.step_ms[0] * 1e3 == pytest.approx(2066.0)
    names = {out.task_name(int(t)) for t in np.flatnonzero(out.step == 0)}
    assert {"encode:bucket0", "allgather:compressed0", "decode:bucket1"} <= names


def test_the_other_ranks_parts_are_decoded_into_the_sum_at_their_own_cost() -> None:
    """A calibrated decode-and-add (``acc_us``, 8 us here) is charged for every part but the first:
    the same timeline as above with decodes of 5 + 8 us instead of 2 x 5."""
    g, params, layers = _profile()
    cost = dataclasses.replace(_cost(), acc_us=lambda n: 8.0)
    assert cost.sum_us(MiB, 1) == 5.0 and cost.sum_us(MiB, 3) == pytest.approx(5.0 + 2 * 8.0)
    res = simulate(compression(g, params, layers, SHAPES, CompressConfig(algorithm="onebit"), cost, LINK))
    assert res.step_ms[0] * 1e3 == pytest.approx(2066.0 + 3.0)


def test_hook_work_runs_inside_each_hook_before_its_transfer() -> None:
    """``hook_us`` splits over the buckets by their compressed elements (here 20 us each) and runs on
    the main thread before the bucket's encode, so the first transfer starts that much later."""
    g, params, layers = _profile()
    out = compression(g, params, layers, SHAPES, CompressConfig(algorithm="onebit", hook_us=40.0), _cost(), LINK)
    res = simulate(out)
    # hook b 41-61, encode b 61-71, bwd a 71-91, acc 91-92, hook a 92-112, encode a 112-122;
    # all-gather b 71-1071, a 1071-2071; decodes b 1071-1081, a 2071-2081; optimizer 2081-2086
    assert res.step_ms[0] * 1e3 == pytest.approx(2086.0)
    step0 = {out.task_name(int(t)): int(t) for t in np.flatnonzero(out.step == 0)}
    for b, (lo, hi) in enumerate(((41.0, 61.0), (92.0, 112.0))):
        hook, enc = step0[f"hook:bucket{b}"], step0[f"encode:bucket{b}"]
        assert (res.start_us[hook], res.end_us[hook]) == pytest.approx((lo, hi))
        assert res.start_us[enc] == pytest.approx(hi)
    with pytest.raises(UserError, match="hook_us"):
        CompressConfig(algorithm="onebit", hook_us=-1.0)


def _with_biases():  # type: ignore[no-untyped-def]
    """``_profile`` with a 1-D bias of 1 KiB per layer: each bucket has one gradient sent uncompressed."""
    from trainsim.transform.dataparallel import ParamInfo

    g, (a, b), layers = _profile()
    biases = [ParamInfo(name="a.b", layer="a", numel=256, size_bytes=1024),
              ParamInfo(name="b.b", layer="b", numel=256, size_bytes=1024)]  # fmt: skip
    return g, [a, biases[0], b, biases[1]], layers, {**SHAPES, "a.b": (256,), "b.b": (256,)}


def _ar(nbytes: float) -> float:
    return 400.0 + nbytes / 1000  # an all-reduce: 400 us of latency, 1 us per kB


def _ag(per_rank: float) -> float:
    return 200.0 + per_rank / 1000  # an all-gather: 200 us of latency


def test_gloo_runs_a_bucket_s_transfers_and_the_next_bucket_s_at_once() -> None:
    """Buckets [b.b, b.w] and [a.b, a.w]; the biases all-reduced (1,024 bytes: 401.024 us), the weights'
    wires all-gathered (65,544 bytes per rank: 265.544 us). Ready: all-reduce b 41, all-gather b 51
    (after its encode), all-reduce a 72, all-gather a 82.
    One lane (NCCL): one after another, 41-442.024-707.568-1108.592-1374.136; decode a 10 us, the
    optimizer 5: the step ends at 1389.136.
    gloo (2 lanes, the all-gathers by exchange on no worker thread): all four in flight together, each
    after the first adds its bytes to the chain: 442.024, 507.568, 508.592, 574.136; decode a ends
    584.136, the optimizer 589.136."""
    g, params, layers, shapes = _with_biases()
    times = {"allreduce_time": _ar, "allgather_time": _ag}
    cfg = CompressConfig(algorithm="onebit")
    one = compression(g, params, layers, shapes, cfg, _cost(), LINK, **times)
    assert simulate(one).step_ms[0] * 1e3 == pytest.approx(1389.136)
    two = compression(g, params, layers, shapes, dataclasses.replace(cfg, lanes=2), _cost(), LINK, **times)
    res = simulate(two)
    assert res.step_ms[0] * 1e3 == pytest.approx(589.136)
    comm = [int(t) for t in np.flatnonzero((two.kind == TaskKind.COMM) & (two.step == 0))]
    comm.sort(key=lambda t: res.start_us[t])
    assert [two.task_name(t) for t in comm] == ["allreduce:bucket0", "allgather:compressed0", "allreduce:bucket1",
                                                "allgather:compressed1"]  # fmt: skip
    assert res.end_us[comm] == pytest.approx([442.024, 507.568, 508.592, 574.136])
    assert simulate(two).step_ms == pytest.approx(res.step_ms)  # every step alike
    with pytest.raises(UserError, match="lanes"):
        CompressConfig(algorithm="onebit", lanes=0)


def test_a_third_collective_waits_for_one_of_gloo_s_two_threads() -> None:
    """A summable codec all-reduces its wire too: four collectives per step, ready at 41, 51, 72 and 82.
    The first ends at 442.024; the second (the 65,544-byte wire, 465.544 us alone) joins it and ends no
    sooner than 51 + 465.544 = 516.544; the third finds both threads busy, is issued when the first ends
    (442.024) and ends at 442.024 + 401.024 = 843.048; the fourth is issued at 516.544 and ends at
    982.088. Decode a 5 us, the optimizer 5: 992.088. On the old single queue: 1,829.136."""
    g, params, layers, shapes = _with_biases()
    cfg = CompressConfig(algorithm="fp16", lanes=2)
    out = compression(g, params, layers, shapes, cfg, _cost(summable=True), LINK, allreduce_time=_ar)
    res = simulate(out)
    assert res.step_ms[0] * 1e3 == pytest.approx(992.088)
    one = compression(g, params, layers, shapes, dataclasses.replace(cfg, lanes=1), _cost(summable=True), LINK,
                      allreduce_time=_ar)  # fmt: skip
    assert simulate(one).step_ms[0] * 1e3 == pytest.approx(41 + 2 * 401.024 + 2 * 465.544 + 5 + 5)


def test_ps_transfers_run_beside_the_bucket_s_plain_all_reduce() -> None:
    """PS, one partition, the point-to-point line (100 us, 0.001 us/byte): gather and broadcast 165.536 us
    each; the pipeline: encode 10, gather, the owner's sum and re-encode 20, broadcast, decode 5: 366.072
    us, of which 35 codec (half before, half after the transfer, on the main thread) and 331.072 transfer.
    gloo: all-reduce b 41-442.024; codec 41-58.5; the PS transfer, issued at 58.5, joins the all-reduce's
    chain with its 65,536 wire bytes (65.536 us): ends at 507.56; codec 507.56-525.06, backward a and its
    AccumulateGrad to 546.06; all-reduce a 546.06-947.084 (a new chain); codec 546.06-563.56; transfer a
    ends at 1012.62; codec to 1030.12, the optimizer 1035.12. One queue: 1566.192. The ring scheme keeps
    its one queue."""
    g, params, layers, shapes = _with_biases()
    cfg = CompressConfig(algorithm="onebit", scheme="ps")
    line = (100.0, 0.001)
    one = compression(g, params, layers, shapes, cfg, _cost(), LINK, allreduce_time=_ar, p2p=line)
    assert simulate(one).step_ms[0] * 1e3 == pytest.approx(1566.192)
    two = compression(g, params, layers, shapes, dataclasses.replace(cfg, lanes=2), _cost(), LINK, allreduce_time=_ar,
                      p2p=line)  # fmt: skip
    res = simulate(two)
    assert res.step_ms[0] * 1e3 == pytest.approx(1035.12)
    xfer = [t for t in np.flatnonzero(two.step == 0) if two.task_name(int(t)).startswith("casync-ps:")]
    assert sorted(res.end_us[xfer]) == pytest.approx([507.56, 1012.62])
    ring = CompressConfig(algorithm="onebit", scheme="ring")
    a = compression(g, params, layers, shapes, ring, _cost(), LINK, allreduce_time=_ar)
    b = compression(g, params, layers, shapes, dataclasses.replace(ring, lanes=2), _cost(), LINK, allreduce_time=_ar)
    assert b.dur_us == pytest.approx(a.dur_us)


def test_summable_codec_all_reduces_once_and_decodes_once() -> None:
    g, params, layers = _profile()
    out = compression(g, params, layers, SHAPES, CompressConfig(algorithm="fp16"), _cost(summable=True), LINK)
    comm = [out.task_name(int(t)) for t in np.flatnonzero((out.kind == TaskKind.COMM) & (out.step == 0))]
    assert comm == ["allreduce:compressed0", "allreduce:compressed1"]
    # the wire is summed by the all-reduce and decoded once: a decode-and-add changes nothing
    acc = dataclasses.replace(_cost(summable=True), acc_us=lambda n: 8.0)
    with_acc = compression(g, params, layers, SHAPES, CompressConfig(algorithm="fp16"), acc, LINK)
    assert simulate(with_acc).step_ms[0] == pytest.approx(simulate(out).step_ms[0])


def test_plan_sends_uncompressed_gradients_by_all_reduce() -> None:
    g, params, layers = _profile()
    k = _cost().fits
    from trainsim.compress.secopa import Constants

    consts = Constants(enc=k["enc"], dec=k["dec"], aggr=k["aggr"], gather=Linear(1e9, 0, 0), bcast=Linear(1e9, 0, 0),
                       send=Linear(1e9, 0, 0))  # fmt: skip
    plan = plan_gradients(
        [("a.w", MiB // 2), ("b.w", MiB // 2)], "onebit", 1 / 32, consts, topology="ps", world_size=2
    )
    plan.gradients["a.w"] = type(plan.gradients["a.w"])(
        "a.w", MiB // 2, False, 1
    )  # the user edits a.w to "no"
    out = compression(g, params, layers, SHAPES, CompressConfig(algorithm="onebit", plan=plan), _cost(), LINK)
    comm = [out.task_name(int(t)) for t in np.flatnonzero((out.kind == TaskKind.COMM) & (out.step == 0))]
    assert comm == ["allgather:compressed0", "allreduce:bucket1"]


def test_ps_scheme_blocks_the_main_thread() -> None:
    g, params, layers = _profile()
    fast = compression(g, params, layers, SHAPES, CompressConfig(algorithm="onebit"), _cost(), LINK)
    ps = compression(
        g, params, layers, SHAPES, CompressConfig(algorithm="onebit", scheme="ps"), _cost(), LINK
    )
    main = ps.resources.index(next(r for r in ps.resources if r.name == "cpu:main"))
    on_main = np.flatnonzero((ps.resource == main) & (ps.step == 0))
    names = [ps.task_name(int(t)) for t in on_main]
    assert "casync-ps-codec:bucket0" in names and "casync-ps-codec:bucket0.2" in names
    res = simulate(ps)
    xfer = next(t for t in range(ps.n_tasks) if ps.task_name(t) == "casync-ps:bucket0" and ps.step[t] == 0)
    assert ps.resources[int(ps.resource[xfer])].kind == ResourceKind.COMM_CHANNEL
    # the main thread is blocked: the codec's second half, and everything after it on the thread,
    # start once the transfers are done
    second = next(int(t) for t in on_main if ps.task_name(int(t)) == "casync-ps-codec:bucket0.2")
    assert res.start_us[second] >= res.end_us[xfer] - 1e-6
    later = [int(t) for t in on_main if ps.order[t] > ps.order[second]]
    assert later and min(res.start_us[later]) >= res.end_us[second] - 1e-6
    assert res.step_ms[0] > 0 and simulate(fast).step_ms[0] > 0


def test_ddp_finalize_follows_the_last_decode() -> None:
    """DDP's copy of the buckets back into the gradients waits for the last bucket's future, decode
    included: the timeline of ``test_allgather_timeline_by_hand`` with 30 us of DDP's work, 12 of them
    after the decodes."""
    g, params, layers = _profile()
    cfg = CompressConfig(algorithm="onebit", host_overhead_us=30.0, finalize_us=12.0)
    out = compression(g, params, layers, SHAPES, cfg, _cost(), LINK)
    res = simulate(out)
    # 18 us before a's AccumulateGrad move encode a to 90-100, but the link is busy until 1051 anyway;
    # decode a 2051-2061, finalize 2061-2073, optimizer 2073-2078
    assert res.step_ms[0] * 1e3 == pytest.approx(2078.0)
    fin = [t for t in np.flatnonzero(out.step == 0) if out.task_name(int(t)) == "ddp:finalize"]
    assert len(fin) == 1 and res.start_us[fin[0]] == pytest.approx(2061.0)
    with pytest.raises(UserError, match="finalize_us"):
        CompressConfig(algorithm="onebit", host_overhead_us=10.0, finalize_us=-1.0)


def test_bad_config() -> None:
    with pytest.raises(UserError, match="scheme"):
        CompressConfig(algorithm="onebit", scheme="tree")
    with pytest.raises(UserError, match="world"):
        CompressConfig(algorithm="onebit", world=1)
    g, params, layers = _profile()
    with pytest.raises(UserError, match="no shape"):
        compression(g, params, layers, {}, CompressConfig(algorithm="onebit"), _cost(), LINK)


def test_casync_cost_by_hand() -> None:
    from trainsim.transform.compression import casync_us

    # PS, N=2, K=2, m=2^20: partitions of 2^19 elements, wire 2^16 bytes at 65.544 B/us -> 999.9 us
    # per gather and per bcast phase (busiest owner owns 1 partition, N-1 = 1 wire), 500 us per
    # partition; enc 10, dec 5 per partition. The pipeline: encodes end at 10 and 20, gathers 10-510 and
    # 510-1010; partition 0 summed by its owner 510-530 (2 dec + enc), partition 1 by the other
    # 1010-1030; broadcasts 1010-1510 and 1510-2010; decodes end at 1515 and 2015
    t = (1 << 16) / 65.544 / 2
    us = casync_us(MiB, 2, 2, _cost(), LINK, "ps")
    assert us == pytest.approx(10 + 4 * t + 5)
    assert us < 4 * t + 50.0  # the serial sum of the codec work (50 us) and the two phases
    # one partition: nothing to overlap, the serial sum (enc, gather of 2^17 bytes, 2 dec + enc, bcast, dec)
    assert casync_us(MiB, 1, 2, _cost(), LINK, "ps") == pytest.approx(10 + 4 * t + 20 + 4 * t + 5)
    with pytest.raises(UserError):
        casync_us(MiB, 1, 2, _cost(), LINK, "tree")


def test_ps_partitions_pay_the_duplex_factor() -> None:
    """N = 2: with one partition the owner only receives (gather) and only sends (broadcast); with two,
    each rank sends and receives at once in both phases, at ``duplex`` times the one-way cost."""
    from trainsim.transform.compression import casync_parts, ps_phases_us, ps_pipeline_us

    line = (100.0, 0.01)  # us, us per byte
    one = sum(ps_phases_us(MiB, 1, 2, _cost(), lines=(line, line), duplex=1.7))
    two = sum(ps_phases_us(MiB, 2, 2, _cost(), lines=(line, line), duplex=1.7))
    wire = _cost().wire_bytes(MiB)
    half = _cost().wire_bytes(MiB // 2)
    assert one == pytest.approx(2 * (wire * 0.01 + 100.0))
    assert two == pytest.approx(2 * (half * 0.01 * 1.7 + 2 * 100.0))
    full_duplex = sum(ps_phases_us(MiB, 2, 2, _cost(), lines=(line, line), duplex=1.0))
    assert full_duplex < two < one
    # casync_parts: the codec, and what the pipeline of the partitions adds beyond it
    comp, xfer = casync_parts(MiB, 2, 2, _cost(), LINK, "ps", p2p=line, duplex=1.7)
    assert comp == pytest.approx(50.0)
    assert comp + xfer == pytest.approx(ps_pipeline_us(2, 2, 10.0, 5.0, two / 2, two / 2))
    # measured gather and broadcast lines replace the point-to-point line in their phases
    lines = ((200.0, 0.012), (150.0, 0.011))
    g, b = ps_phases_us(MiB, 2, 2, _cost(), lines=lines, duplex=1.7)
    assert (g, b) == pytest.approx((half * 0.012 * 1.7 + 2 * 200.0, half * 0.011 * 1.7 + 2 * 150.0))
    comp, xfer = casync_parts(MiB, 2, 2, _cost(), LINK, "ps", p2p=line, duplex=1.7, ps_lines=lines)
    assert comp + xfer == pytest.approx(ps_pipeline_us(2, 2, 10.0, 5.0, g, b))


def test_ps_pipeline_hides_the_codec_behind_the_other_partitions() -> None:
    """``ps_pipeline_us`` by hand, N = 2, K = 4, enc 10, dec 5 (owner's sum 2 dec + enc = 20), 100 us per
    partition per phase: encodes end at 10, 20, 30, 40; gathers 10-110, 110-210, 210-310, 310-410;
    owned partitions 0 and 2 summed 110-130 and 310-330, the others' 0 and 2 ready at 230 and 430;
    broadcasts 410-510, 510-610, 610-710, 710-810; decodes end at 515, 615, 715, 815."""
    from trainsim.transform.compression import ps_pipeline_us

    assert ps_pipeline_us(4, 2, 10.0, 5.0, 400.0, 400.0) == pytest.approx(815.0)
    # one partition: the serial sum; slow codec, fast network: the codec bounds it
    assert ps_pipeline_us(1, 2, 10.0, 5.0, 400.0, 400.0) == pytest.approx(10 + 400 + 20 + 400 + 5)
    assert ps_pipeline_us(4, 2, 1000.0, 5.0, 4.0, 4.0) >= 4 * 1000.0 + 2 * 1010.0


def test_ps_pipeline_charges_the_transfers_cpu_that_overlaps_the_codec() -> None:
    """``xfer_cpu_us`` by hand, N = 2, K = 2, enc 10, dec 5, 200 us per partition per phase: encodes
    0-10 and 10-20; gathers 10-210 and 210-410; partition 0 served 210-230; broadcasts 410-610 and
    610-810; decodes 610-615 and 810-815 (span 815). The transfers overlap the codec by 10 (the
    second encode), 20 (the serving), 0 and 5 (the first decode): each adds that much, at most
    ``xfer_cpu_us``; one partition waits for every transfer and is unchanged."""
    from trainsim.transform.compression import casync_parts, ps_pipeline_us

    assert ps_pipeline_us(2, 2, 10.0, 5.0, 400.0, 400.0) == pytest.approx(815.0)
    assert ps_pipeline_us(2, 2, 10.0, 5.0, 400.0, 400.0, xfer_cpu_us=100.0) == pytest.approx(815.0 + 10 + 20 + 5)
    assert ps_pipeline_us(2, 2, 10.0, 5.0, 400.0, 400.0, xfer_cpu_us=8.0) == pytest.approx(815.0 + 8 + 8 + 5)
    assert ps_pipeline_us(1, 2, 10.0, 5.0, 400.0, 400.0, xfer_cpu_us=100.0) == pytest.approx(10 + 400 + 20 + 400 + 5)
    # through casync_parts: a line of host CPU per send or receive; none given, none charged
    line = (50.0, 2.0 / 1024)
    plain = casync_parts(MiB, 2, 2, _cost(), LINK, "ps", p2p=line)
    same = casync_parts(MiB, 2, 2, _cost(), LINK, "ps", p2p=line, xfer_cpu=(0.0, 0.0))
    dear = casync_parts(MiB, 2, 2, _cost(), LINK, "ps", p2p=line, xfer_cpu=(1e6, 0.0))
    assert same == plain and dear[0] == plain[0] and dear[1] > plain[1]


def test_codec_time_per_step_by_hand() -> None:
    from trainsim.transform.compression import codec_us_per_step

    _, params, _ = _profile()
    cfg = CompressConfig(algorithm="onebit")
    # two compressed gradients, each encode 10 us + world x decode 5 us
    assert codec_us_per_step(params, SHAPES, cfg, _cost(), LINK, world=1) == pytest.approx(2 * (10 + 5))
    assert codec_us_per_step(params, SHAPES, cfg, _cost(), LINK, world=2) == pytest.approx(2 * (10 + 2 * 5))
    assert codec_us_per_step(params, SHAPES, cfg, _cost(summable=True), LINK, world=2) == pytest.approx(2 * 15)
    ps = CompressConfig(algorithm="onebit", scheme="ps")
    # PS, one partition, one rank: encode, decode the one part and re-encode, decode: 10 + (5 + 10) + 5
    assert codec_us_per_step(params, SHAPES, ps, _cost(), LINK, world=1) == pytest.approx(2 * 30)
    # with a decode-and-add of 8 us: the other rank's part costs that (all-gather, PS owner, ring hop)
    acc = dataclasses.replace(_cost(), acc_us=lambda n: 8.0)
    assert codec_us_per_step(params, SHAPES, cfg, acc, LINK, world=2) == pytest.approx(2 * (10 + 5 + 8))
    assert codec_us_per_step(params, SHAPES, ps, acc, LINK, world=2) == pytest.approx(2 * (10 + (5 + 8 + 10) + 5))
    ring = CompressConfig(algorithm="onebit", scheme="ring")
    # ring, N = 2, one partition: one hop (encode, decode-and-add), the final encode, 2 decodes
    assert codec_us_per_step(params, SHAPES, ring, acc, LINK, world=2) == pytest.approx(2 * ((10 + 8) + 10 + 2 * 5))


def test_codec_cost_from_samples_fits_the_mean_of_the_processes() -> None:
    a = {"enc_ms": [1.0, 3.0], "dec_ms": [0.5, 1.5], "add_ms": [0.1, 0.3]}
    b = {"enc_ms": [3.0, 5.0], "dec_ms": [0.5, 1.5], "add_ms": [0.1, 0.3]}
    cost = CodecCost.from_samples("fp16", [1000, 2000], [a, b], {})
    assert cost.enc_us(1000) == pytest.approx(2000.0) and cost.enc_us(2000) == pytest.approx(4000.0)
    assert cost.dec_us(2000) == pytest.approx(1500.0) and cost.wire_bytes(1000) == 2000
    assert cost.acc_us is None and cost.dec_add_us(2000) == pytest.approx(1500.0)  # samples without it
    cost = CodecCost.from_samples("fp16", [1000, 2000], [{**a, "acc_ms": [0.6, 2.0]}, {**b, "acc_ms": [0.8, 2.2]}], {})
    assert cost.dec_add_us(1000) == pytest.approx(700.0) and cost.dec_add_us(2000) == pytest.approx(2100.0)
    assert cost.sum_us(2000, 2) == pytest.approx(1500.0 + 2100.0)
