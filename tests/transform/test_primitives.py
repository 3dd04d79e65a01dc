"""Transformation primitives: select, scale, set_duration, insert, add_edges, remove, schedule."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.errors import UserError
from trainsim.graph.ir import EdgeKind, GraphBuilder, Policy, ResourceKind, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.primitives import add_edges, insert, remove, scale, schedule, select, set_duration


def _chain():  # type: ignore[no-untyped-def]
    """cpu: a(10) -> launch(2) ; gpu: gemm(40) <- launch ; gpu: relu(20) ; cpu: b(10)"""
    b = GraphBuilder()
    cpu = b.resource("cpu:0", ResourceKind.CPU_THREAD)
    gpu = b.resource("gpu0:s7", ResourceKind.GPU_STREAM)
    b.task("a", TaskKind.CPU, cpu, 10, step=1, layer="layer:fc")
    l1 = b.task("cudaLaunchKernel", TaskKind.RUNTIME, cpu, 2, step=1, layer="layer:fc")
    b.task("sgemm_128x64", TaskKind.KERNEL, gpu, 40, step=1, layer="layer:fc", deps=[l1])
    l2 = b.task("cudaLaunchKernel", TaskKind.RUNTIME, cpu, 2, step=2, layer="layer:act")
    b.task("relu_kernel", TaskKind.KERNEL, gpu, 20, step=2, layer="layer:act", deps=[l2])
    return b.build()


def test_select_filters_combine() -> None:
    g = _chain()
    assert select(g, kind="kernel").sum() == 2
    assert select(g, kind="kernel", name="gemm").tolist() == [False, False, True, False, False]
    assert select(g, layer="act").sum() == 2
    assert select(g, step=1, kind=("cpu", "runtime")).sum() == 2
    assert select(g, resource="gpu").sum() == 2
    assert select(g, where=lambda gg: gg.dur_us > 15).sum() == 2
    with pytest.raises(UserError, match="unknown task kind"):
        select(g, kind="gpu")
    with pytest.raises(UserError, match="regular expression"):
        select(g, name="(")


def test_scale_and_set_duration_change_the_simulation() -> None:
    g = _chain()
    base = simulate(g).makespan_us
    assert base == pytest.approx(10 + 2 + 40 + 20)
    faster = scale(g, select(g, name="gemm"), 0.5)
    assert simulate(faster).makespan_us == pytest.approx(base - 20)
    assert simulate(set_duration(g, select(g, kind="kernel"), 1.0)).makespan_us == pytest.approx(10 + 2 + 2 + 1)
    assert g.dur_us[2] == 40  # graphs are immutable
    with pytest.raises(UserError):
        scale(g, select(g, kind="kernel"), -1)


def test_insert_and_add_edges_then_remove_reconnects() -> None:
    g = _chain()
    gemm = int(np.flatnonzero(select(g, name="gemm"))[0])
    relu = int(np.flatnonzero(select(g, name="relu"))[0])
    g2, (ar,) = insert(g, name="allreduce", kind=TaskKind.COMM, resource="net", dur_us=100.0, order=0.0)
    g2 = add_edges(g2, [gemm], [ar], EdgeKind.COMM)
    g2 = add_edges(g2, [ar], [relu], EdgeKind.DATA)
    r = simulate(g2)
    assert r.start_us[ar] == pytest.approx(52) and r.start_us[relu] == pytest.approx(152)
    # removing the all-reduce makes relu depend on gemm directly (the predecessor of the removed task)
    g3 = remove(g2, [ar])
    assert g3.n_tasks == g.n_tasks
    assert simulate(g3).makespan_us == pytest.approx(simulate(g).makespan_us)


def test_remove_bridges_chains_of_removed_tasks() -> None:
    b = GraphBuilder()
    r = [b.resource(f"cpu{i}", ResourceKind.CPU_THREAD) for i in range(4)]
    a = b.task("a", TaskKind.CPU, r[0], 10)
    x = b.task("x", TaskKind.CPU, r[1], 10, deps=[a])
    y = b.task("y", TaskKind.CPU, r[2], 10, deps=[x])
    b.task("z", TaskKind.CPU, r[3], 10, deps=[y])
    g = remove(b.build(), [x, y])
    assert g.n_tasks == 2 and g.n_edges == 1
    assert simulate(g).makespan_us == pytest.approx(20)


def test_schedule_sets_policy_and_priority() -> None:
    g = _chain()
    g2 = schedule(g, "gpu", Policy.PRIORITY, priority=lambda gg: -gg.dur_us)
    assert g2.resources[1].policy == Policy.PRIORITY and g2.priority[2] == -40
    with pytest.raises(UserError, match="no resource matches"):
        schedule(g, "tpu", "priority")
    with pytest.raises(UserError, match="unknown policy"):
        schedule(g, "gpu", "random")


@pytest.mark.parametrize(
    ("sel", "message"),
    [([5], "names task 5; expected task indices 0..4"), ([-1], "names task -1"),  # not the last task, wrapped
     ([0.5], "dtype float64"), (np.ones(3, bool), "shape (3,)")],
)  # fmt: skip
def test_a_selection_outside_the_graph_is_refused(sel: object, message: str) -> None:
    """Index selections name tasks that exist (an IndexError before, and -1 quietly took the last task)."""
    g = _chain()
    for op in (lambda: scale(g, sel, 2.0), lambda: remove(g, sel), lambda: set_duration(g, sel, 1.0)):  # type: ignore[arg-type]
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            op()
    assert scale(g, [], 2.0).dur_us.tolist() == g.dur_us.tolist()  # an empty selection is fine


@pytest.mark.parametrize("field", ["order", "priority"])
def test_insert_refuses_a_non_finite_order_or_priority(field: str) -> None:
    g = _chain()
    kw = {"order": 0.0, "priority": 0.0, field: float("nan")}
    with pytest.raises(UserError, match=f"insert: {field} must be finite"):
        insert(g, name="x", kind=TaskKind.COMM, resource="net", dur_us=1.0, **kw)  # type: ignore[arg-type]
