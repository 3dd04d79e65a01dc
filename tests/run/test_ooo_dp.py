"""The reverse-first-k wrapper updates weights exactly as torch's DDP does; bad k is refused early."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trainsim.errors import UserError
from trainsim.run.ooo_dp import DpRunConfig, run_dp
from trainsim.run.ranks import RankFailed


def test_k_larger_than_layers_is_refused_before_any_process() -> None:
    t0 = time.monotonic()
    with pytest.raises(UserError, match="has 4 layers"):
        run_dp(DpRunConfig(model="mlp", mode="ooo", k=5))
    assert time.monotonic() - t0 < 10


def test_bad_config() -> None:
    with pytest.raises(UserError, match="mode"):
        DpRunConfig(mode="zero")
    with pytest.raises(UserError, match="k=-1"):
        DpRunConfig(k=-1)
    with pytest.raises(UserError, match="warmup=-1"):
        DpRunConfig(warmup=-1)


@pytest.mark.multiproc
@pytest.mark.parametrize("model,k", [("mlp", 2), ("mlp", 4), ("transformer", 3), ("cnn", 2)])
def test_ooo_equals_ddp(model: str, k: int) -> None:
    common = dict(model=model, steps=3, warmup=0, batch_size=8, save_params=True)
    ddp = run_dp(DpRunConfig(mode="ddp", **common))  # type: ignore[arg-type]
    traced = model == "cnn"  # tracing (completion callbacks on gloo's futures) must not change the numbers
    ooo = run_dp(DpRunConfig(mode="ooo", k=k, trace=traced, **common))  # type: ignore[arg-type]
    np.testing.assert_allclose(ooo["losses"], ddp["losses"], rtol=1e-6)
    if traced:
        for step in ooo["ranks"][0]["trace"]:
            at = {name: t for name, t in step}
            assert 0 <= at["forward"] <= at["backward"] <= at["weights"] <= at["end"]
            issued = {n for n in at if n.startswith("issue:")}
            assert issued and all(f"done:{n[6:]}" in at for n in issued if int(n[6:]) >= k)
            assert at["cpu:forward"] <= at["cpu:weights"]
    for rank in range(2):
        for a, b in zip(ooo["ranks"][rank]["params"], ddp["ranks"][rank]["params"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.multiproc
def test_crashed_rank_stops_the_run_and_is_named() -> None:
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 exited with code 3"):
        run_dp(DpRunConfig(model="mlp", mode="ooo", k=2, steps=50, crash_rank=1, timeout_s=30))
    assert time.monotonic() - t0 < 60


def test_window_step_time_is_the_throughput_not_the_median_of_per_step_maxima() -> None:
    from trainsim.run.ranks import slowest_rank_steps, window_step_ms

    # two ranks that meet mid-step: their long and short steps alternate out of phase
    ranks = [{"step_ms": [60.0, 80.0] * 5}, {"step_ms": [80.0, 60.0] * 5}]
    assert window_step_ms(ranks, 10) == pytest.approx(70.0)
    assert sorted(slowest_rank_steps(ranks, 10)) == [80.0] * 10  # the per-step maximum reads 80
    assert window_step_ms([{"step_ms": [10.0, 20.0, 99.0]}, {"step_ms": [12.0, 12.0, 0.0]}], 2) == pytest.approx(15.0)


def test_free_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    """Ports for a run's rendezvous come from below the kernel's range for outgoing connections, so
    that no gloo connection of another run takes one before rank 0 binds it."""
    import socket
    from pathlib import Path

    from trainsim.run.ranks import free_port, free_ports

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert (20000 <= port < low) if low > 20064 else port > 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert len(set(free_ports(5))) == 5
