"""Where the time goes: each term of an estimate with the inputs of its formula, and plan A against plan B.

    >>> from trainsim.plan.devices import homogeneous
    >>> from trainsim.plan.estimate import Strategy, estimate
    >>> from trainsim.plan.explain import term_rows
    >>> from trainsim.plan.workload import preset
    >>> e = estimate(preset("gpt3-1.3b"), Strategy(dp=8, zero=3), homogeneous("a100-80gb", 8), global_batch=16)
    >>> [r[0] for r in term_rows(e)][:2]
    ['compute', 'fsdp_comm']

``Estimate.terms`` holds one ``comm.Term`` per time term of the slowest pipeline stage over a whole
step (the pipeline bubble, DP tail and optimizer once). Seconds are *exposed* seconds, what the term
adds to the step; ``busy`` is how long the operation runs, hidden or not, so ``busy - seconds`` is what
overlap hid.
"""

from __future__ import annotations

from dataclasses import fields

from trainsim.plan.estimate import Estimate, Strategy

HEADER = ("term", "exposed s", "share", "busy s", "count", "bytes/each", "link", "GB/s or TF/s", "eff", "TFLOP", "formula inputs")


def _size(b: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B" if b else "-"


def term_rows(e: Estimate) -> list[tuple[str, ...]]:
    """One row per term (``HEADER``), the step's largest first; terms of zero busy time left out."""
    rows: list[tuple[str, ...]] = []
    for t in sorted(e.terms, key=lambda t: -t.seconds):
        if t.busy_s <= 0 and t.seconds <= 0:
            continue
        rows.append((
            t.name, f"{t.seconds:.4g}", f"{100 * t.seconds / e.step_s:.1f}%", f"{t.busy_s:.4g}", f"{t.times:g}",
            _size(t.size_bytes), t.link, f"{t.bw_gbps:g}" if t.bw_gbps else "-", f"{t.eff:.2f}",
            f"{t.flops / 1e12:.4g}" if t.flops else "-", t.note,
        ))  # fmt: skip
    return rows


def strategy_diff(a: Strategy, b: Strategy) -> list[str]:
    """``field: a -> b`` for every field in which two strategies differ."""
    out = []
    for f in fields(Strategy):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            out.append(f"{f.name}: {getattr(va, 'name', va)} -> {getattr(vb, 'name', vb)}".lower())
    return out


def compare(a: Estimate, b: Estimate) -> list[tuple[str, float, float]]:
    """(term, seconds in ``a``, seconds in ``b``) for every term either has, largest difference first."""
    sa = {t.name: t.seconds for t in a.terms}
    sb = {t.name: t.seconds for t in b.terms}
    names = sorted(set(sa) | set(sb), key=lambda n: -abs(sa.get(n, 0.0) - sb.get(n, 0.0)))
    return [(n, sa.get(n, 0.0), sb.get(n, 0.0)) for n in names if sa.get(n, 0.0) or sb.get(n, 0.0)]


def why_text(a: Estimate, b: Estimate) -> str:
    """One paragraph: what differs between the winner ``a`` and the runner-up ``b`` and which terms decide."""
    diff = compare(a, b)
    gain = b.step_s - a.step_s
    lead = [f"{n} {sa:.3g} s vs {sb:.3g} s" for n, sa, sb in diff[:3] if abs(sa - sb) > 1e-9]
    changes = "; ".join(strategy_diff(b.strategy, a.strategy)) or "same strategy, different stages"
    mem = f"memory {a.memory_gib_per_gpu:.1f} vs {b.memory_gib_per_gpu:.1f} GiB/GPU"
    return (
        f"#1 is {gain:.3g} s per step faster than #2 ({100 * gain / b.step_s:.1f}%). "
        f"From #2 to #1: {changes}. Largest term differences: {', '.join(lead) or 'none'}; {mem}."
    )
