from __future__ import annotations

import numpy as np
import pytest

from tests.transform.test_dataparallel import _profile_like
from trainsim.errors import UserError
from trainsim.graph.ir import Policy, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.dataparallel import DPConfig, data_parallel
from trainsim.transform.scheduling import bytescheduler, input_first, p3


def test_p3_and_bytescheduler_policies() -> None:
    g, params, layers = _profile_like()
    gp = p3(g, params, layers, world=2, comm_us=lambda n: 100.0, slice_bytes=1 << 20)
    assert any(r.policy == Policy.PRIORITY for r in gp.resources)
    gb = bytescheduler(g, params, layers, world=2, comm_us=lambda n: 10.0 + n / 1000, credit=4)
    # one partition per layer (2 MiB < 4 MB); with credit 4, 3/4 of the 10 us latency is hidden
    comm = gb.kind == TaskKind.COMM
    assert np.allclose(gb.dur_us[comm], (1 << 21) / 1000 + 2.5)
    assert simulate(gb).makespan_us > 0


def test_input_first_reprioritises() -> None:
    g, params, layers = _profile_like()
    dp = data_parallel(g, params, layers, DPConfig(world=2, mode="p3", slice_bytes=1 << 20), comm_us=lambda n: 1.0)
    out = input_first(dp, ["b", "a"], resource="comm")  # reversed: now b first
    comm = out.kind == TaskKind.COMM
    names = [out.task_name(int(t)) for t in np.flatnonzero(comm)]
    prio = dict(zip(names, out.priority[comm].tolist(), strict=False))
    assert prio["allreduce:b.0"] == 0.0 and prio["allreduce:a.0"] == 1.0
    ddp = data_parallel(g, params, layers, DPConfig(world=2), comm_us=lambda n: 1.0)
    with pytest.raises(UserError, match="names a layer"):
        input_first(ddp, layers)


def test_bytescheduler_round_is_not_hidden_by_credit() -> None:
    """With the runtime's agreement round (``round_us``) each partition takes its round on top of its
    transfer, whose start-up latency credit hides: the round's messages queue behind the partitions in
    flight on the one link."""
    g, params, layers = _profile_like()
    cfg = DPConfig(world=2, mode="bytescheduler", round_us=50.0)
    gb = data_parallel(g, params, layers, cfg, comm_us=lambda n: 10.0 + n / 1000)
    comm = gb.kind == TaskKind.COMM
    assert np.allclose(gb.dur_us[comm], (1 << 21) / 1000 + 2.5 + 50.0)  # one 2 MiB partition per layer
    res = simulate(gb)
    step0 = np.flatnonzero(comm & (gb.step == 0))
    at = {gb.task_name(int(t)): (float(res.start_us[t]), float(res.end_us[t])) for t in step0}
    # b's gradients are ready at 41 us, a's at 62: a's partition queues behind b's on the link
    xfer = (1 << 21) / 1000 + 2.5 + 50.0
    assert at["allreduce:b.0"] == pytest.approx((41.0, 41.0 + xfer))
    assert at["allreduce:a.0"] == pytest.approx((41.0 + xfer, 41.0 + 2 * xfer))
    with pytest.raises(UserError, match="round_us"):
        DPConfig(world=2, mode="bytescheduler", round_us=-1.0)
