"""Communication cost terms against hand-worked numbers, and the properties they must keep."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import UserError
from trainsim.plan.comm import (
    all_to_all_s,
    allgather_attention_s,
    collective_s,
    fsdp_pass_s,
    node_all_to_all_s,
    node_dispatch_copies,
    ring_attention_s,
    sharded_bytes,
)
from trainsim.plan.devices import homogeneous
from trainsim.plan.estimate import Strategy, estimate
from trainsim.plan.optime import DEFAULT_EFFICIENCY as EFF
from trainsim.plan.workload import Recompute, preset


def test_one_fsdp_layer_bytes_and_time() -> None:
    # one layer of 1e9 parameters, 16-bit, sharded over 8 GPUs of one A100 node (NVLink 300 GB/s, 0.65 of it):
    # each GPU receives the 7 shards it lacks: 2 B x 1e9 x 7/8 = 1.75 GB per all-gather
    t = sharded_bytes(params=1e9, shard=8, zero=3, reshard=True)
    assert (t.ag_fwd, t.ag_bwd, t.rs, t.step) == (1.75e9, 1.75e9, 1.75e9, 0.0)
    # 1.75e9 / (300e9 * 0.65) = 8.974 ms, plus 10 us x log2(16)/2 launch latency and 7 ring hops of 1 us
    expect = 1.75e9 / (300e9 * 0.65) + (10 * 0.5 * 4 + 7 * 1.0) * 1e-6
    assert collective_s(t.ag_fwd, 300.0, EFF, on_nvlink=True, n=8) == pytest.approx(expect, rel=1e-12)
    assert sharded_bytes(params=1e9, shard=8, zero=3, reshard=False).ag_bwd == 0.0  # kept from forward
    assert sharded_bytes(params=1e9, shard=8, zero=2) == (0.0, 0.0, 1.75e9, 1.75e9)  # RS per micro-batch, AG per step
    assert sharded_bytes(params=1e9, shard=8, zero=1) == (0.0, 0.0, 0.0, 3.5e9)  # RS + AG once per step
    assert sharded_bytes(params=1e9, shard=1, zero=3) == (0.0, 0.0, 0.0, 0.0)


def test_fsdp_prefetch_hides_what_fits_behind_compute() -> None:
    f, b = np.full(3, 1.0), np.full(3, 2.0)
    comm = np.full(3, 0.5)
    # forward: the first gather (0.5 s) is exposed, the next two hide behind 1 s layers
    # backward: the first gather again, then rs[l+1] + ag[l-1] <= 1 s hide behind 2 s layers, the last rs exposed
    assert fsdp_pass_s(f, b, comm, comm, zero=3, reshard=True, overlap=1.0) == (0.5, 1.0)
    assert fsdp_pass_s(f, b, comm, comm, zero=3, reshard=False, overlap=1.0) == (0.5, 0.5)
    # compute too short to hide anything: forward = 0.5 + (0.5 - 0.01) * 2
    tiny = np.full(3, 0.01)
    fwd, _ = fsdp_pass_s(tiny, tiny, comm, comm, zero=3, reshard=True, overlap=1.0)
    assert fwd == pytest.approx(0.5 + 2 * 0.49)
    assert fsdp_pass_s(f, b, 0 * comm, comm, zero=2, reshard=True, overlap=1.0) == (0.0, 0.5)


def test_one_all_to_all() -> None:
    # 1 GB sent over ep=16 with 8 ranks per node: 7/15 of it over NVLink (450 GB/s x 0.65), 8/15 over the
    # NIC (50 GB/s x 0.9), concurrently; the NIC side is slower: 0.5333e9 / 45e9 = 11.85 ms (+10 us)
    t = all_to_all_s(1e9, 16, 8, 450.0, 50.0, EFF)
    assert t == pytest.approx(1e9 * 8 / 15 / (50e9 * 0.9) + 10e-6, rel=1e-12)
    inside = all_to_all_s(1e9, 8, 8, 450.0, 50.0, EFF)  # the whole group in one node
    assert inside == pytest.approx(1e9 / (450e9 * 0.65) + 10e-6, rel=1e-12)
    assert all_to_all_s(1e9, 1, 8, 450.0, 50.0, EFF) == 0.0


def test_node_dispatch_copies_by_hand() -> None:
    """Expected copies per token of a node-deduplicating dispatch, worked out by hand (Monte Carlo of 4,096
    tokens with a fixed seed: within 0.03 of the exact value, and the same every call)."""
    # one node: nothing leaves it; the token reaches the other 7 GPUs' experts over NVLink
    one = node_dispatch_copies(8, 1, 8, 8)
    assert one.nic == 0.0 and one.nvlink == pytest.approx(7 / 8, abs=0.03)
    # 4 experts on 4 GPUs, 2 per node, top-1, token on GPU 0: the other node with p = 1/2 (network); GPU 1
    # with p = 1/4 (NVLink), GPU 3 with p = 1/4 (the network copy lands on GPU 2, which forwards it)
    d = node_dispatch_copies(4, 1, 4, 2)
    assert d.nic == pytest.approx(0.5, abs=0.03) and d.nvlink == pytest.approx(0.5, abs=0.03)
    assert node_dispatch_copies(4, 1, 4, 2) == d
    # top-2 of 8 experts on 2 single-GPU nodes (4 each): the other node is hit unless both picks stay home,
    # 1 - C(4,2)/C(8,2) = 22/28; group-limited to 1 of 2 groups (= nodes), only when that group is chosen: 1/2
    assert node_dispatch_copies(8, 2, 2, 1).nic == pytest.approx(22 / 28, abs=0.03)
    assert node_dispatch_copies(8, 2, 2, 1, groups=2, group_top_k=1).nic == pytest.approx(0.5, abs=0.03)


def test_node_all_to_all_by_hand() -> None:
    # the flat all-to-all would send 1 GB: top-2 copies, (ep-1)/ep = 15/16 of them leave the GPU, so one
    # token copy is 1e9 / (2 * 15/16) bytes; 1.5 of them cross the network (50 GB/s x 0.9), 3 go over NVLink
    d = node_dispatch_copies(16, 2, 16, 8)._replace(nic=1.5, nvlink=3.0)
    token = 1e9 / (2 * 15 / 16)
    want = max(token * 1.5 / (50e9 * 0.9), token * 3.0 / (450e9 * 0.65)) + 10e-6
    assert node_all_to_all_s(1e9, 16, d, 450.0, 50.0, EFF) == pytest.approx(want, rel=1e-12)
    assert node_all_to_all_s(1e9, 1, d, 450.0, 50.0, EFF) == 0.0


def test_node_dispatch_never_slower_than_flat_across_nodes() -> None:
    """DeepSeek-V3 on 1,024 H100 (EP 64 over 16 nodes): deduplicating per node and routing to 4 of 8 groups
    sends fewer bytes over the NIC than one copy per routed expert; within a node both are the same."""
    m = preset("deepseek-v3-like")
    cl = homogeneous("h100", 1024)
    flat = Strategy(dp=64, tp=2, pp=8, ep=64, micro_batch=1, zero=1, sequence_parallel=True)
    node = Strategy(dp=64, tp=2, pp=8, ep=64, micro_batch=1, zero=1, sequence_parallel=True, ep_dispatch="node")
    a = estimate(m, flat, cl, global_batch=8192).breakdown["ep_comm"]
    b = estimate(m, node, cl, global_batch=8192).breakdown["ep_comm"]
    assert 0 < b < 0.8 * a
    with pytest.raises(UserError, match="--ep-dispatch"):
        Strategy(dp=64, ep=64, ep_dispatch="deepep")


def test_ring_attention_steps() -> None:
    # cp=4: three steps per pass; each sends this rank's 100 MB of K/V at 50 GB/s x 0.9 = 2.232 ms (with 10 us)
    send = 1e8 / 45e9 + 10e-6
    hidden = ring_attention_s(1e8, 0.040, 4, 50.0, EFF, on_nvlink=False)  # 10 ms of attention per step
    assert hidden.steps == 3 and float(hidden.fwd) == 0.0 and float(hidden.bwd) == 0.0
    assert float(hidden.busy) == pytest.approx(3 * (send + (2e8 / 45e9 + 10e-6)))
    short = ring_attention_s(1e8, 0.001, 4, 50.0, EFF, on_nvlink=False)  # 0.25 ms of attention per step
    assert float(short.fwd) == pytest.approx(3 * (send - EFF.overlap * 0.00025))
    assert float(short.bwd) == pytest.approx(3 * (2e8 / 45e9 + 10e-6 - EFF.overlap * 0.00025 * 2.5))
    ag = allgather_attention_s(1e8, 4, 50.0, EFF, on_nvlink=False)  # gathers 3 chunks, exposed both ways
    assert float(ag.fwd) == float(ag.bwd) == pytest.approx(3e8 / 45e9 + (10 * 0.5 * 3 + 3) * 1e-6)


# ------------------------------------------------------------------------------- properties
_SMALL = preset("llama2-7b")
_STRATS = [
    Strategy(dp=16, zero=3, micro_batch=1),
    Strategy(dp=8, tp=2, zero=1, micro_batch=2, sequence_parallel=True),
    Strategy(dp=4, tp=2, pp=2, micro_batch=1, schedule="interleaved", virtual_stages=2, zero=2),
    Strategy(dp=4, cp=4, zero=3, reshard_after_forward=False, micro_batch=1),
    Strategy(dp=16, zero=3, shard_group=8, micro_batch=1, recompute=Recompute.FULL),
]


@settings(max_examples=30, deadline=None)
@given(
    which=st.integers(0, len(_STRATS) - 1),
    nic=st.floats(1.0, 100.0),
    more=st.floats(1.0, 8.0),
    nvl_more=st.floats(1.0, 4.0),
)
def test_more_bandwidth_never_slows_a_step(which: int, nic: float, more: float, nvl_more: float) -> None:
    s = _STRATS[which]
    slow = estimate(_SMALL, s, homogeneous("h100", 16, nic_gbps=nic), global_batch=32)
    fast = estimate(_SMALL, s, homogeneous("h100", 16, nic_gbps=nic * more, nvlink_gbps=450.0 * nvl_more), global_batch=32)
    assert fast.step_s <= slow.step_s * (1 + 1e-12)


def _fsdp_bytes_per_gpu(dp: int) -> float:
    e = estimate(preset("gpt3-1.3b"), Strategy(dp=dp, zero=3, micro_batch=1), homogeneous("a100-80gb", dp),
                 global_batch=2 * dp)  # fmt: skip
    t = next(t for t in e.terms if t.name == "fsdp_comm")
    return t.times * t.size_bytes / 2  # per micro-batch: the step runs 2 of them


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 4096), k=st.integers(1, 64))
def test_more_zero3_ranks_never_reduce_per_gpu_traffic(n: int, k: int) -> None:
    a = sharded_bytes(params=1e8, shard=n, zero=3)
    b = sharded_bytes(params=1e8, shard=n + k, zero=3)
    assert b.ag_fwd >= a.ag_fwd and b.rs >= a.rs


def test_zero3_communication_grows_with_dp() -> None:
    sizes = [_fsdp_bytes_per_gpu(dp) for dp in (2, 8, 64, 512)]
    assert sizes == sorted(sizes) and sizes[0] > 0
    m = preset("gpt3-175b")
    comm = []
    for dp in (8, 64, 1536):
        e = estimate(m, Strategy(dp=dp, zero=3, micro_batch=1, recompute=Recompute.FULL), homogeneous("a100-80gb", dp),
                     global_batch=dp)  # fmt: skip
        comm.append(e.breakdown["fsdp_comm"])
        t = next(t for t in e.terms if t.name == "fsdp_comm")
        assert t.busy_s > 0
    assert 0 < comm[0] <= comm[1] <= comm[2]


def test_fabric_bandwidth_by_span() -> None:
    """Rail-optimised: up to one leaf's nodes on the NIC's full rate, beyond it 1/oversubscription; one switch
    per node: every inter-node transfer crosses the spine."""
    from trainsim.plan.devices import homogeneous as hom

    rails = hom("h100", 1024, oversubscription=2.0).groups[0]
    assert rails.inter_node_gbps(32) == 50.0 and rails.inter_node_gbps(33) == 25.0
    tor = hom("h100", 1024, oversubscription=2.0, rail_optimized=False).groups[0]
    assert tor.inter_node_gbps(2) == 25.0
    assert hom("h100", 1024, rail_optimized=False).groups[0].inter_node_gbps(128) == 50.0  # non-blocking
    with pytest.raises(UserError, match=r"--oversubscription 0\.5"):
        hom("h100", 16, oversubscription=0.5)


def test_tapered_spine_slows_expert_all_to_all_across_leaves() -> None:
    """EP 16 spans 2 nodes: on rails they share a leaf, so a 2:1 spine taper changes nothing; with one switch
    per node, or with leaves of one node, the off-node half of the all-to-all runs at half the NIC rate."""
    from dataclasses import replace

    m = replace(preset("mixtral-8x7b"), experts=16)
    s = Strategy(dp=64, ep=16, micro_batch=1, zero=1)

    def ep_s(**fabric: object) -> float:
        return estimate(m, s, homogeneous("h100", 64, **fabric), global_batch=64).breakdown["ep_comm"]  # type: ignore[arg-type]

    flat = ep_s()
    assert ep_s(oversubscription=2.0) == flat
    no_rails, small_leaves = ep_s(oversubscription=2.0, rail_optimized=False), ep_s(oversubscription=2.0, leaf_nodes=1)
    assert no_rails == small_leaves > flat * 1.3


@settings(max_examples=30, deadline=None)
@given(which=st.integers(0, len(_STRATS) - 1), taper=st.floats(1.0, 4.0), rails=st.booleans())
def test_a_tapered_or_railless_fabric_never_speeds_a_step(which: int, taper: float, rails: bool) -> None:
    s = _STRATS[which]
    base = estimate(_SMALL, s, homogeneous("h100", 16, gpus_per_node=4), global_batch=32)
    worse = estimate(_SMALL, s, homogeneous("h100", 16, gpus_per_node=4, oversubscription=taper, rail_optimized=rails,
                                           leaf_nodes=2), global_batch=32)  # fmt: skip
    assert worse.step_s >= base.step_s * (1 - 1e-12)
