"""The straggler what-if: a multi-rank job with its slow rank computing as fast as a typical one.

    >>> from trainsim.graph.multirank import load_job
    >>> from trainsim.transform.straggler import remove_straggler, straggler_rank
    >>> job = load_job(["out/run"])                                   # doctest: +SKIP
    >>> straggler_rank(job.graph), simulate(remove_straggler(job.graph)).mean_step_ms   # doctest: +SKIP

Works on a graph from ``graph.multirank.load_job`` (or a transformation of one), and composes with
the other primitives like any of them (``scale(remove_straggler(g), sel, 0.5)``):

1. The straggler is the rank that waited least for its peers at the collectives, measured: the
   traced arrivals on the job's clock tell who came last (``straggler_rank``).
2. Its compute (``multirank.compute_mask``: own work, not waits) is summed per step, and so is every
   other rank's.
3. Per step, its compute tasks are scaled so that their sum is the median of the *other* ranks'
   (with two ranks: the other rank's), never up: a rank already at or below it is left as it is.
   The waits then shrink or vanish in the replay, because they are barrier dependencies, not fixed
   durations.
"""

from __future__ import annotations

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import TaskGraph
from trainsim.graph.multirank import barriers, compute_mask, task_ranks


def straggler_rank(g: TaskGraph) -> int:
    """The rank the others waited for: the least traced waiting at barriers (ties: the lowest rank)."""
    ranks = _ranks(g)
    bar, arr, _ = barriers(g)
    if bar.size == 0:
        raise UserError(f"{g.source}: no collective joins the ranks; expected a graph from a multi-rank job "
                        "(trainsim replay on a folder or several traces)")  # fmt: skip
    arrival = g.ts_us[arr]  # traced arrival, job clock
    last = np.full(int(bar.max()) + 1, -np.inf)
    np.maximum.at(last, bar, arrival)
    wait = last[bar] - arrival
    r_arr = task_ranks(g)[arr]
    totals = {r: float(wait[r_arr == r].sum()) for r in ranks}
    return min(ranks, key=lambda r: (totals[r], r))


def remove_straggler(g: TaskGraph, rank: int | None = None) -> TaskGraph:
    """``g`` with ``rank``'s (default: ``straggler_rank``) per-step compute set to the median of the
    other ranks' (module doc, steps 2-3)."""
    ranks = _ranks(g)
    slow = straggler_rank(g) if rank is None else rank
    if slow not in ranks:
        raise UserError(f"remove_straggler: rank {slow} is not in {g.source}; expected one of "
                        f"{', '.join(map(str, ranks))}")  # fmt: skip
    task_rank = task_ranks(g)
    comp = compute_mask(g) & (g.step >= 0)
    steps = np.unique(g.step[comp])
    r_idx = {r: i for i, r in enumerate(ranks)}
    rows = np.array([r_idx.get(int(r), -1) for r in task_rank[comp].tolist()], np.int64)
    cols = np.searchsorted(steps, g.step[comp])
    total = np.zeros((len(ranks), steps.size))
    ok = rows >= 0
    np.add.at(total, (rows[ok], cols[ok]), g.dur_us[comp][ok])
    me = r_idx[slow]
    others = np.delete(total, me, axis=0)
    target = np.median(others, axis=0)
    factor = np.where(total[me] > 0, np.minimum(1.0, target / np.where(total[me] > 0, total[me], 1.0)), 1.0)
    dur = g.dur_us.copy()
    sel = np.flatnonzero(comp)[rows == me]
    dur[sel] *= factor[np.searchsorted(steps, g.step[sel])]
    return g.with_columns(dur_us=dur)


def _ranks(g: TaskGraph) -> list[int]:
    ranks = sorted({int(r) for r in np.unique(task_ranks(g)) if r >= 0})
    if len(ranks) < 2:
        raise UserError(f"{g.source}: {len(ranks)} rank(s) in the graph; the straggler what-if needs a multi-rank "
                        "job (trainsim replay on a folder or several traces)")  # fmt: skip
    return ranks
