"""The analytic estimate: accuracy on the Megatron rows, schedules, errors, simulation check."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.errors import UserError
from trainsim.plan.calibrate import MEGATRON_TABLE1, load_csv, predict_row
from trainsim.plan.devices import gpu, homogeneous, parse_groups
from trainsim.plan.estimate import Strategy, estimate, resolve_world
from trainsim.plan.simcheck import TORCH_SCHEDULE, schedule_actions, simulate_plan
from trainsim.plan.workload import Recompute, preset


@pytest.mark.parametrize("row", MEGATRON_TABLE1[::3], ids=lambda r: f"{r.params_billion}B")
def test_megatron_rows_within_10_percent(row) -> None:  # type: ignore[no-untyped-def]
    e = predict_row(row)
    assert e.fits
    assert e.hardware_tflops_per_gpu == pytest.approx(row.tflops_per_gpu, rel=0.10)


def test_embedded_rows_match_shared_csv() -> None:
    import pathlib

    p = pathlib.Path(__file__).parents[3] / "shared" / "groundtruth" / "megatron_table1.csv"
    if not p.exists():
        pytest.skip("shared ground truth not present")
    assert load_csv(str(p)) == MEGATRON_TABLE1


def test_bubble_shrinks_with_interleaving_and_zero_bubble() -> None:
    m, cl = preset("gpt3-175b"), homogeneous("a100-80gb", 1024)
    steps = {}
    for sch, v in (("1f1b", 1), ("interleaved", 3), ("zb", 1)):
        s = Strategy(dp=16, tp=8, pp=8, micro_batch=1, schedule=sch, virtual_stages=v, recompute=Recompute.FULL)
        steps[sch] = estimate(m, s, cl, global_batch=1536).breakdown["pipeline_bubble"]
    assert steps["1f1b"] > steps["zb"] > 0 and steps["1f1b"] > steps["interleaved"] > 0


def test_breakdown_sums_to_step() -> None:
    e = estimate(preset("llama2-7b"), Strategy(dp=4, tp=2, pp=2, micro_batch=1, zero=1), homogeneous("h100", 16),
                 global_batch=64)
    assert sum(e.breakdown.values()) == pytest.approx(e.step_s)
    assert e.model_tflops_per_gpu <= e.hardware_tflops_per_gpu
    assert 0 < e.mfu < 1


@pytest.mark.parametrize(("sch", "v"), [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb", 1)])
def test_simulation_agrees_with_closed_form(sch: str, v: int) -> None:
    m, cl = preset("gpt3-1.3b"), homogeneous("a100-80gb", 8)
    e = estimate(m, Strategy(dp=2, pp=4, micro_batch=1, schedule=sch, virtual_stages=v), cl, global_batch=32)
    chk = simulate_plan(m, cl, e, global_batch=32)
    assert abs(chk.rel_diff) < 0.03


def test_schedule_actions_are_torchs_and_complete() -> None:
    """The check runs torch's own compute order: every micro-batch's forward and backward on every virtual
    stage, once, under torch's schedule name for the planner's."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    for sch, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb", 1)):
        assert get_schedule_class(TORCH_SCHEDULE[sch]) is not None
        acts = schedule_actions(sch, 4, 8, v)
        assert sorted(acts) == [0, 1, 2, 3]
        for r, mine in acts.items():
            kinds = [a.computation_type.value for a in mine]
            stages = {r + c * 4 for c in range(v)}
            fwd = [(a.stage_index, a.microbatch_index) for a in mine if a.computation_type.value == "F"]
            assert sorted(fwd) == sorted((st, j) for st in stages for j in range(8))
            assert kinds.count("B") + kinds.count("I") == 8 * v
            assert kinds.count("W") == (8 * v if sch == "zb" else 0)
    # 1F1B on 4 ranks: the last rank alternates from its first micro-batch, the first one runs ahead
    last = [str(a) for a in schedule_actions("1f1b", 4, 8)[3]]
    assert last[:4] == ["3F0", "3B0", "3F1", "3B1"]
    # one stage: forward then backward of each micro-batch, whatever the schedule
    assert [str(a) for a in schedule_actions("zb", 1, 2)[0]] == ["0F0", "0B0", "0F1", "0B1"]


