"""A small, self-contained catalog of GPUs and nodes for the planner.

    >>> from trainsim.plan.devices import gpu
    >>> a100 = gpu("a100-80gb")
    >>> a100.peak_tflops, a100.mem_gib
    (312.0, 80.0)

Every figure cites its source next to it. Peak compute is dense 16-bit tensor-core throughput (no 2:4
sparsity); ``hbm_gbps`` is the datasheet memory bandwidth in GB/s (10^9 bytes); ``nvlink_gbps`` is the
per-GPU, per-direction NVLink (or PCIe where a card has no NVLink switch) bandwidth in GB/s;
``nic_gbps`` is the per-GPU, per-direction inter-node bandwidth of the usual node built around the
card (one NIC per GPU). ``trainsim.cluster`` keeps a richer catalog; this one is what the planner
needs and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.errors import UserError


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    """One GPU kind and the node it usually sits in."""

    name: str
    peak_tflops: float
    """dense FP16/BF16 tensor-core TFLOP/s"""
    hbm_gbps: float
    """memory bandwidth, GB/s"""
    mem_gib: float
    """device memory, GiB"""
    nvlink_gbps: float
    """intra-node bandwidth per GPU per direction, GB/s"""
    nic_gbps: float
    """inter-node bandwidth per GPU per direction, GB/s"""
    gpus_per_node: int = 8
    fp8_tflops: float = 0.0
    """dense FP8 tensor-core TFLOP/s; 0 = no FP8 tensor cores"""

    def __post_init__(self) -> None:
        for f in ("peak_tflops", "hbm_gbps", "mem_gib", "nvlink_gbps", "nic_gbps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"Gpu {self.name}: {f} must be > 0")


# Sources:
# [V100] NVIDIA Tesla V100 datasheet (2017/2020): 125 TFLOPS tensor, 900 GB/s HBM2, 16/32 GB,
#        NVLink 300 GB/s total (= 150 per direction); AWS p3.16xlarge: 25 Gbps network for 8 GPUs
#        (Alpa §8 testbed, research/planner_groundtruth.md §5) -> 3.125 GB/s per node, 0.39 per GPU.
# [A100] A100 datasheet via glennklockwood.com/garden/processors/A100 and Megatron-LM SC'21 ("312
#        teraFLOP/s"): 40GB 1,555 GB/s, 80GB 2,039 GB/s; NVLink3 600 GB/s total (300 per direction);
#        DGX A100 / Selene: 8x 200 Gb/s HDR IB -> 25 GB/s per GPU (planner_groundtruth.md §5).
# [H100] glennklockwood.com/garden/processors/h100 (989.4 TF dense BF16), HPCTech H100 table:
#        3,350 GB/s HBM3, NVLink4 900 GB/s total (450 per direction); DGX H100: 8x 400 Gb/s
#        ConnectX-7 -> 50 GB/s per GPU (docs.nvidia.com DGX BasePOD "Core Components").
# [FP8]  dense FP8 on Hopper (H100/H800/H200 SXM): 1,979 TFLOP/s (3,958 with sparsity), same sources as [H100].
# [H200] NVIDIA H200 Tensor Core GPU product page / datasheet (nvidia.com/en-us/data-center/h200):
#        141 GB HBM3e, 4.8 TB/s, same Hopper compute as H100 SXM (989 TF dense BF16), NVLink 900 GB/s.
# [H800] DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024) §3.1-3.2: H800 nodes of 8 GPUs, NVLink/NVSwitch
#        inside (400 GB/s total on the datasheet, 200 per direction; the report measures ~160 GB/s), 400 Gb/s
#        InfiniBand per GPU (50 GB/s); Hopper compute as H100 SXM.
# [H100-96GB] pytorch/torchtitan@eaea6f6:docs/performance.md (Meta Grand Teton hosts): H100 with 96 GB HBM2e at
#        2.4 TB/s, 500 W power limit, NVLink within the host, 400 Gb/s RDMA per GPU (50 GB/s); its peak is "between
#        SXM and NVL" (989 and 835 TF dense BF16, NVIDIA H100 datasheet), not stated: the midpoint, 912, is assumed.
# [2080Ti] NVIDIA Turing architecture whitepaper (2018), Appendix A Table 1, GeForce RTX 2080 Ti:
#        FP16 tensor TFLOPS with FP32 accumulate 53.8 (107.6 with FP16 accumulate), 616 GB/s GDDR6,
#        11 GB; no NVSwitch: PCIe 3.0 x16 = 15.75 GB/s per direction (PCI-SIG), 8 per node assumed;
#        10 GbE between nodes = 1.25 GB/s per node -> 0.156 GB/s per GPU.
_CATALOG: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu(name="v100-16gb", peak_tflops=125.0, hbm_gbps=900.0, mem_gib=16.0, nvlink_gbps=150.0, nic_gbps=0.39),
        Gpu(name="v100-32gb", peak_tflops=125.0, hbm_gbps=900.0, mem_gib=32.0, nvlink_gbps=150.0, nic_gbps=0.39),
        Gpu(name="a100-40gb", peak_tflops=312.0, hbm_gbps=1555.0, mem_gib=40.0, nvlink_gbps=300.0, nic_gbps=25.0),
        Gpu(name="a100-80gb", peak_tflops=312.0, hbm_gbps=2039.0, mem_gib=80.0, nvlink_gbps=300.0, nic_gbps=25.0),
        Gpu(name="h100", peak_tflops=989.0, hbm_gbps=3350.0, mem_gib=80.0, nvlink_gbps=450.0, nic_gbps=50.0, fp8_tflops=1979.0),
        Gpu(name="h100-96gb", peak_tflops=912.0, hbm_gbps=2400.0, mem_gib=96.0, nvlink_gbps=450.0, nic_gbps=50.0,
            fp8_tflops=1824.0),
        Gpu(name="h800", peak_tflops=989.0, hbm_gbps=3350.0, mem_gib=80.0, nvlink_gbps=200.0, nic_gbps=50.0, fp8_tflops=1979.0),
        Gpu(name="h200", peak_tflops=989.0, hbm_gbps=4800.0, mem_gib=141.0, nvlink_gbps=450.0, nic_gbps=50.0, fp8_tflops=1979.0),
        Gpu(name="rtx2080ti", peak_tflops=53.8, hbm_gbps=616.0, mem_gib=11.0, nvlink_gbps=15.75, nic_gbps=0.156),
    )
}
_ALIASES = {"v100": "v100-32gb", "a100": "a100-80gb", "h100-80gb": "h100", "h100-sxm": "h100", "h200-141gb": "h200",
            "2080ti": "rtx2080ti"}  # fmt: skip


def gpu(name: str) -> Gpu:
    """The catalog entry for ``name`` (case-insensitive, a few aliases); ``UserError`` lists the names."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _CATALOG:
        raise UserError(f"unknown GPU '{name}'; expected one of {', '.join(names())}")
    return _CATALOG[key]


