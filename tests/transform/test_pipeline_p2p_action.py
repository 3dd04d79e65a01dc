"""Each SEND or RECV action charges its rank the runtime's own work per action beyond posting it
(``StageCosts.p2p_action_us``, measured by ``validate pipeline``'s profile step on a generic exchange)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")

from trainsim.cluster.catalog import Link
from trainsim.errors import UserError
from trainsim.graph.ir import TaskGraph
from trainsim.transform.pipeline import P2PLink, PipeSpec, pipeline_graph, predict_pipeline, stage_costs

from .test_pipeline import _profile

LINK = P2PLink(wire=Link(name="t", bw_gbyte_s=10 / 8, latency_us=50.0), cpu_us=40.0)


def _rank_busy_us(g: TaskGraph, rank: int) -> float:
    """The summed durations of the tasks on ``rank``'s queue (every action and its optimizer update)."""
    res = [r.name for r in g.resources].index(f"rank{rank}:cpu")
    return float(np.asarray(g.dur_us)[np.asarray(g.resource) == res].sum())


def test_every_send_and_receive_action_pays_the_per_action_cost_on_its_own_rank() -> None:
    # GPipe, 2 stages on 2 ranks, 4 microbatches, per step: rank 0 posts SEND_F x4 and RECV_B x4,
    # rank 1 RECV_F x4 and SEND_B x4: 8 actions each, 8 x 150 us = 1200 us per step and rank
    spec = PipeSpec(schedule="GPipe", microbatches=4)
    costs = stage_costs(_profile(), [[0, 1, 2], [3, 4, 5]], 8)
    base = pipeline_graph(spec, costs, LINK, steps=2)
    paid = pipeline_graph(spec, replace(costs, p2p_action_us=150.0), LINK, steps=2)
    for rank in (0, 1):
        assert _rank_busy_us(paid, rank) - _rank_busy_us(base, rank) == pytest.approx(2 * 8 * 150.0)
    comm = [i for i in range(paid.n_tasks) if "SEND" in paid.task_name(i) or "RECV" in paid.task_name(i)]
    assert len(comm) == 2 * 2 * 8
    assert all(paid.dur_us[i] - base.dur_us[i] == pytest.approx(150.0) for i in comm)
    others = [i for i in range(paid.n_tasks) if i not in set(comm)]
    assert all(paid.dur_us[i] == base.dur_us[i] for i in others)  # compute and transfers unchanged


def test_predict_pipeline_passes_the_per_action_cost_and_refuses_a_negative_one() -> None:
    spec = PipeSpec(schedule="1F1B", microbatches=4)
    base = predict_pipeline(_profile(), spec, batch_size=32, link=LINK, split=[3, 3], steps=3)
    more = predict_pipeline(_profile(), spec, batch_size=32, link=LINK, split=[3, 3], steps=3, p2p_overhead_us=500.0)
    assert more.step_ms > base.step_ms
    with pytest.raises(UserError, match="p2p_overhead_us"):
        predict_pipeline(_profile(), spec, batch_size=32, link=LINK, p2p_overhead_us=-1.0)
