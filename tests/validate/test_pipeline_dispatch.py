"""``validate pipeline``'s step 1 measures torch's runtime's own time per action (not clipped to 0 against
a second reference loop), and its real runs keep each rank on a core of its own."""

from __future__ import annotations

import pytest

from trainsim.errors import UserError
from trainsim.validate import pipeline


def test_dispatch_per_action_is_the_step_less_its_compute_calls_and_the_loss() -> None:
    # 30 ms step, 20 ms inside F/B calls, 4 microbatches with a 0.5 ms loss each: 8 ms over 8 actions
    assert pipeline.dispatch_per_action_us(0.030, 0.020, 500.0, 4) == pytest.approx(1000.0)
    assert pipeline.dispatch_per_action_us(0.020, 0.020, 500.0, 4) == 0.0  # the loss alone cannot be negative time
    with pytest.raises(UserError, match="microbatches=0"):
        pipeline.dispatch_per_action_us(0.03, 0.02, 0.0, 0)


def test_profile_step_charges_the_runtime_s_time_per_action() -> None:
    """The old reference (a LayerTape loop timed beside the runtime) ran slower than the profile's
    own medians and so read 0 for every configuration of the 14:27 UTC validation; the runtime's
    bookkeeping between its compute calls is never free."""
    case = pipeline.PipeCase(blocks=2, batch_size=16, pairs=(("GPipe", 1, 4),), rate_mbit=None)
    cp = pipeline.profile_case(case, p2p=False)
    assert 20.0 < cp.action_overhead_us[4] < 5000.0
    assert cp.p2p_action_us == 0.0


@pytest.mark.multiproc
def test_profile_step_measures_the_runtime_s_work_per_send_and_receive_on_a_generic_exchange() -> None:
    """Two ranks on loopback exchange one activation-sized message at a time as the runtime posts them;
    the work per action outside posting is never free, and far below a millisecond."""
    from trainsim.run.pipeline import ExchangeConfig, run_exchange

    got = run_exchange(ExchangeConfig(size_bytes=16_384, messages=40, warmup=5))
    for kind in ("send", "recv"):
        assert 0.5 < got[f"{kind}_book_us"] < 1000.0
        assert got[f"{kind}_post_us"] > 0.0
    assert all(len(r["send"]["book_us"]) == 40 for r in got["ranks"])
    with pytest.raises(UserError, match="size_bytes=2"):
        ExchangeConfig(size_bytes=2)


def test_real_runs_pin_each_rank_to_a_core() -> None:
    cfg = {"model": "transformer", "schedule": "1F1B", "stages_per_rank": 1, "microbatches": 4, "batch_size": 32,
           "split": [4, 5], "blocks": 6}  # fmt: skip
    job = pipeline.run_config(cfg, steps=6, warmup=2)
    assert job.pin and job.split == (4, 5) and (job.steps, job.warmup) == (6, 2)
