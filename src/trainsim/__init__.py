"""trainsim: predict what a training optimisation buys, then turn it on for real.

    >>> import trainsim
    >>> g = trainsim.load_trace("trace.json.gz")          # doctest: +SKIP
    >>> base = trainsim.simulate(g)                        # doctest: +SKIP
    >>> amp = trainsim.simulate(trainsim.whatifs.amp(g))  # doctest: +SKIP

Layers (folders): capture -> graph -> transform -> simulate -> plan -> run -> validate.
Heavy imports (torch, numba) happen lazily inside the functions that need them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load_trace": "trainsim.graph.build:load_trace",
    "simulate": "trainsim.simulate.engine:simulate",
    "TaskGraph": "trainsim.graph.ir:TaskGraph",
    "whatifs": "trainsim.transform.whatifs",
    "transform": "trainsim.transform",
}


def __getattr__(name: str) -> Any:
    import importlib

    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod
