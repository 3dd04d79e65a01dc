"""SeCoPa: per gradient, compress or not and into how many partitions (HiPress, SOSP'21 §3.4).

    >>> from trainsim.compress.secopa import Constants, Linear, plan_gradients
    >>> k = Constants(enc=Linear(1e-6, 0.05, 0.05), dec=Linear(5e-7, 0.05, 0.05),
    ...               gather=Linear(1e-5, 0.4, 0.2), bcast=Linear(1e-5, 0.2, 0.2),
    ...               send=Linear(3e-6, 0.2, 0.1), aggr=Linear(0.0, 0.0, 0.0))
    >>> plan = plan_gradients([("fc.weight", 4_000_000), ("fc.bias", 1000)], "tbq", 1 / 16, k,
    ...                       topology="ps", world_size=4)
    >>> plan.decision("fc.weight"), plan.decision("fc.bias")
    ((True, 4), (False, 1))

Cost model (HiPress ``src/SeCoPa/SeCoPa.py``; notation: m elements, N ranks, K partitions,
r = wire bytes / fp32 bytes of the algorithm; comm primitives take *bytes*, enc/dec/aggr take the
elements of one partition (our decode cost scales with the elements it writes)):

    orig_PS(K)   = gather(4m/K) + bcast(4m/K) + (N-1) aggr(m/K)
    comp_PS(K)   = gather(4rm/K) + bcast(4rm/K) + min(K+1, N) enc(m/K)
                   + min(N-1+K, 2(N-1)) dec(m/K) + (N-1) aggr(m/K)
    orig_Ring(K) = 2(N-1) send(4m/K) + (N-1) aggr(m/K)
    comp_Ring(K) = 2(N-1) send(4rm/K) + N enc(m/K) + N dec(m/K) + (N-1) aggr(m/K)

each primitive ``cost(x) = max(overhead, a x + b)`` (HiPress: ``overhead if x < thr else a x + b``,
the same for a > 0). Compress iff ``min_K orig > min_K comp`` (a tie means no); K is the argmin
of the winner. HiPress hard-codes fitted constants for N in {4, 8, 16}; here they come from
``calibrate_codec`` / ``calibrate_comm`` (or a link model), run on the user's machines.

The plan is a YAML file (``Plan.save``) the hooks read (``CompressionState(plan=...)``) and the
user may edit: one entry per gradient with ``compress`` and ``partitions``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import UserError

TOPOLOGIES = ("ps", "ring")


@dataclass(frozen=True, slots=True)
class Linear:
    """``cost(x) = max(overhead_ms, a_ms * x + b_ms)``; x in elements or bytes (see the primitive)."""

    a_ms: float
    b_ms: float
    overhead_ms: float

    def __call__(self, x: float) -> float:
        return max(self.overhead_ms, self.a_ms * x + self.b_ms)

    @staticmethod
    def fit(xs: Sequence[float], ms: Sequence[float]) -> Linear:
        """Least squares of ms on xs, relative (weights 1/ms^2: sizes span decades); overhead = min(ms)."""
        if len(xs) < 2:
            raise UserError("secopa: calibration needs at least 2 sizes")
        w = [1.0 / max(y, 1e-9) ** 2 for y in ms]
        sw = sum(w)
        mx = sum(wi * x for wi, x in zip(w, xs, strict=True)) / sw
        my = sum(wi * y for wi, y in zip(w, ms, strict=True)) / sw
        var = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs, strict=True))
        cov = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ms, strict=True))
        a = max(cov / var, 0.0) if var else 0.0
        return Linear(a, my - a * mx, min(ms))


@dataclass(frozen=True, slots=True)
class Constants:
    """Measured primitives: enc/dec/aggr per element of a partition, gather/bcast/send per byte."""

    enc: Linear
    dec: Linear
    gather: Linear
    bcast: Linear
    send: Linear
    aggr: Linear

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {k: asdict(getattr(self, k)) for k in ("enc", "dec", "gather", "bcast", "send", "aggr")}

    @staticmethod
    def from_dict(d: dict[str, Any], where: str = "constants") -> Constants:
        try:
            return Constants(**{k: Linear(**{f: float(v) for f, v in d[k].items()}) for k in
                                ("enc", "dec", "gather", "bcast", "send", "aggr")})  # fmt: skip
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise UserError(
                f"{where}: expected enc, dec, gather, bcast, send, aggr each with a_ms, b_ms, overhead_ms ({exc})"
            ) from None


def costs(m: int, k: int, n: int, r: float, c: Constants, topology: str) -> tuple[float, float]:
    """(uncompressed, compressed) cost in ms of one gradient of m elements in k partitions."""
    part, nbytes = m / k, 4.0 * m / k
    aggr = (n - 1) * c.aggr(part)
    if topology == "ps":
        orig = c.gather(nbytes) + c.bcast(nbytes) + aggr
        comp = (c.gather(r * nbytes) + c.bcast(r * nbytes) + min(k + 1, n) * c.enc(part)
                + min(n - 1 + k, 2 * (n - 1)) * c.dec(part) + aggr)  # fmt: skip
    elif topology == "ring":
        orig = 2 * (n - 1) * c.send(nbytes) + aggr
        comp = 2 * (n - 1) * c.send(r * nbytes) + n * c.enc(part) + n * c.dec(part) + aggr
    else:
        raise UserError(f"secopa: unknown topology {topology!r}; expected one of {', '.join(TOPOLOGIES)}")
    return orig, comp


@dataclass(frozen=True, slots=True)
class GradientPlan:
    name: str
    numel: int
    compress: bool
    partitions: int
    orig_ms: float = float("nan")
    comp_ms: float = float("nan")


@dataclass(slots=True)
class Plan:
    """A SeCoPa plan: the algorithm, the topology, and one decision per gradient."""

    algorithm: str
    topology: str
    world_size: int
    gradients: dict[str, GradientPlan]
    options: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def decision(self, name: str) -> tuple[bool, int] | None:
        g = self.gradients.get(name)
        return None if g is None else (g.compress, g.partitions)

    def check_names(self, model_names: Iterable[str]) -> None:
        """UserError if the plan names gradients the model does not have."""
        known = set(model_names)
        missing = [n for n in self.gradients if n not in known]
        if missing:
            raise UserError(
                f"{self.source}: plan names gradients the model does not have: {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''}; the model has e.g. {', '.join(sorted(known)[:5])}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "options": self.options,
            "topology": self.topology,
            "world_size": self.world_size,
            "constants": self.constants,
            "gradients": [
                {
                    "name": g.name,
                    "numel": g.numel,
                    "compress": g.compress,
                    "partitions": g.partitions,
                    "orig_ms": round(g.orig_ms, 4),
                    "comp_ms": round(g.comp_ms, 4),
                }  # fmt: skip
                for g in self.gradients.values()
            ],
        }

    def save(self, path: str | Path) -> None:
        import yaml

        header = (
            "# trainsim SeCoPa plan. Edit 'compress' (true/false) and 'partitions' (1..world_size) freely;\n"
            "# names must match model.named_parameters(). orig_ms/comp_ms are the model's predictions.\n"
        )
        Path(path).write_text(header + yaml.safe_dump(self.to_dict(), sort_keys=False, width=120))

    @staticmethod
    def load(path: str | Path) -> Plan:
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as exc:
            raise UserError(f"{p}: cannot read the plan ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise UserError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
        return Plan.from_dict(data, str(p))

    @staticmethod
    def from_dict(data: Any, source: str = "<plan>") -> Plan:
        if not isinstance(data, dict):
            raise UserError(f"{source}: expected a mapping with algorithm, topology, world_size, gradients")
        for key in ("algorithm", "topology", "world_size", "gradients"):
            if key not in data:
                raise UserError(f"{source}: missing field {key!r}")
        topology = str(data["topology"])
        if topology not in TOPOLOGIES:
            raise UserError(f"{source}: topology={topology!r}; expected one of {', '.join(TOPOLOGIES)}")
        world = data["world_size"]
        if not isinstance(world, int) or world < 1:
            raise UserError(f"{source}: world_size={world!r}; expected an integer >= 1")
        if not isinstance(data["gradients"], list):
            raise UserError(f"{source}: gradients must be a list of {{name, numel, compress, partitions}}")
        options, constants = data.get("options") or {}, data.get("constants") or {}
        for key, value in (("options", options), ("constants", constants)):
            if not isinstance(value, dict):
                raise UserError(f"{source}: {key}={value!r}; expected a mapping")
        from trainsim.compress import make_codec

        try:  # the hooks build this codec from the plan: an unknown name or a bad option fails here
            make_codec(str(data["algorithm"]), **options)
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None
        grads: dict[str, GradientPlan] = {}
        for i, g in enumerate(data["gradients"]):
            where = f"{source}: gradients[{i}]"
            if not isinstance(g, dict) or "name" not in g or "compress" not in g:
                raise UserError(f"{where}: expected a mapping with at least name and compress")
            name = str(g["name"])
            if name in grads:
                raise UserError(f"{where}: {name!r} is planned twice; expected one entry per gradient")
            if not isinstance(g["compress"], bool):
                raise UserError(f"{where} ({name}): compress={g['compress']!r}; expected true or false")
            parts = g.get("partitions", 1)
            if not isinstance(parts, int) or not 1 <= parts <= max(1, world):
                raise UserError(f"{where} ({name}): partitions={parts!r}; expected 1..{world}")
            numel = g.get("numel", 0)
            if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
                raise UserError(f"{where} ({name}): numel={numel!r}; expected an integer >= 0")
            try:  # the model's predictions, for the reader: any number, or absent
                orig_ms, comp_ms = float(g.get("orig_ms", "nan")), float(g.get("comp_ms", "nan"))
            except (TypeError, ValueError):
                raise UserError(f"{where} ({name}): orig_ms / comp_ms must be numbers") from None
            grads[name] = GradientPlan(name, numel, g["compress"], parts, orig_ms, comp_ms)
        return Plan(str(data["algorithm"]), topology, world, grads, dict(options), dict(constants), source)


def decide(m: int, r: float, c: Constants, topology: str, world_size: int) -> GradientPlan:
    n = world_size
    best_orig = min((costs(m, k, n, r, c, topology)[0], k) for k in range(1, n + 1))
    best_comp = min((costs(m, k, n, r, c, topology)[1], k) for k in range(1, n + 1))
    compress = best_orig[0] > best_comp[0]
    k = best_comp[1] if compress else 1  # uncompressed gradients go to one plain all-reduce
    return GradientPlan("", m, compress, k, best_orig[0], best_comp[0])


def plan_gradients(
    gradients: Iterable[tuple[str, int]],
    algorithm: str,
    ratio: float,
    constants: Constants,
    *,
    topology: str,
    world_size: int,
    options: dict[str, Any] | None = None,
) -> Plan:
    """Decide every gradient; ``ratio`` = wire bytes / fp32 bytes of the algorithm."""
    if topology not in TOPOLOGIES:
        raise UserError(f"secopa: unknown topology {topology!r}; expected one of {', '.join(TOPOLOGIES)}")
    if world_size < 2:
        raise UserError(f"secopa: world_size={world_size}; plans need at least 2 ranks")
    out: dict[str, GradientPlan] = {}
    for name, numel in gradients:
        d = decide(numel, ratio, constants, topology, world_size)
        out[name] = GradientPlan(name, numel, d.compress, d.partitions, d.orig_ms, d.comp_ms)
    return Plan(algorithm, topology, world_size, out, dict(options or {}), constants.to_dict())


# ---- calibration -------------------------------------------------------------------------------

CAL_SIZES = [1 << 10, 1 << 13, 1 << 16, 1 << 18, 1 << 20, 1 << 22]


def calibrate_codec(
    algorithm: str, sizes: Sequence[int] = CAL_SIZES, repeats: int = 5, **options: Any
) -> dict[str, Any]:
    """Measure encode, decode (and add, for aggregation) of ``algorithm`` at ``sizes``; fit them. Also
    a decode that adds into its output (``decompress_into(..., accumulate=True)``, ``acc``): how the
    synchronisation schemes sum the parts of other ranks, dearer than a plain decode plus nothing
    (1.2-1.6x a decode for onebit at 256 Ki-4 Mi elements on this project's 2-vCPU VM)."""
    import torch

    from trainsim.compress import make
    from trainsim.compress.bench import median_ms

    comp = make(algorithm, **options)
    enc: list[float] = []
    dec: list[float] = []
    add: list[float] = []
    acc: list[float] = []
    for n in sizes:
        x = torch.randn(n)
        wire = comp.new_wire(n)
        out = torch.empty(n)
        enc.append(median_ms(functools.partial(comp.compress_into, x, wire, n), repeats))
        dec.append(median_ms(functools.partial(comp.decompress_into, wire, out, n), repeats))
        add.append(median_ms(functools.partial(out.add_, x), repeats))
        acc.append(median_ms(functools.partial(comp.decompress_into, wire, out, n, accumulate=True), repeats))
    n_max = max(sizes)
    return {
        "enc": Linear.fit(sizes, enc),
        "dec": Linear.fit(sizes, dec),
        "aggr": Linear.fit(sizes, add),
        "acc": Linear.fit(sizes, acc),
        "ratio": comp.wire_bytes(n_max) / (4 * n_max),
        "samples": {"sizes": list(sizes), "enc_ms": enc, "dec_ms": dec, "add_ms": add, "acc_ms": acc},
    }


def link_model(bandwidth_mbps: float, latency_ms: float, world_size: int) -> dict[str, Linear]:
    """Comm primitives of a switch with ``bandwidth_mbps`` per port: gather/bcast move (N-1) copies."""
    if bandwidth_mbps <= 0 or latency_ms < 0:
        raise UserError(
            f"secopa: bandwidth {bandwidth_mbps} Mbit/s and latency {latency_ms} ms must be > 0 and >= 0"
        )
    per_byte = 8.0 / (bandwidth_mbps * 1e3)  # ms per byte
    many = Linear((world_size - 1) * per_byte, latency_ms, latency_ms)
    return {"gather": many, "bcast": many, "send": Linear(per_byte, latency_ms, latency_ms)}


def calibrate_comm(
    group: Any = None, sizes: Sequence[int] = (1 << 10, 1 << 14, 1 << 18, 1 << 21), repeats: int = 5
) -> dict[str, Linear]:
    """Measure gather, broadcast and one ring hop (send/recv) in an initialised process group.

    Run it on the real cluster (every rank calls it; e.g. under torchrun); sizes are in bytes.
    """
    import torch
    import torch.distributed as dist

    from trainsim.compress.bench import median_ms

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    res: dict[str, list[float]] = {"gather": [], "bcast": [], "send": []}
    for nbytes in sizes:
        t = torch.zeros(nbytes, dtype=torch.uint8)
        recv = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
        inc = torch.empty_like(t)

        def gather(t: Any = t, recv: Any = recv) -> None:
            dist.gather(t, recv, dst=0, group=group)

        def bcast(t: Any = t) -> None:
            dist.broadcast(t, src=0, group=group)

        def hop(t: Any = t, inc: Any = inc) -> None:
            s = dist.isend(t, (rank + 1) % world, group=group)
            r = dist.irecv(inc, (rank - 1) % world, group=group)
            assert s is not None and r is not None
            s.wait()
            r.wait()

        for name, fn in (("gather", gather), ("bcast", bcast), ("send", hop)):
            dist.barrier(group=group)
            ms = median_ms(fn, repeats)
            agreed = torch.tensor([ms])
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank decides
            res[name].append(float(agreed[0]))
    return {k: Linear.fit(list(sizes), v) for k, v in res.items()}
