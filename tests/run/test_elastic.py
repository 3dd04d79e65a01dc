"""Checkpoints, the supervisor's bookkeeping and the lost-time arithmetic of trainsim.run.elastic.

The default tests start no torch.distributed process: the supervisor runs stand-in ranks (tiny Python
scripts that crash, fail or hang on cue). The real kill-and-restart of a gloo DDP job is marked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainsim.errors import UserError
from trainsim.plan.goodput import GoodputConfig
from trainsim.run.elastic import (
    CHECKPOINT,
    EXIT_PEER_LOST,
    Attempt,
    ElasticConfig,
    ElasticResult,
    checkpoint_state,
    latest_checkpoint,
    load_checkpoint,
    lost_time,
    predict_lost_s,
    restart_checkpoint_step,
    restore_state,
    save_checkpoint,
    step_times_s,
    supervise,
)
from trainsim.run.ranks import RankFailed


# --------------------------------------------------------------------------- checkpoints
def _trained(seed: int) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):  # momentum buffers exist only after a step
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    return model, opt


def test_a_checkpoint_restores_weights_optimizer_rng_and_step(tmp_path: Path) -> None:
    import torch

    model, opt = _trained(0)
    torch.manual_seed(123)
    save_checkpoint(tmp_path, checkpoint_state(model, opt, 40))
    expected_draw = torch.rand(3)
    other, other_opt = _trained(1)
    torch.manual_seed(999)
    assert restore_state(other, other_opt, load_checkpoint(tmp_path / CHECKPOINT)) == 40
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    bufs = [s["momentum_buffer"] for s in other_opt.state_dict()["state"].values()]
    assert bufs and all(torch.equal(a, b) for a, b in zip(bufs, [s["momentum_buffer"] for s in opt.state_dict()["state"].values()], strict=True))
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where the saved job's did


def test_a_write_that_dies_midway_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    model, opt = _trained(0)
    save_checkpoint(tmp_path, checkpoint_state(model, opt, 20))

    def torn(obj: object, f: Any) -> None:
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, checkpoint_state(model, opt, 40))
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]  # the temporary file is gone
    assert load_checkpoint(tmp_path / CHECKPOINT)["step"] == 20


def test_a_temporary_file_left_by_a_kill_is_not_a_checkpoint(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / ".tmp-abc.pt").write_bytes(b"torn")  # what a SIGKILL mid-write leaves
    assert latest_checkpoint(tmp_path) is None
    model, opt = _trained(0)
    save_checkpoint(tmp_path, checkpoint_state(model, opt, 5))
    assert latest_checkpoint(tmp_path) == tmp_path / CHECKPOINT


def test_a_foreign_file_is_refused_by_name(tmp_path: Path) -> None:
    import torch

    torch.save({"model": {}}, tmp_path / CHECKPOINT)
    with pytest.raises(UserError, match="missing optimizer, rng, step"):
        load_checkpoint(tmp_path / CHECKPOINT)


# --------------------------------------------------------------------------- config and arithmetic
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"world": 1}, "at least 2 ranks"),
        ({"kill_rank": 1}, "expected both"),
        ({"kill_rank": 2, "kill_step": 3}, "rank in 0..1"),
        ({"kill_rank": 0, "kill_step": 60}, "step in 0..59"),
        ({"kill_signal": "SIGTERM"}, "SIGKILL, SIGSTOP"),
        ({"checkpoint_every": 0}, "positive integer"),
        ({"optimizer": "lion"}, "expected one of sgd"),
    ],
)
def test_bad_configs_say_what_was_expected(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(UserError, match=match):
        ElasticConfig(checkpoint_dir="ckpt", **kw)


def test_the_restart_step_is_the_last_checkpoint_at_or_before_the_kill() -> None:
    # checkpoints after steps 19, 39 ... hold next step 20, 40 ...
    assert [restart_checkpoint_step(k, 20) for k in (0, 19, 20, 35, 40)] == [0, 0, 20, 20, 40]


def test_predicted_lost_time_is_goodputs_one_failure() -> None:
    """Kill at step 35, checkpoints every 20 steps: 15 steps of 0.1 s redone, plus restart and restore
    (and, with no spares, the repair wait: goodput's model, item 3)."""
    g = GoodputConfig(step_s=0.1, gpus=2, mtbf_gpu_hours=1e6, checkpoint_s=0.05, restart_s=4.0, restore_s=0.2)
    assert predict_lost_s(g, 35, 20) == pytest.approx(1.5 + 4.0 + 0.2)
    assert predict_lost_s(g, 40, 20, detect_s=0.1) == pytest.approx(4.3)
    g2 = GoodputConfig(step_s=0.1, gpus=2, mtbf_gpu_hours=1e6, checkpoint_s=0.05, restart_s=4.0, repair_s=10.0)
    assert predict_lost_s(g2, 20, 20) == pytest.approx(14.0)


def _ev(t: float, ev: str, **kw: Any) -> dict[str, Any]:
    return {"ev": ev, "t": t, **kw}


def _hand_made_run() -> tuple[ElasticResult, ElasticConfig]:
    """Kill of rank 1 at step 3 (t = 13), checkpoint at step 2; the restart reaches step 3 at t = 26."""
    cfg = ElasticConfig(checkpoint_dir="ckpt", steps=6, checkpoint_every=2, kill_rank=1, kill_step=3)
    r0 = (_ev(11, "ready"), _ev(11, "restored", step=0), *(_ev(11 + i, "step", i=i) for i in range(4)), _ev(12.5, "ckpt", i=2, write_s=0.5))
    r1 = (_ev(11.2, "ready"), _ev(11.2, "restored", step=0), *(_ev(11.1 + i, "step", i=i) for i in range(4)), _ev(13.05, "kill", i=3))
    a0 = Attempt(index=0, launched_t=10.0, ended_t=13.5, codes=(EXIT_PEER_LOST, -9), failed_rank=1, detected_t=13.25,
                 survivors_exit_s={0: 0.1}, events=(r0, r1))  # fmt: skip
    s0 = (_ev(22, "ready"), _ev(22.5, "restored", step=2), _ev(22.6, "step", i=2), _ev(25.6, "step", i=3))
    s1 = (_ev(22.1, "ready"), _ev(22.4, "restored", step=2), _ev(22.6, "step", i=2), _ev(26.0, "step", i=3))
    a1 = Attempt(index=1, launched_t=14.0, ended_t=30.0, codes=(0, 0), failed_rank=None, detected_t=None, events=(s0, s1))
    return ElasticResult(cfg, (a0, a1), 20.0), cfg


def test_lost_time_adds_up_from_kill_to_the_same_step_again() -> None:
    res, _ = _hand_made_run()
    lt = lost_time(res)
    assert lt.restart_step == 2 and lt.kill_step == 3
    assert lt.detect_s == pytest.approx(0.2)
    assert lt.teardown_s == pytest.approx(0.75)
    assert lt.restart_s == pytest.approx(8.1)  # the slowest rank ready
    assert lt.restore_s == pytest.approx(0.4)
    assert lt.recompute_s == pytest.approx(3.5)  # the slowest rank starts step 3
    assert lt.lost_s == pytest.approx(26.0 - 13.05)
    parts = lt.detect_s + lt.teardown_s + lt.restart_s + lt.restore_s + lt.recompute_s
    assert parts == pytest.approx(lt.lost_s)
    assert "rank 1 killed by SIGKILL; rank 0 failed by itself 0.100 s later" in res.attempts[0].describe()


def test_step_times_take_the_slowest_rank_and_skip_checkpoint_steps() -> None:
    res, _ = _hand_made_run()
    # steps 0-3 start at 11.1, 12.1, 13.1 (slowest rank), 14.0; step 2 follows a checkpoint write
    assert step_times_s(res.attempts[0]) == pytest.approx([1.0, 1.0])
    assert step_times_s(res.attempts[0], skip=1) == pytest.approx([1.0])


# --------------------------------------------------------------------------- the supervisor, with stand-in ranks
def _stand_in(script_by_rank: dict[int, str]) -> Any:
    """A ``popen`` that runs ``script_by_rank[rank]`` (``{attempt}`` filled in) instead of the worker."""

    def popen(rank: int, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        attempt = json.loads(argv[argv.index("--config") + 1])["attempt"]
        code = script_by_rank[rank].format(attempt=attempt)
        return subprocess.Popen([sys.executable, "-c", code], start_new_session=True, **kw)

    return popen


CRASH = "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGKILL)"
PEER_LOST = f"import sys, time; time.sleep(0.5); print('PeerLost: rank 0: collective timeout 9 s', file=sys.stderr); sys.exit({EXIT_PEER_LOST})"
HANG = "import time; time.sleep(60)"


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)  # the rank's process group: the rank and anything it started
    except ProcessLookupError:
        return True
    return False


def test_a_crash_names_the_dead_rank_and_what_the_survivor_said(tmp_path: Path) -> None:
    cfg = ElasticConfig(checkpoint_dir=str(tmp_path), max_restarts=0, grace_s=5.0)
    with pytest.raises(RankFailed) as err:
        supervise(cfg, popen=_stand_in({0: PEER_LOST, 1: CRASH}))
    assert err.value.rank == 1
    msg = str(err.value)
    assert "rank 1 killed by SIGKILL" in msg and "rank 0 failed by itself" in msg and "collective timeout 9 s" in msg


def test_a_survivor_that_hangs_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    pids: list[int] = []

    def popen(rank: int, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        p = _stand_in({0: HANG, 1: CRASH})(rank, argv, **kw)
        pids.append(p.pid)
        return p

    cfg = ElasticConfig(checkpoint_dir=str(tmp_path), max_restarts=0, grace_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="rank 0 still running after the grace period, killed"):
        supervise(cfg, popen=popen)
    assert time.monotonic() - t0 < 10
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_a_failed_attempt_is_restarted_and_the_bookkeeping_kept(tmp_path: Path) -> None:
    """Rank 1 crashes on attempt 0 only; attempt 1 finishes."""
    crash_once = "import os, signal, sys, time; time.sleep(0.2)\nif {attempt} == 0: os.kill(os.getpid(), signal.SIGKILL)"
    lose_peer_once = f"import sys, time; time.sleep(0.4)\nif {{attempt}} == 0: sys.exit({EXIT_PEER_LOST})"
    cfg = ElasticConfig(checkpoint_dir=str(tmp_path), max_restarts=1, grace_s=5.0, poll_s=0.005)
    res = supervise(cfg, popen=_stand_in({0: lose_peer_once, 1: crash_once}))
    a0, a1 = res.attempts
    assert (a0.failed_rank, a0.codes, a1.failed_rank, a1.codes) == (1, (EXIT_PEER_LOST, -signal.SIGKILL), None, (0, 0))
    assert 0 < a0.survivors_exit_s[0] < 1.0 and a0.killed == ()
    assert a0.detected_t is not None and a0.launched_t < a0.detected_t <= a0.ended_t <= a1.launched_t
    assert res.wall_s == pytest.approx(a1.ended_t - a0.launched_t)
    assert all(_gone(p) for a in res.attempts for p in a.pids)


# --------------------------------------------------------------------------- real ranks
@pytest.mark.slow
@pytest.mark.multiproc
def test_a_killed_rank_restarts_from_its_checkpoint_and_ends_as_an_unfailed_run(tmp_path: Path) -> None:
    """A real 2-rank gloo DDP job: rank 1 SIGKILLs itself at step 13 (checkpoints every 5 steps). The
    survivor's all-reduce fails by itself with a named error well within the collective timeout, the
    job restarts from step 10 and ends with the weights of an unfailed run; no process is left."""
    small = {"width": 64, "depth": 2, "batch_size": 8, "steps": 16, "checkpoint_every": 5, "collective_timeout_s": 20.0, "grace_s": 25.0}
    res = supervise(ElasticConfig(checkpoint_dir=str(tmp_path / "a"), kill_rank=1, kill_step=13, **small))
    assert len(res.attempts) == 2
    a0 = res.attempts[0]
    assert a0.failed_rank == 1 and a0.codes == (EXIT_PEER_LOST, -signal.SIGKILL) and a0.killed == ()
    assert a0.survivors_exit_s[0] < 10.0, a0.describe()
    assert "PeerLost: rank 0: the all-reduce of step 13 failed" in a0.stderr[0] and "collective timeout 20 s" in a0.stderr[0]
    lt = lost_time(res)
    assert lt.restart_step == 10 and lt.lost_s > lt.recompute_s > 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [CHECKPOINT]
    clean = supervise(ElasticConfig(checkpoint_dir=str(tmp_path / "b"), **small))
    assert len(clean.attempts) == 1 and clean.digest is not None
    assert res.digest == clean.digest  # same batches, same all-reduces: bit for bit
    assert all(_gone(p) for r in (res, clean) for a in r.attempts for p in a.pids)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_hung_rank_ends_the_survivors_collective_at_the_timeout(tmp_path: Path) -> None:
    """Rank 1 stops (SIGSTOP: its sockets stay open, silent): rank 0's all-reduce fails on the collective
    timeout, not on a closed socket, and names it; the stopped rank is killed; no process is left."""
    cfg = ElasticConfig(checkpoint_dir=str(tmp_path), width=64, depth=2, batch_size=8, steps=8, checkpoint_every=4,
                        kill_rank=1, kill_step=5, kill_signal="SIGSTOP", collective_timeout_s=3.0, grace_s=1.0,
                        max_restarts=0)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        supervise(cfg)
    assert err.value.rank == 0
    msg = str(err.value)
    assert f"rank 0 exited with code {EXIT_PEER_LOST}" in msg and "rank 1 still running after the grace period, killed" in msg
    assert "collective timeout 3 s" in msg
    assert time.monotonic() - t0 < 120