def test_zero_bubble_check_runs_torchs_weight_gradient_order() -> None:
    """zb simulates torch's InterleavedZeroBubble order as listed (its W placed by torch), which lands on the
    closed form's bubble within 0.2 % for GPT-3 175B at pp 8 (the earlier priority-floating W: -0.43 %)."""
    m, cl = preset("gpt3-175b"), homogeneous("a100-80gb", 1024)
    s = Strategy(dp=16, tp=8, pp=8, micro_batch=1, schedule="zb", recompute=Recompute.FULL)
    e = estimate(m, s, cl, global_batch=1536)
    assert abs(simulate_plan(m, cl, e, global_batch=1536).rel_diff) < 0.002


def test_bad_input() -> None:
    with pytest.raises(UserError, match="does not divide --gpus 1000"):
        resolve_world(1000, 8, 8, 1)
    with pytest.raises(UserError, match="unknown GPU 'b300'"):
        gpu("b300")
    with pytest.raises(UserError, match="not divisible by dp"):
        estimate(preset("gpt3-1.3b"), Strategy(dp=3), homogeneous("a100-80gb", 3), global_batch=16)
    with pytest.raises(UserError, match="NAME:COUNT"):
        parse_groups(["a100"])


def test_model_flops_over_step_and_gpus_is_the_reported_tflops() -> None:
    """Physical consistency, including context parallelism (the cp factor was missing) and both conventions."""
    from dataclasses import replace

    from trainsim.plan.estimate import with_attn_flops
    from trainsim.plan.workload import AttnFlops

    m = replace(preset("llama3-405b"), seq=131072)
    s = Strategy(dp=8, tp=8, pp=16, cp=16, micro_batch=1, schedule="interleaved", virtual_stages=7,
                 recompute=Recompute.FULL, sequence_parallel=True, zero=1)  # fmt: skip
    e = estimate(m, s, homogeneous("h100", 16384), global_batch=128)
    assert e.model_flops == pytest.approx(m.model_flops_per_sample() * 128)
    assert e.model_flops / e.step_s / e.gpus_used / 1e12 == pytest.approx(e.model_tflops_per_gpu, rel=1e-12)
    assert 0.2 < e.mfu < 0.6 and e.fits
    assert e.breakdown["compute"] < e.step_s
    c = with_attn_flops(e, m, AttnFlops.CAUSAL, 128)
    assert c.model_flops == pytest.approx(m.model_flops_per_sample(AttnFlops.CAUSAL) * 128)
    assert c.model_flops / c.step_s / c.gpus_used / 1e12 == pytest.approx(c.model_tflops_per_gpu, rel=1e-12)
    assert c.model_tflops_per_gpu < e.model_tflops_per_gpu  # attention is most of the work at 128k


def test_terms_add_up_to_the_step() -> None:
    cases = [
        (preset("gpt3-1.3b"), Strategy(dp=8, zero=3, micro_batch=2), homogeneous("a100-80gb", 8), 32),
        (preset("llama2-7b"), Strategy(dp=4, tp=2, pp=2, micro_batch=1, schedule="interleaved", virtual_stages=2,
                                       zero=1, sequence_parallel=True), homogeneous("h100", 16), 32),  # fmt: skip
        (preset("mixtral-8x7b"), Strategy(dp=16, ep=8, zero=1, recompute=Recompute.FULL), homogeneous("h100", 16), 32),
    ]
    for m, s, cl, gb in cases:
        e = estimate(m, s, cl, global_batch=gb)
        assert sum(t.seconds for t in e.terms) == pytest.approx(e.step_s)
        assert sum(e.breakdown.values()) == pytest.approx(e.step_s)


def test_expert_all_to_all_within_and_across_nodes() -> None:
    m = preset("mixtral-8x7b")
    within = estimate(m, Strategy(dp=16, ep=8, zero=1), homogeneous("h100", 16), global_batch=32)
    across = estimate(m, Strategy(dp=16, ep=8, zero=1), homogeneous("h100", 16, gpus_per_node=4), global_batch=32)
    assert 0 < within.breakdown["ep_comm"] < across.breakdown["ep_comm"]
    assert within.memory["weights"] < estimate(m, Strategy(dp=16, ep=1, zero=1), homogeneous("h100", 16),
                                               global_batch=32).memory["weights"]  # fmt: skip


