"""trainsim: predict what a training optimisation buys, then turn it on for real.

    >>> import trainsim
    >>> g = trainsim.load_trace("trace.json.gz")                # doctest: +SKIP
    >>> base = trainsim.replay(g)                                # doctest: +SKIP
    >>> amp = trainsim.replay(trainsim.whatifs.amp(g))          # doctest: +SKIP
    >>> res = trainsim.search_plans(trainsim.model_preset("gpt3-1.3b"),
    ...                             trainsim.homogeneous_cluster("a100-80gb", 16), global_batch=64)
    >>> res.plans[0].fits
    True

The names in ``__all__`` are the entry points: capture (``profile``, ``read_trace``), trace -> graph
(``load_trace``, ``build_graph``, ``load_job``), replay (``replay``, i.e. ``simulate.engine.simulate``),
what-ifs (``whatifs`` and the primitives of ``transform``) and the planner (``search_plans``, i.e.
``plan.search.plan``, ``estimate``, ``goodput``). A subpackage's name (``simulate``, ``plan``, ...) always
means the subpackage: a function of that name here would turn into the package as soon as anything
imported it, hence ``replay`` and ``search_plans``.

Layers (folders): capture -> graph -> transform -> simulate -> plan -> run -> validate.
Every entry point is imported on first use, so ``import trainsim`` stays cheap (no numpy, torch or numba).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainsim import transform
    from trainsim.capture.kineto import Trace, read_trace
    from trainsim.capture.profile import ProfileConfig, profile
    from trainsim.errors import UserError
    from trainsim.graph.build import build_graph, load_trace
    from trainsim.graph.ir import TaskGraph
    from trainsim.graph.multirank import load_job
    from trainsim.plan.devices import homogeneous as homogeneous_cluster
    from trainsim.plan.estimate import Estimate, Strategy, estimate
    from trainsim.plan.goodput import GoodputConfig, goodput
    from trainsim.plan.search import plan as search_plans
    from trainsim.plan.workload import Transformer
    from trainsim.plan.workload import preset as model_preset
    from trainsim.simulate.engine import SimResult
    from trainsim.simulate.engine import simulate as replay
    from trainsim.transform import whatifs
    from trainsim.transform.primitives import add_edges, insert, remove, scale, schedule, select, set_duration

__version__ = "0.1.0"

_LAZY = {
    # capture: a real run's trace, read
    "profile": "trainsim.capture.profile:profile",
    "ProfileConfig": "trainsim.capture.profile:ProfileConfig",
    "read_trace": "trainsim.capture.kineto:read_trace",
    "Trace": "trainsim.capture.kineto:Trace",
    # trace -> graph (one rank, or a job of several)
    "load_trace": "trainsim.graph.build:load_trace",
    "build_graph": "trainsim.graph.build:build_graph",
    "load_job": "trainsim.graph.multirank:load_job",
    "TaskGraph": "trainsim.graph.ir:TaskGraph",
    # replay
    "replay": "trainsim.simulate.engine:simulate",
    "SimResult": "trainsim.simulate.engine:SimResult",
    # what-ifs: the ready-made ones and the primitives they are written with
    "whatifs": "trainsim.transform.whatifs",
    "transform": "trainsim.transform",
    "select": "trainsim.transform.primitives:select",
    "scale": "trainsim.transform.primitives:scale",
    "remove": "trainsim.transform.primitives:remove",
    "insert": "trainsim.transform.primitives:insert",
    "add_edges": "trainsim.transform.primitives:add_edges",
    "schedule": "trainsim.transform.primitives:schedule",
    "set_duration": "trainsim.transform.primitives:set_duration",
    # the planner
    "search_plans": "trainsim.plan.search:plan",
    "estimate": "trainsim.plan.estimate:estimate",
    "Strategy": "trainsim.plan.estimate:Strategy",
    "Estimate": "trainsim.plan.estimate:Estimate",
    "Transformer": "trainsim.plan.workload:Transformer",
    "model_preset": "trainsim.plan.workload:preset",
    "homogeneous_cluster": "trainsim.plan.devices:homogeneous",
    "goodput": "trainsim.plan.goodput:goodput",
    "GoodputConfig": "trainsim.plan.goodput:GoodputConfig",
    # errors meant for the user (one line)
    "UserError": "trainsim.errors:UserError",
}

__all__ = [
    "Estimate", "GoodputConfig", "ProfileConfig", "SimResult", "Strategy", "TaskGraph", "Trace",
    "Transformer", "UserError", "add_edges", "build_graph", "estimate", "goodput", "homogeneous_cluster",
    "insert", "load_job", "load_trace", "model_preset", "profile", "read_trace", "remove", "replay",
    "scale", "schedule", "search_plans", "select", "set_duration", "transform", "whatifs",
]


def __getattr__(name: str) -> Any:
    import importlib

    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    value = getattr(mod, attr) if attr else mod
    globals()[name] = value  # once is enough
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
