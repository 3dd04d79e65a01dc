"""Measure real gloo all-reduce times with torch.distributed and fit the alpha-beta constants.

    >>> from trainsim.cluster.calibrate import calibrate
    >>> cal = calibrate(world=2, rate_mbit=100, delay_ms=2, max_bytes=4 << 20)   # doctest: +SKIP
    >>> cal.link.bw_gbps, cal.link.latency_us                                     # doctest: +SKIP

Algorithm:
1. start ``world`` gloo processes (``trainsim.validate.launch``), each in its own network namespace
   joined by links shaped to ``rate_mbit``/``delay_ms`` (``trainsim.validate.netns``), or on loopback
   when no shaping is asked for or namespaces cannot be made;
2. for sizes from 1 KiB up to ``max_bytes`` (x4 apart) time ``reps`` all-reduces each (after a
   barrier, median over repetitions, warm-up discarded);
3. fit ``t(S) = a + max(floor, b * S)`` minimising the *relative* squared error (``floor = 0``: the
   plain alpha-beta line; see ``fit_model``), and turn it into the ring model's constants:
   ``a + floor = 2(p-1) alpha`` and ``b = 2(p-1)/p / bandwidth`` (``collectives.ring_allreduce_us``).

The returned ``Calibration`` holds the measured points, the fit and a catalog-style ``Link`` whose
predictions are what the what-ifs and ``validate dp`` use.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.errors import UserError


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Measured all-reduce times and the fitted ring model."""

    world: int
    """ranks"""
    rate_mbit: float | None
    """shaped link rate (None: unshaped loopback / namespace link)"""
    delay_ms: float
    """added one-way latency"""
    sizes_bytes: list[int]
    measured_us: list[float]
    """median all-reduce time per size"""
    a_us: float
    """fitted fixed cost per all-reduce"""
    b_us_per_byte: float
    """fitted cost per byte of the tensor"""
    floor_us: float = 0.0
    """fitted latency floor that large transfers hide: t = a + max(floor, b * size)"""
    link: Link
    """the equivalent ring-model link (alpha, bandwidth)"""
    where: str = "netns"
    """'netns' or 'loopback'"""
    notes: list[str] = field(default_factory=list)

    def predict_us(self, size_bytes: float) -> float:
        return self.a_us + max(self.floor_us, self.b_us_per_byte * size_bytes)

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["link"] = asdict(self.link)
        d["predicted_us"] = [self.predict_us(s) for s in self.sizes_bytes]
        return d

    @staticmethod
    def from_json(d: dict[str, object]) -> Calibration:
        link_d = dict(d["link"])  # type: ignore[call-overload]
        kw = {k: v for k, v in d.items() if k not in ("link", "predicted_us")}
        return Calibration(link=Link(**link_d), **kw)  # type: ignore[arg-type]


def fit_alpha_beta(sizes: np.ndarray, times_us: np.ndarray, world: int) -> tuple[float, float, Link]:
    """Least squares on relative error of ``t = a + b S``; also the equivalent ring ``Link``."""
    a, b, floor = fit_model(sizes, times_us, with_floor=False)
    return a, b, _ring_link(a + floor, b, world)


def fit_model(sizes: np.ndarray, times_us: np.ndarray, *, with_floor: bool = True) -> tuple[float, float, float]:
    """Fit ``t = a + max(floor, b S)`` (relative least squares); returns ``(a, b, floor)``.

    ``floor = 0`` is the plain alpha-beta line. A floor models protocols whose small messages pay
    handshakes that large, pipelined transfers hide (gloo's ring on a high-latency link pays about two
    round trips per step for a 1 KiB message but overlaps them with data for 1 MiB). The floor and ``b``
    are searched on a grid around the linear fit, ``a`` is solved in closed form for each pair.
    """
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times_us, dtype=float)
    if len(s) < 2 or (t <= 0).any() or len(s) != len(t):
        raise UserError("calibration needs at least two sizes with positive times")
    w = 1.0 / t
    A = np.stack([w, s * w], axis=1)
    (a0, b0), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    b0 = max(float(b0), 1e-12)
    best = (float(np.sum(((max(float(a0), 0.0) + b0 * s) / t - 1) ** 2)), max(float(a0), 0.0), b0, 0.0)
    if not with_floor:
        return best[1], best[2], best[3]
    for floor in np.geomspace(float(t.min()) * 0.1, float(t.max()), 121):
        for b in b0 * np.geomspace(0.5, 2.0, 81):
            m = np.maximum(floor, b * s)
            a = max(0.0, float(np.sum(w * w * (t - m)) / np.sum(w * w)))
            err = float(np.sum(((a + m) / t - 1) ** 2))
            if err < best[0]:
                best = (err, a, float(b), float(floor))
    return best[1], best[2], best[3]