def names() -> list[str]:
    return sorted(_CATALOG) + sorted(_ALIASES)


LEAF_NODES = 32
"""nodes whose same-rail GPUs share one leaf switch in a rail-optimised fabric: a DGX SuperPOD scalable unit
is 32 DGX H100 nodes with one leaf switch per rail (NVIDIA DGX SuperPOD reference architecture)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeGroup:
    """``count`` GPUs of one kind, ``gpus_per_node`` to a node, and the fabric between the nodes."""

    gpu: Gpu
    count: int
    gpus_per_node: int
    rail_optimized: bool = True
    """GPU i of every node on leaf switch i (rail i); NCCL keeps rings on a rail and sends cross-rail
    traffic over NVLink to the right rail first (PXN), so up to ``leaf_nodes`` nodes never reach the spine.
    False: one top-of-rack switch per node, so all inter-node traffic crosses the spine"""
    oversubscription: float = 1.0
    """leaf down-link / up-link bandwidth (1 = non-blocking); traffic crossing the spine gets 1/this of the NIC"""
    leaf_nodes: int = LEAF_NODES

    def __post_init__(self) -> None:
        if self.count < 1 or self.gpus_per_node < 1:
            raise UserError(f"GPU group {self.gpu.name}: count and gpus_per_node must be >= 1")
        if not self.oversubscription >= 1.0:
            raise UserError(f"--oversubscription {self.oversubscription}; expected >= 1 (1 = non-blocking)")
        if self.leaf_nodes < 1:
            raise UserError(f"--leaf-nodes {self.leaf_nodes}; expected >= 1")
        if self.count % self.gpus_per_node and self.count > self.gpus_per_node:
            raise UserError(
                f"GPU group {self.gpu.name}: {self.count} GPUs is not a whole number of "
                f"{self.gpus_per_node}-GPU nodes"
            )


    def inter_node_gbps(self, nodes: int) -> float:
        """Per-GPU inter-node bandwidth (GB/s) of traffic among ``nodes`` nodes: the NIC, or 1/oversubscription
        of it once the traffic crosses the spine (beyond one leaf, or always without rails)."""
        spine = not self.rail_optimized or nodes > self.leaf_nodes
        return self.gpu.nic_gbps / (self.oversubscription if spine else 1.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """Node groups; groups are connected to each other by the slower of their NICs."""

    groups: tuple[NodeGroup, ...]

    @property
    def n_gpus(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def homogeneous(self) -> bool:
        return len({g.gpu.name for g in self.groups}) == 1

    def describe(self) -> str:
        return " + ".join(f"{g.count}x{g.gpu.name}" for g in self.groups)


def homogeneous(name: str, n_gpus: int, gpus_per_node: int = 8, *, nic_gbps: float | None = None,
                nvlink_gbps: float | None = None, rail_optimized: bool = True, oversubscription: float = 1.0,
                leaf_nodes: int = LEAF_NODES) -> Cluster:
    """``n_gpus`` of one kind; ``nic_gbps`` / ``nvlink_gbps`` override the catalog's per-GPU network and NVLink
    bandwidth (GB/s per direction), e.g. 400 Gbit/s per GPU = 50; the fabric as in ``NodeGroup``."""
    from dataclasses import replace

    kind = gpu(name)
    for flag, v in (("--nic-gbps", nic_gbps), ("--nvlink-gbps", nvlink_gbps)):
        if v is not None and not v > 0:
            raise UserError(f"{flag} {v}; expected a bandwidth > 0 in GB/s")
    kind = replace(kind, nic_gbps=nic_gbps or kind.nic_gbps, nvlink_gbps=nvlink_gbps or kind.nvlink_gbps)
    group = NodeGroup(gpu=kind, count=n_gpus, gpus_per_node=min(gpus_per_node, n_gpus), rail_optimized=rail_optimized,
                      oversubscription=oversubscription, leaf_nodes=leaf_nodes)  # fmt: skip
    return Cluster(groups=(group,))


def parse_groups(specs: list[str], gpus_per_node: int = 8) -> Cluster:
    """Parse repeated ``NAME:COUNT`` (``--gpu-group a100-80gb:16``)."""
    groups = []
    for s in specs:
        name, sep, count = s.partition(":")
        if not sep or not count.isdigit():
            raise UserError(f"--gpu-group '{s}': expected NAME:COUNT, e.g. a100-80gb:16")
        n = int(count)
        groups.append(NodeGroup(gpu=gpu(name), count=n, gpus_per_node=min(gpus_per_node, n)))
    if not groups:
        raise UserError("no GPU groups given; expected --gpu-group NAME:COUNT at least once")
    return Cluster(groups=tuple(groups))


def load_cluster(path: str) -> Cluster:
    """Read a cluster file (YAML or TOML)::

        groups:
          - {gpu: a100-80gb, count: 16, gpus_per_node: 8}
          - {gpu: v100-32gb, count: 16}
    """
    import pathlib

    p = pathlib.Path(path)
    if not p.exists():
        raise UserError(f"{path}: cluster file not found")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # pragma: no cover - python 3.10
                import tomli as tomllib  # type: ignore[no-redef]
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        raise UserError(f"{path}: cannot parse ({exc.__class__.__name__}); expected YAML or TOML") from None
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list) or not data["groups"]:
        raise UserError(f"{path}: expected a top-level 'groups' list of {{gpu, count[, gpus_per_node]}}")
    groups = []
    for i, g in enumerate(data["groups"]):
        if not isinstance(g, dict) or "gpu" not in g or "count" not in g:
            raise UserError(f"{path}: groups[{i}]: expected keys 'gpu' and 'count'")
        unknown = sorted(set(g) - {"gpu", "count", "gpus_per_node"})
        if unknown:  # a misspelt gpus_per_node would otherwise fall back to 8 unseen
            raise UserError(f"{path}: groups[{i}]: unknown key(s) {unknown}; expected gpu, count, gpus_per_node")
        n = g["count"]
        if not isinstance(n, int) or n < 1:
            raise UserError(f"{path}: groups[{i}].count={n!r}; expected a positive integer")
        gpn = g.get("gpus_per_node", 8)
        if not isinstance(gpn, int) or gpn < 1:
            raise UserError(f"{path}: groups[{i}].gpus_per_node={gpn!r}; expected a positive integer")
        try:
            kind = gpu(str(g["gpu"]))
        except UserError as exc:
            raise UserError(f"{path}: groups[{i}].gpu: {exc}") from None
        groups.append(NodeGroup(gpu=kind, count=n, gpus_per_node=min(gpn, n)))
    return Cluster(groups=tuple(groups))
