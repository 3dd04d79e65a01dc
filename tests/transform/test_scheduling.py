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