def test_sharding_variants_trade_memory_for_traffic() -> None:
    m, cl = preset("llama2-7b"), homogeneous("h100", 16)
    mem, comm = {}, {}
    for name, s in {
        "zero1": Strategy(dp=16, zero=1), "zero2": Strategy(dp=16, zero=2), "zero3": Strategy(dp=16, zero=3),
        "noreshard": Strategy(dp=16, zero=3, reshard_after_forward=False),
        "hybrid": Strategy(dp=16, zero=3, shard_group=8),
    }.items():  # fmt: skip
        e = estimate(m, s, cl, global_batch=64)
        mem[name] = e.memory["weights"] + e.memory["grads"] + e.memory["optimizer"]
        comm[name] = sum(t.busy_s for t in e.terms if t.name in ("fsdp_comm", "dp_sync_exposed"))
    assert mem["zero3"] < mem["hybrid"] < mem["zero2"] < mem["zero1"]
    assert mem["zero3"] < mem["noreshard"]
    assert comm["zero3"] > comm["noreshard"] > comm["zero1"]


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        (dict(dp=2, pp=2, zero=3), "--zero 3 with --pp 2"),
        (dict(dp=4, ep=3), "--ep 3 does not divide dp=4"),
        (dict(dp=4, zero=3, shard_group=3), "--shard-group 3 does not divide dp\\*cp = 4"),
        (dict(dp=4, zero=1, shard_group=2), "--shard-group applies to ZeRO-3"),
        (dict(dp=4, cp_mode="ulysses"), "--cp-mode 'ulysses'"),
    ],
)
def test_strategies_that_cannot_exist(kw: dict, msg: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UserError, match=msg):
        Strategy(**kw)


def test_out_of_memory_says_by_how_much_and_which_term() -> None:
    e = estimate(preset("gpt3-175b"), Strategy(dp=8, zero=3, micro_batch=1), homogeneous("a100-80gb", 8), global_batch=8)
    assert not e.fits
    assert "GiB over (largest term: activations" in e.overflow


def test_fp8_and_overlapped_communication_are_what_ifs() -> None:
    m, cl = preset("llama2-7b"), homogeneous("h100", 16)
    base = Strategy(dp=2, tp=8, micro_batch=1, sequence_parallel=True, zero=1)
    bf16 = estimate(m, base, cl, global_batch=16)
    fp8 = estimate(m, replace(base, precision="fp8"), cl, global_batch=16)
    ovl = estimate(m, replace(base, comm_overlap=True), cl, global_batch=16)
    assert fp8.breakdown["compute"] < bf16.breakdown["compute"]
    assert fp8.model_tflops_per_gpu > bf16.model_tflops_per_gpu and fp8.mfu > bf16.mfu  # MFU stays on the bf16 peak
    assert 0 <= ovl.breakdown["tp_comm"] < bf16.breakdown["tp_comm"]  # hidden up to `overlap` of the GEMMs
    with pytest.raises(UserError, match="a100-80gb has no FP8 tensor cores"):
        estimate(m, replace(base, precision="fp8"), homogeneous("a100-80gb", 16), global_batch=16)
    with pytest.raises(UserError, match="--precision 'fp4'"):
        Strategy(precision="fp4")


def test_wide_heads_count_their_own_width() -> None:
    from trainsim.plan.workload import Transformer

    m = Transformer(arch="llama", layers=2, hidden=2048, heads=32, kv_heads=4, head_size=128, seq=4096, vocab=1000,
                    ffn_hidden=6144)  # fmt: skip
    # q and o projections are 2048 x 4096 (32 heads of 128), k and v 2048 x 512
    assert m._attn_norm_params() == 2048 * (4096 + 2 * 512) + 4096 * 2048 + 2 * 2048
    assert m.core_flops(1) == 4.0 * 4096 * 4096 * 4096


def test_attention_kernel_matters_at_long_context() -> None:
    """FlashAttention-2 on H100 (torch SDPA's default there) against the Hopper kernel: the step at 64k
    context, where attention is most of the work, is much slower; at 2k it barely moves."""
    cl = homogeneous("h100", 8)

    def step(seq: int, kernel: str) -> float:
        m = replace(preset("llama3-8b"), seq=seq)
        s = Strategy(dp=8, zero=3, recompute=Recompute.FULL, attn_kernel=kernel)
        return estimate(m, s, cl, global_batch=8).step_s

    long_ratio = step(65536, "fa2") / step(65536, "fa3")
    short_ratio = step(2048, "fa2") / step(2048, "fa3")
    assert 1.3 < long_ratio < 0.638 / 0.333
    assert 1.0 < short_ratio < 1.1
    with pytest.raises(UserError, match="--attn-kernel 'fa9'"):
        Strategy(attn_kernel="fa9")


