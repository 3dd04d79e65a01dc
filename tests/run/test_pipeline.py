"""Real pipeline runs on 2 gloo processes execute the simulator's order and train like one process."""

from __future__ import annotations

import time

import pytest

from trainsim.errors import UserError
from trainsim.run.pipeline import PipeRunConfig, run_pipeline
from trainsim.run.ranks import RankFailed
from trainsim.transform.pipeline import lowered_order


def test_bad_input_is_refused_before_any_process() -> None:
    with pytest.raises(UserError, match="does not divide the batch size 32"):
        PipeRunConfig(microbatches=5)
    with pytest.raises(UserError, match="stage 1 would be empty"):
        PipeRunConfig(split=(5, 0), blocks=2)
    with pytest.raises(UserError, match="needs 2 stage"):
        PipeRunConfig(schedule="ZBVZeroBubble", stages_per_rank=1)
    with pytest.raises(UserError, match="covers 4 layers, the model has 5"):
        PipeRunConfig(split=(2, 2), blocks=2)
    with pytest.raises(UserError, match="only 5 layers"):
        PipeRunConfig(schedule="Interleaved1F1B", stages_per_rank=4, microbatches=8, blocks=2)


def _plain_first_loss(blocks: int) -> float:
    import torch
    from torch import nn

    from trainsim.models.zoo import ZooSpec, build_with_batches

    model, batches = build_with_batches("transformer", seed=0, spec=ZooSpec(batch_size=16, blocks=blocks))
    x, y = batches(0)
    with torch.no_grad():
        return float(nn.CrossEntropyLoss()(model(x), y))


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "schedule,spr,split",
    [("1F1B", 1, (3, 3)), ("ZBVZeroBubble", 2, (2, 1, 1, 2)), ("Interleaved1F1B", 2, (2, 1, 1, 2))],
)
def test_real_run_executes_the_simulated_order(schedule: str, spr: int, split: tuple[int, ...]) -> None:
    cfg = PipeRunConfig(
        model="transformer",
        blocks=3,
        schedule=schedule,
        stages_per_rank=spr,
        microbatches=4,
        batch_size=16,
        split=split,
        steps=2,
        warmup=0,
    )
    res = run_pipeline(cfg)
    want = lowered_order(cfg.pipe_spec())
    for r in range(2):
        assert res["ranks"][r]["order"] == [str(a) for a in want[r]]
        # the runtime's posting of and waiting for transfers is timed, apart from the computation
        p2p, comp = res["ranks"][r]["p2p_ms_per_step"], res["ranks"][r]["compute_ms_per_step"]
        assert {"post", "cpu:post", "wait", "cpu:wait"} <= set(p2p) and min(p2p.values()) > 0
        assert p2p["cpu:post"] <= p2p["post"] * 1.05 + 0.05 and "post" not in comp
        # posting split by what each batch posts, with the operations per step: one per SEND/RECV action
        ops = res["ranks"][r]["p2p_ops_per_step"]
        assert ops and set(ops) <= {"send", "recv", "send+recv"} and {k for k in p2p if k.startswith("post:")} == {f"post:{k}" for k in ops}
        assert sum(p2p[f"post:{k}"] for k in ops) == pytest.approx(p2p["post"])
        comms = sum(str(a.computation_type.value) in {"SEND_F", "SEND_B", "RECV_F", "RECV_B"} for a in want[r])
        assert sum(ops.values()) == pytest.approx(comms)
        step = sum(res["ranks"][r]["step_ms"]) / cfg.steps
        assert p2p["post"] + p2p["wait"] + sum(v for k, v in comp.items() if ":" not in k) <= step * 1.02
        # every thread's CPU and run-queue wait per step: the compute thread's CPU covers its stage calls'
        threads = res["ranks"][r]["threads"]
        if threads:  # empty where the kernel keeps no schedstat
            cpu_in_calls = sum(v for k, v in comp.items() if k.startswith("cpu:"))
            assert threads["main"]["run_ms"] >= 0.9 * cpu_in_calls and threads["main"]["wait_ms"] >= 0
            assert threads["main"]["run_ms"] + threads["main"]["wait_ms"] <= step * 1.05
    # microbatch losses average to the full-batch loss of the unsplit model (step 0, before any update)
    assert res["losses"][0] == pytest.approx(_plain_first_loss(3), rel=1e-5)


@pytest.mark.multiproc
def test_crashed_rank_stops_the_pipeline_and_is_named() -> None:
    t0 = time.monotonic()
    cfg = PipeRunConfig(
        model="transformer",
        blocks=2,
        schedule="GPipe",
        microbatches=4,
        batch_size=16,
        steps=20,
        crash_rank=0,
        timeout_s=20,
    )
    with pytest.raises(RankFailed, match="rank 0 exited with code 3"):
        run_pipeline(cfg)
    assert time.monotonic() - t0 < 60


def test_segments_split_the_measured_steps_between_host_readings() -> None:
    from trainsim.run.ranks import segments

    assert segments(16, 2, 0) == [(2, 16)]
    assert segments(16, 2, 2) == [(2, 8), (1, 8)]
    assert segments(7, 3, 2) == [(3, 4), (1, 3)]
    assert segments(4, 2, 3) == [(2, 4)]  # at least 3 measured steps a segment
    assert segments(8, 0, 2) == [(0, 4), (0, 4)]


@pytest.mark.multiproc
def test_pinned_run_keeps_each_rank_on_its_own_core_and_times_its_parts() -> None:
    cfg = PipeRunConfig(model="transformer", blocks=2, schedule="GPipe", microbatches=2, batch_size=8, steps=2,
                        warmup=1, pin=True)  # fmt: skip
    res = run_pipeline(cfg)
    cores = [r["cores"] for r in res["ranks"]]
    import os

    if len(os.sched_getaffinity(0)) >= 2:
        assert all(len(c) == 1 for c in cores) and cores[0] != cores[1]
        assert all(r["pin_error"] is None for r in res["ranks"])
    for r in res["ranks"]:
        comp, parts = r["compute_ms_per_step"], r["step_parts_ms_per_step"]
        # the runtime's step call holds the stages' compute calls; the optimizer runs after it
        assert parts["runtime"] >= comp["F"] + comp["B"] > 0 and parts["optimizer"] > 0
        assert {"minor_faults", "major_faults", "involuntary_switches"} <= set(r["rusage_per_step"])
