"""What tasks running at the same time cost each other, read off a replay's schedule.

    >>> from trainsim.simulate.overlap import corun_extra_us
    >>> res = simulate(g)                                                              # doctest: +SKIP
    >>> extra = corun_extra_us(res.start_us, res.end_us, g.resource, victims, 1.3)     # doctest: +SKIP
    >>> res = simulate(g.with_columns(dur_us=g.dur_us + extra))                        # doctest: +SKIP

Pure arithmetic on start and end times: the caller replays again with the longer durations, a few
times, until the schedule settles (a fixed-point loop around ``simulate``). Used for kernels on two
GPU streams that share the SMs (``transform.ooo.predict_multistream``) and by the test host's model
of ranks sharing cores (``trainsim.testbed.contention``).
"""

from __future__ import annotations

import numpy as np

from trainsim.graph.ir import F64


def load_integral(start: F64, end: F64, src: np.ndarray, weight: F64, cap: float) -> tuple[F64, F64]:
    """Knots ``(t, F)`` of ``F(t) = integral of min(cap, sum of weight over the sources running)``."""
    t = np.concatenate((start[src], end[src]))
    dl = np.concatenate((weight, -weight))
    order = np.argsort(t, kind="stable")
    t, dl = t[order], dl[order]
    load = np.minimum(cap, np.maximum(0.0, np.cumsum(dl)))  # load on [t[j], t[j+1])
    return t, np.concatenate(([0.0], np.cumsum(load[:-1] * np.diff(t))))


def overlap_us(start: F64, end: F64, src: np.ndarray, weight: F64, dst: np.ndarray, cap: float = 1.0) -> F64:
    """For each task in ``dst``: the integral over its span of ``min(cap, sum of weight over the tasks
    of ``src`` running at that time)``; 0 for the other tasks."""
    out = np.zeros(start.shape[0])
    if not src.size or not dst.size:
        return out
    t, cum = load_integral(start, end, src, weight, cap)
    out[dst] = np.interp(end[dst], t, cum) - np.interp(start[dst], t, cum)
    return out


def corun_extra_us(start: F64, end: F64, resource: np.ndarray, victims: np.ndarray, factor: float) -> F64:
    """Per task: the time that running beside the other resources' ``victims`` adds to each victim.

    Work on different resources that share hardware slows down (ranks on one host's cores: shared
    caches, memory bandwidth, SMT siblings; kernels on two GPU streams: the SMs), measured as
    ``factor`` = time of copies running at once / alone. A task that needs ``b`` progresses at
    ``1 / factor`` of its speed while a victim on another resource runs, so over an overlap ``O`` of its
    span with that work it lasts ``b + O (1 - 1 / factor)``; ``O`` comes from the spans given (the
    caller iterates)."""
    out = np.zeros(start.shape[0])
    if factor <= 1.0 or not victims.size:
        return out
    for r in np.unique(resource[victims]):
        mine = victims[resource[victims] == r]
        others = victims[resource[victims] != r]
        out += overlap_us(start, end, others, np.ones(others.size), mine, cap=1.0)
    return out * (1.0 - 1.0 / factor)