def _ring_link(small_us: float, b: float, world: int) -> Link:
    steps = 2 * (world - 1)
    alpha = small_us / steps if steps else 0.0
    bytes_per_us = steps / world / b if steps else 1e12
    return Link(name="calibrated", bw_gbps=bytes_per_us / 1e3, latency_us=alpha, source="trainsim calibrate")


def default_sizes(max_bytes: int, min_bytes: int = 1024) -> list[int]:
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= 4
    return sizes


def calibrate(
    *,
    world: int = 2,
    rate_mbit: float | None = None,
    delay_ms: float = 0.0,
    max_bytes: int = 16 << 20,
    min_bytes: int = 1024,
    reps: int = 5,
    sizes: list[int] | None = None,
    timeout_s: float = 600.0,
    net: object | None = None,
) -> Calibration:
    """Measure and fit (see the module docstring). ``net``: an open ``Netns`` to reuse."""
    from trainsim.validate.launch import launch
    from trainsim.validate.netns import Netns, NetnsUnavailable, netns_unavailable

    if world < 2:
        raise UserError(f"calibrate: world={world}; expected at least 2 processes")
    if reps < 1:
        raise UserError(f"calibrate: reps={reps}; expected >= 1")
    sizes = sizes or default_sizes(max_bytes, min_bytes)
    args = ["-m", "trainsim.cluster.calibrate", "--worker", ",".join(map(str, sizes)), str(reps)]
    notes: list[str] = []
    if isinstance(net, Netns):
        outs = launch(world, args, net=net, timeout_s=timeout_s)
        where = "netns"
    else:
        reason = netns_unavailable()
        if reason is None:
            try:
                with Netns(world, rate_mbit=rate_mbit, delay_ms=delay_ms) as n:
                    outs = launch(world, args, net=n, timeout_s=timeout_s)
                where = "netns"
            except NetnsUnavailable as exc:
                reason = str(exc)
        if reason is not None:
            if rate_mbit is not None or delay_ms > 0:
                notes.append(f"no network namespaces ({reason}): measured on unshaped loopback instead")
            outs = launch(world, args, net=None, timeout_s=timeout_s)
            where = "loopback"
    data = json.loads(outs[0].strip().splitlines()[-1])
    med = [float(statistics.median(x)) for x in data["us"]]
    a, b, floor = fit_model(np.array(sizes), np.array(med))
    return Calibration(
        world=world, rate_mbit=rate_mbit, delay_ms=delay_ms, sizes_bytes=list(sizes), measured_us=med,
        a_us=a, b_us_per_byte=b, floor_us=floor, link=_ring_link(a + floor, b, world), where=where, notes=notes,
    )  # fmt: skip


# --------------------------------------------------------------------------- worker (one per rank)
def _worker(sizes: list[int], reps: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out: list[list[float]] = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        dist.all_reduce(x)  # warm-up: connections, buffers
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append((time.perf_counter() - t0) * 1e6)
        # rank 0's clock decides; the slowest rank finishes the op for everyone
        tt = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        out.append(tt.tolist())
    if rank == 0:
        print(json.dumps({"sizes": sizes, "us": out}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker([int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]))
    else:
        print("usage: python -m trainsim.cluster.calibrate --worker SIZES REPS (started by `trainsim calibrate`)")
        sys.exit(2)