def test_eager_kernels_slow_a_llama_step() -> None:
    """--kernels eager (no torch.compile) costs a Llama step its extra memory passes; GPT barely moves."""
    cl = homogeneous("h100", 8)
    s = Strategy(dp=8, zero=3, recompute=Recompute.SELECTIVE)
    llama = preset("llama3-8b")
    fused, eager = (estimate(llama, replace(s, kernels=k), cl, global_batch=16).step_s for k in ("fused", "eager"))
    assert 1.03 < eager / fused < 1.3
    gpt = replace(preset("gpt3-1.3b"), flash_attention=True)
    g_fused, g_eager = (estimate(gpt, replace(s, kernels=k), cl, global_batch=16).step_s for k in ("fused", "eager"))
    assert g_eager == g_fused
    with pytest.raises(UserError, match="--kernels 'jit'"):
        Strategy(kernels="jit")


def test_expert_all_to_all_overlap_by_hand() -> None:
    """ep_overlap: the all-to-all hides behind another micro-batch's compute up to ``overlap`` of it; under the
    node dispatch DeepEP's kernels also take 20 of the H100's 132 SMs from the compute they overlap."""
    from trainsim.plan.estimate import DEEPEP_SM_SHARE
    from trainsim.plan.optime import DEFAULT_EFFICIENCY as eff

    m, cl = preset("deepseek-v3-like"), homogeneous("h100", 64)
    for dispatch in ("node", "flat"):
        s = Strategy(dp=64, ep=64, zero=1, ep_dispatch=dispatch)
        plain = estimate(m, s, cl, global_batch=64)
        ov = estimate(m, replace(s, ep_overlap=True), cl, global_batch=64)
        t = {x.name: x for x in plain.terms}
        busy, comp = t["ep_comm"].busy_s, t["compute"].seconds
        sort = t["ep_comm"].seconds - busy  # the flat dispatcher's local sort (4 experts per GPU), never hidden
        assert sort == pytest.approx(0.0, abs=1e-12) if dispatch == "node" else sort > 0.0
        hidden = max(busy * (1 - eff.overlap), busy - eff.overlap * comp)
        share = DEEPEP_SM_SHARE * min(busy, comp) if dispatch == "node" else 0.0
        assert {x.name: x for x in ov.terms}["ep_comm"].seconds == pytest.approx(hidden + share + sort, rel=1e-9)
        assert ov.step_s < plain.step_s
    assert round(DEEPEP_SM_SHARE * 132, 9) == 20  # Megatron-Core moe_deepep_num_sms of an H100
    with pytest.raises(UserError, match="--ep-overlap needs expert parallelism"):
        Strategy(dp=8, ep_overlap=True)


def test_flat_dispatch_sorts_received_tokens_by_local_expert() -> None:
    """The flat dispatcher pays one read and one write of this GPU's routed tokens per all-to-all to group them
    by local expert (Megatron-Core's sort_chunks_by_idxs); with one expert per GPU there is nothing to sort."""
    import numpy as np

    from trainsim.plan.estimate import a2a_stage_s, unit_table
    from trainsim.plan.optime import DEFAULT_EFFICIENCY as eff

    m = preset("mixtral-8x7b")  # 8 experts
    for ep, sorted_ in ((4, True), (8, False)):
        cl = homogeneous("h100", 8)
        e = estimate(m, Strategy(dp=8, ep=ep, zero=1), cl, global_batch=8)
        tab = unit_table(m, 1, 1, False, 1, cl.groups[0].gpu, eff, ep)
        cnt = tab.a2a_count * 2
        a2a = a2a_stage_s(tab.a2a_bytes, cnt, ep, ep, cl.groups[0], eff)
        sort = 2.0 * float(np.dot(cnt, tab.a2a_bytes)) * ep / (ep - 1) / (3350e9 * eff.mem)
        per_mb = {x.name: x for x in e.terms}["ep_comm"].seconds  # one micro-batch per step
        assert per_mb == pytest.approx(a2a + (sort if sorted_ else 0.0), rel=1e-9)
